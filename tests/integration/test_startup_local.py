"""The startup experiment end to end on this machine with the stand-in: real page cache, real
compile-cache folder, real process groups, through real ansible-runner."""

from __future__ import annotations

import csv
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def campaign(tmp_path: Path, modes: str, repeats: int = 1, env: str = "", once: str = "") -> str:
    # max-model-len is 8192 in every run, so a KV pool of 16 tokens cannot start (the failure drill).
    return f"""\
name: startup-test
inventory: inventory
remote_dir: {tmp_path / 'remote'}
engine:
  kind: stand-in
  model: {tmp_path / 'model'}
  standin_model_mib: 384
  served_model_name: standin
  port: {free_port()}
  cache_root: {tmp_path / 'cache'}
  args: {{max-model-len: 8192}}
  env: {{STANDIN_COMPILE_MISS_S: "1.0", STANDIN_JIT_MISS_S: "0.5", STANDIN_GRAPH_CAPTURE_S: "0.3"{env}}}
experiments:
  - kind: startup
    modes: [{modes}]
    repeats: {repeats}
    timeout_s: 180
""" + (f"""\
  - kind: startup
    name: once
    modes: [{once}]
    timeout_s: 180
""" if once else "")


def rows(results: Path) -> dict[str, dict[str, str]]:
    with (results / "startup.csv").open() as fh:
        return {f"{r['mode']}.r{r['repeat']}": r for r in csv.DictReader(fh)}


def test_modes_show_page_cache_compile_cache_and_sleep_effects(write_campaign: Callable[[str], Path],
                                                               tmp_path: Path) -> None:
    path = write_campaign(campaign(tmp_path, "disk_cold, page_cache_warm", repeats=2,
                                   once="first_start, fresh_container, sleep_wake, runai_streamer"))
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    r = rows(results)
    assert {v["status"] for k, v in r.items() if not k.startswith("runai")} == {"ok"}
    assert r["runai_streamer.r1"]["status"] == "skipped"
    assert r["runai_streamer.r1"]["reason"].startswith("the stand-in does not model --load-format runai_streamer")

    # The page cache is real: a dropped cache reads the weights from disk, a warm one from RAM.
    assert float(r["disk_cold.r2"]["resident_fraction_before"]) < 0.05
    assert float(r["page_cache_warm.r2"]["resident_fraction_before"]) > 0.95
    assert float(r["disk_cold.r2"]["weights_s"]) > 1.5 * float(r["page_cache_warm.r2"]["weights_s"])
    # The compile cache is real, and the hit is read from the log, never assumed from the mode.
    # disk_cold ran first on an empty persistent cache: r1 fills it, r2 hits; fresh caches always miss.
    assert r["disk_cold.r1"]["compile_cache_hit"] == "False" and r["disk_cold.r2"]["compile_cache_hit"] == "True"
    assert r["page_cache_warm.r1"]["compile_cache_hit"] == "True"
    assert r["first_start.r1"]["compile_cache_hit"] == "False"
    assert r["fresh_container.r1"]["compile_cache_hit"] == "False"
    assert float(r["fresh_container.r1"]["compile_s"]) > 2 * float(r["disk_cold.r2"]["compile_s"])
    # A sleeping engine wakes to its first token faster than any start.
    assert float(r["sleep_wake.r1"]["wake_to_first_token_s"]) < 0.5 * float(r["disk_cold.r2"]["first_token_s"])
    report = (results / "report.md").read_text()
    assert "![startup phases](startup.png)" in report and (results / "startup.png").stat().st_size > 10_000


def test_engine_that_fails_to_start_is_a_failed_row_with_its_error_and_a_clean_node(
        write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    text = campaign(tmp_path, "disk_cold", env=', STANDIN_KV_CAPACITY_TOKENS: "16"')
    path = write_campaign(text)
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    row = rows(results)["disk_cold.r1"]
    assert row["status"] == "failed"
    assert row["reason"].startswith("failed in phase measure: localhost: task 'Start, time and stop the engine': ")
    assert "engine exited with rc" in row["reason"]
    assert "engine errors: engine_core_failed, kv_cache_insufficient" in row["reason"]
    assert "log tail: " in row["reason"]
    port = int(text.split("port: ")[1].split()[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    assert (results / "trials/startup.disk_cold.r1@localhost/raw/localhost/server.log").is_file()
