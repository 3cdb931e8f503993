"""The startup experiment end to end on this machine with the stand-in: real page cache, real
compile-cache folder, real process groups, through real ansible-runner; every start's timeline."""

from __future__ import annotations

import csv
import itertools
import json
import socket
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from runner.cli import main

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def campaign(tmp_path: Path, experiments: list[tuple[str, str, int]], env: str = "") -> str:
    """A stand-in startup campaign; ``experiments``: (name, modes, repeats), run in that order."""
    # max-model-len is 8192 in every run, so a KV pool of 16 tokens cannot start (the failure drill).
    text = f"""\
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
"""
    for name, modes, repeats in experiments:
        text += f"""\
  - kind: startup
    name: {name}
    modes: [{modes}]
    repeats: {repeats}
    timeout_s: 180
"""
    return text


def rows(results: Path, table: str = "startup.csv") -> dict[str, dict[str, str]]:
    with (results / table).open() as fh:
        return {f"{r['mode']}.r{r['repeat']}": r for r in csv.DictReader(fh)}


def task_started(trial_dir: Path, prefix: str) -> float:
    """When the trial's first task named ``prefix...`` started (its ansible-runner job events)."""
    events = [json.loads(p.read_text()) for p in trial_dir.glob("ansible/artifacts/*/job_events/*.json")]
    starts = [datetime.fromisoformat(e["created"]).timestamp() for e in events
              if e.get("event") == "playbook_on_task_start" and e["event_data"].get("task", "").startswith(prefix)]
    assert starts, (trial_dir, prefix)
    return min(starts)


def test_modes_show_page_cache_compile_cache_and_sleep_effects(write_campaign: Callable[[str], Path],
                                                               tmp_path: Path) -> None:
    text = campaign(tmp_path, [
        ("cold", "first_start", 1), ("warm", "disk_cold, page_cache_warm", 2),
        ("once", "fresh_container, sleep_wake, enforce_eager, runai_streamer, bytecode_persisted", 1)])
    # A trial of another kind after them: its first playbook waits for its turn too, so it starts early as well.
    path = write_campaign(text + "  - kind: selftest\n    modes: [noop]\n    repeats: 1\n")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    r = rows(results)
    summary = rows(results, "summary.csv")
    assert {v["status"] for k, v in r.items() if not k.startswith("runai")} == {"ok"}
    assert r["runai_streamer.r1"]["status"] == "skipped"
    assert r["runai_streamer.r1"]["reason"].startswith("the stand-in does not model --load-format runai_streamer")

    # The page cache is real: a dropped cache reads the weights from disk, a warm one from RAM.
    assert float(r["disk_cold.r2"]["resident_fraction_before"]) < 0.05
    # The stand-in evicts its own model's files, not the whole machine's page cache (drop_scope auto).
    assert r["disk_cold.r2"]["page_cache_action"] == "drop (files)"
    assert r["page_cache_warm.r2"]["page_cache_action"] == "warm"
    assert float(r["page_cache_warm.r2"]["resident_fraction_before"]) > 0.95
    # No assertion on the read seconds: they are the machine's disk, not the tool. A VM disk backed
    # by its host's cache read the 384 MiB evicted in 0.11 s against 0.09 s warm (a fresh-clone run).
    assert all(float(summary[t]["weights_load_s"]) > 0 for t in ("disk_cold.r2", "page_cache_warm.r2"))
    # The reference pairs: the very first start empties the persistent cache and fills it, so both
    # disk_cold repeats start warm and hit; the state is read from disk, the hit from the log.
    assert (r["first_start.r1"]["cache_state"], r["first_start.r1"]["compile_cache_hit"]) == ("empty", "False")
    for trial in ("disk_cold.r1", "disk_cold.r2", "page_cache_warm.r1"):
        assert (r[trial]["cache_state"], r[trial]["compile_cache_hit"]) == ("warm", "True"), trial
        assert int(r[trial]["cache_files"]) > 0
    assert (r["fresh_container.r1"]["cache_state"], r["fresh_container.r1"]["compile_cache_hit"]) == ("fresh", "False")
    assert (r["sleep_wake.r1"]["cache_state"], r["sleep_wake.r1"]["compile_cache_hit"]) == ("warm", "False")
    assert float(r["fresh_container.r1"]["compile_s"]) > 2 * float(r["disk_cold.r2"]["compile_s"])
    # A sleeping engine wakes to its first token faster than any start.
    assert float(r["sleep_wake.r1"]["wake_to_first_token_s"]) < 0.5 * float(r["disk_cold.r2"]["first_token_s"])

    # Every start explained: named phases from the log, the timer and the stand-in's process.
    for trial, row in r.items():
        if row["status"] != "ok":
            continue
        assert float(row["other_s"]) <= 0.05 * float(row["first_token_s"]), (trial, row)
        assert float(row["timeline_resolution_s"]) == 1.0 and "log" in row["timeline_sources"], trial
        # The timer saw the stand-in's VLLM::EngineCore child appear, as it sees vLLM's on a node.
        assert row["engine_spawn_s"] != "" and "proc" in row["timeline_sources"], (trial, row["timeline_sources"])
        for phase in ("api_imports_s", "config_s", "engine_imports_s", "weights_s", "kv_profile_s", "kernel_jit_s",
                      "api_ready_s", "first_request_s"):
            assert row[phase] != "", (trial, phase)
        assert float(row["api_imports_s"]) > 0  # the stand-in's Python really starts
        assert 0.0 <= float(row["pyc_warm_fraction"]) <= 1.0
    # Eager: no compile, no graphs; what follows the KV allocation is still kernel JIT and warm-up.
    assert r["enforce_eager.r1"]["compile_s"] == r["enforce_eager.r1"]["graph_capture_s"] == ""
    report = (results / "report.md").read_text()
    assert "![startup phases](startup.png)" in report and (results / "startup.png").stat().st_size > 10_000
    assert "Phase boundaries: 9 trials to 1 s." in report
    # The engine's stop is measured: what a restart pays before its start.
    assert all(0 < float(row["stop_s"]) < 30 for row in r.values() if row["status"] == "ok")

    # Each trial after the first had its Ansible run started while the one before it collected
    # (runner/overlap.py), and waited for its turn: no two trials' node work overlapped.
    records = [json.loads(t.read_text()) for t in sorted((results / "trials").glob("*/trial.json"))]
    records.sort(key=lambda rec: rec["started"])
    early = [rec for rec in records if rec["phases"] and "waited_for_turn_s" in rec["phases"][0]]
    assert [rec["id"] for rec in early] == [rec["id"] for rec in records[1:]]  # every kind's first playbook waits
    # The first read the host's facts in its own Ansible run, before its own tasks (runner/host_checks.py).
    assert records[0]["host_facts"] == json.loads((results / "hosts/localhost/facts.json").read_text())
    assert not (results / "hosts/localhost/ansible").exists()
    assert records[-1]["kind"] == "selftest"
    for before, after in itertools.pairwise(records):
        assert after["phases"][0]["started"] < before["ended"] <= after["started"], (before["id"], after["id"])
        # Its turn came once the trial before it had left the node (its last file written there; the
        # copy home keeps the times), while that trial's files were still copied home and its record
        # written (Phase.turn_from).
        turn_at = after["phases"][0]["started"] + after["phases"][0]["waited_for_turn_s"]
        raw = results / "trials" / before["id"] / "raw" / "localhost"
        last_written = max(p.stat().st_mtime for p in raw.iterdir())
        assert last_written <= turn_at < before["ended"], (before["id"], after["id"])
    # A startup trial that measured wrote its marker once its windows were over, just before its
    # engine's stop, with this run's lease: the next trial's run started then (runner/overlap.py),
    # after the measured windows and before this trial's collect began, while its turn still came
    # only after the node was left (above).
    for before, after in itertools.pairwise(records):
        if before["status"] != "ok":
            continue
        marker = json.loads((Path(before["remote_dir"]) / "window-over.json").read_text())
        assert marker["lease"].endswith(f":{before['id']}"), marker
        raw = results / "trials" / before["id"] / "raw" / "localhost"
        timings = json.loads((raw / "timings.json").read_text())
        events = timings["events"]
        window_end = timings["started_at"] + max(events["first_token"], events.get("first_token_after_wake", 0))
        stop_at = timings["started_at"] + events["stop_requested"]
        collect_at = task_started(results / "trials" / before["id"], "collect_engine_files |")
        assert window_end - 0.001 <= marker["at"] <= stop_at + 0.001, before["id"]  # events: to 0.1 ms
        assert marker["at"] <= after["phases"][0]["started"] < collect_at, (before["id"], after["id"])
    # A trial whose program finished cleanly has the node's state after the stop from its timer,
    # not a second read of every fact (0.64 s on the H200); the one the stand-in skipped before any
    # program ran still has the module's facts.
    for rec in records[:-1]:
        raw = results / "trials" / rec["id"] / "raw" / "localhost"
        if rec["status"] == "ok":
            after_stop = json.loads((raw / "timings.json").read_text())["node_after_stop"]
            assert after_stop["page_cache_bytes"] > 0 and after_stop["shm_offload_files"] == [], rec["id"]
            assert not (raw / "facts_after.json").exists(), rec["id"]
        else:
            assert json.loads((raw / "facts_after.json").read_text())["memory"]["total_bytes"] > 0, rec["id"]
    assert not list((results / "trials").glob("*/ansible/turn")) or all(
        t.read_text().strip() == "go" for t in (results / "trials").glob("*/ansible/turn"))
    # The imports, to the package: every started engine's processes profiled apart from its log, the
    # API server's window split by package, its CPU beside the window; the persisted bytecode leaves
    # no counted module without a usable .pyc, and says it compiled it before the start.
    for trial, row in r.items():
        if row["status"] != "ok":
            continue
        raw = next((results / "trials").glob(f"*.{trial}@localhost")) / "raw" / "localhost"
        assert "# process " in (raw / "importtime.txt").read_text(), trial
        assert "import time:" not in (raw / "server.log").read_text(), trial
        assert row["import_top_package"] in {"stdlib", "aiohttp", "nodetools"}, (trial, row["import_top_package"])
        assert 0 < float(row["api_import_cpu_s"]) <= 1.5 * float(row["api_imports_s"]) + 0.5, trial
        # The stand-in's EngineCore imports next to nothing (its start is modelled): the share is the API's.
        assert 0.0 < float(row["import_profiled_fraction"]) <= 1.0, (trial, row["import_profiled_fraction"])
    assert int(r["page_cache_warm.r1"]["pyc_missing_modules"]) >= 0
    assert int(r["bytecode_persisted.r1"]["pyc_missing_modules"]) == 0
    assert float(r["bytecode_persisted.r1"]["bytecode_compile_s"]) >= 0
    assert "### The imports, to the package" in report and (results / "startup_imports.png").stat().st_size > 10_000
    assert "_imports" not in (results / "startup.csv").read_text().splitlines()[0].split(",")

    # What --plan showed is what the node ran: each trial's planned engine command (plan.json) is the
    # one in the launch file its program wrote, and the one the timer recorded as it started it.
    planned = {t["id"]: t["launch"] for t in json.loads((results / "plan.json").read_text())["trials"]}
    for rec in records[:-1]:
        if rec["status"] != "ok":
            continue
        raw = results / "trials" / rec["id"] / "raw" / "localhost"
        ran = json.loads((raw / "launch.json").read_text())
        timed = json.loads((raw / "timings.json").read_text())
        assert timed["argv"] == ran["argv"] == planned[rec["id"]]["argv"] == rec["launch"]["argv"], rec["id"]
        assert ran["env"] == planned[rec["id"]]["env"], rec["id"]


def test_engine_that_fails_to_start_is_a_failed_row_with_its_error_and_a_clean_node(
        write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    text = campaign(tmp_path, [("fail", "disk_cold", 1)], env=', STANDIN_KV_CAPACITY_TOKENS: "16"')
    path = write_campaign(text)
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    row = rows(results)["disk_cold.r1"]
    assert row["status"] == "failed"
    task = "Prepare, then start, time and stop the engine"
    assert row["reason"].startswith(f"failed in phase trial: localhost: task '{task}': ")
    assert "engine exited with rc" in row["reason"]
    assert "engine errors: engine_core_failed, kv_cache_insufficient" in row["reason"]
    assert "log tail: " in row["reason"]
    port = int(text.split("port: ")[1].split()[0])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    assert (results / "trials/fail.disk_cold.r1@localhost/raw/localhost/server.log").is_file()


def test_a_host_whose_preflight_fails_runs_nothing_of_its_first_trial(write_campaign: Callable[[str], Path],
                                                                     tmp_path: Path) -> None:
    # The host's first trial reads the facts in its own Ansible run, before its own play: a host whose
    # facts cannot be read is left out of that play, and every trial of it is a failed row.
    path = write_campaign(campaign(tmp_path, [("gone", "disk_cold", 2)]))
    (tmp_path / "inventory" / "hosts.yml").write_text(f"""\
all:
  hosts:
    gone:
      ansible_host: 127.0.0.1
      ansible_port: {free_port()}
      ansible_connection: ssh
      ansible_ssh_common_args: -o ConnectTimeout=5 -o StrictHostKeyChecking=no
""")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    r = rows(results)
    assert [r[t]["status"] for t in ("disk_cold.r1", "disk_cold.r2")] == ["failed", "failed"]
    assert r["disk_cold.r1"]["reason"].startswith("host preflight failed: unreachable in phase trial: gone: "
                                                  "task 'read_facts | Read GPUs")
    assert r["disk_cold.r2"]["reason"].startswith(r["disk_cold.r1"]["reason"].split(";")[0])
    first = json.loads((results / "trials/gone.disk_cold.r1@gone/trial.json").read_text())
    second = json.loads((results / "trials/gone.disk_cold.r2@gone/trial.json").read_text())
    assert [p["status"] for p in first["phases"]] == ["failed"] and second["phases"] == []  # r2 never started
    assert first["host_facts"] is None and not (results / "hosts/gone/facts.json").exists()
    assert not (tmp_path / "remote").exists()  # nothing of the trial's own play ran
