"""Snapshot end to end on this machine: a real CRIU dump and restores of the running stand-in, through
the runner (gates, measure, collect, report): page cache dropped, then warm, and a lazy restore; and
quiesced: the stand-in put to sleep before the dump, its images staged in tmpfs, woken after each
restore (level 2: its weights reloaded), the rows and the chart.

CRIU comes from the criu role (scripts/test.sh installs it before the tests; ``CRIU_BIN`` may
point elsewhere). Debian 12's 3.17 cannot run on this kernel and 4.1 cannot dump TCP sockets here,
so a CRIU older than 4.2 is a failed precondition of the suite, not a skip.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodetools.snapshot.criu_node import criu_version
from nodetools.snapshot.kernel_memory import read_thp
from runner.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def criu() -> str:
    path = os.environ.get("CRIU_BIN", "/usr/local/sbin/criu")
    version = criu_version(path)
    if version is None or version < (4, 2):
        pytest.fail(f"CRIU >= 4.2 is needed at {path} (found {version}): scripts/test.sh installs it with the "
                    "criu role; set CRIU_BIN to use another build")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def campaign(tmp_path: Path, port: int, criu_params: str, lazy: str = "") -> str:
    lazy_experiment = f"""\
  - kind: snapshot
    name: lazy
    modes:
      criu: {lazy}
    timeout_s: 180
""" if lazy else ""
    return f"""\
name: snapshot-test
inventory: inventory
remote_dir: {tmp_path / 'remote'}
engine:
  kind: stand-in
  model: {tmp_path / 'model'}
  standin_model_mib: 64
  served_model_name: standin
  port: {port}
  cache_root: {tmp_path / 'cache'}
  env: {{STANDIN_COMPILE_MISS_S: "0.5", STANDIN_JIT_MISS_S: "0.2"}}
experiments:
  - kind: snapshot
    modes:
      criu: {criu_params}
      cuda_checkpoint:
    timeout_s: 180
{lazy_experiment}"""


def rows(results: Path) -> dict[str, dict[str, str]]:
    with (results / "snapshot.csv").open() as fh:
        return {f"{r['experiment']}.{r['mode']}": r for r in csv.DictReader(fh)}


def port_free(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return True
    return False


def test_criu_dumps_and_restores_the_running_stand_in(criu: str, write_campaign: Callable[[str], Path],
                                                      tmp_path: Path) -> None:
    port = free_port()
    io_uring_before = Path("/proc/sys/kernel/io_uring_disabled").read_text()
    path = write_campaign(campaign(tmp_path, port, f"{{criu: {criu}, restore_cache: [dropped, warm]}}",
                                   lazy=f"{{criu: {criu}, lazy_pages: true}}"))
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    r = rows(results)
    row = r["snapshot.criu"]
    assert row["status"] == "ok"
    assert float(row["image_gib"]) > 0.001  # a real image of a real process
    assert 0 < float(row["dump_s"]) < 30
    # Two restores from the one dump: from the disk (page cache dropped), then from the page cache.
    assert 0 < float(row["restore_dropped_s"]) < 30 and 0 < float(row["restore_warm_s"]) < 30
    assert row["restore_s"] == row["restore_dropped_s"] and row["restore_cache"] == "dropped"
    assert float(row["image_resident_fraction"]) < 0.5  # measured right before the first restore
    # Each restored server answered: restore to first token beats the cold start it replaces.
    for key in ("restore_dropped_to_first_token_s", "restore_warm_to_first_token_s"):
        assert float(row[key]) < float(row["first_token_s"])
    assert float(row["first_answer_after_restore_s"]) > 0 and float(row["answer_before_dump_s"]) > 0
    assert row["port_free_after_dump"] == "True" and row["io_uring_disabled"] == "2"
    assert row["network_lock"] in ("iptables", "nftables", "skip") and row["images_fs"]
    assert row["cuda_plugin"] == "disabled: No GPU device found" and row["cuda_checkpoint_tool"] == "none acted"
    lazy = r["lazy.criu"]
    assert lazy["status"] == "ok" and lazy["lazy_pages"] == "True"
    assert float(lazy["lazy_pages_done_dropped_s"]) > 0 and int(lazy["lazy_page_faults"]) > 0
    assert lazy["first_token_before_image_read"] in ("True", "False")  # recorded either way
    assert r["snapshot.cuda_checkpoint"]["status"] == "skipped"
    assert r["snapshot.cuda_checkpoint"]["reason"] == "no GPU: cuda-checkpoint needs an NVIDIA GPU and driver"
    assert port_free(port)
    assert Path("/proc/sys/kernel/io_uring_disabled").read_text() == io_uring_before  # put back
    raw = results / "trials/snapshot.criu.r1@localhost/raw/localhost"
    for log in ("dump.log", "restore-dropped.log", "restore-warm.log"):
        assert (raw / log).is_file()
    assert (results / "trials/lazy.criu.r1@localhost/raw/localhost/lazy-pages-dropped.log").is_file()
    report = (results / "report.md").read_text()
    assert "| CRIU restore from disk, page cache dropped | snapshot |" in report
    assert "| CRIU restore from disk (lazy pages), page cache dropped | lazy |" in report


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_dump_that_fails_midway_leaves_the_engine_running_then_stopped(
        criu: str, write_campaign: Callable[[str], Path], tmp_path: Path, tiny_tmpfs: Path) -> None:
    port = free_port()
    # 1 MiB cannot hold the image: CRIU fails after freezing the tree, while writing it.
    path = write_campaign(campaign(tmp_path, port, f"{{criu: {criu}, images_dir: {tiny_tmpfs / 'img'}}}"))
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    row = rows(results)["snapshot.criu"]
    assert row["status"] == "failed"
    assert "snapshot: criu dump failed with rc 1 (see dump.log)" in row["reason"]
    assert "criu_dump_failed: criu dump failed" in row["reason"] and "dump.log tail: " in row["reason"]
    timings = (results / "trials/snapshot.criu.r1@localhost/raw/localhost/timings.json").read_text()
    assert '"after_failed_dump": "running"' in timings  # CRIU thawed it: never left half-frozen
    assert '"fs_type": "tmpfs"' in timings and '"in_ram": true' in timings
    assert port_free(port)  # and the engine was then stopped cleanly


def test_a_quiesced_stand_in_is_dumped_asleep_staged_restored_and_woken(
        criu: str, write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    port, stage = free_port(), Path("/dev/shm") / f"gpu-campaign-test-stage-{os.getpid()}"
    text = campaign(tmp_path, port, f"{{criu: {criu}, quiesce: sleep, image_source: tmpfs, stage_dir: {stage}, "
                                    "restore_cache: [dropped, warm], tmpfs_read_gb_s: 2.0}")
    text += f"""\
  - kind: snapshot
    name: level2
    modes:
      criu: {{criu: {criu}, quiesce: sleep2, disk_read_gb_s: 0.5, thp: never}}
    timeout_s: 180
"""
    thp_before = read_thp()
    path = write_campaign(text.replace("      cuda_checkpoint:\n", "      cuda_checkpoint: {quiesce: sleep}\n"))
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    r = rows(results)
    asleep, level2 = r["snapshot.criu"], r["level2.criu"]
    assert asleep["status"] == "ok" and asleep["quiesce"] == "sleep" and asleep["model"] == "model"
    assert asleep["criu_version"] == ".".join(map(str, criu_version(criu) or ()))
    # Asleep, the stand-in holds its 64 MiB of weights in a memfd: the image carries them.
    assert float(asleep["sleep_host_gib"]) >= 0.9 * 64 / 1024 and float(asleep["sleep_s"]) > 0
    assert float(asleep["image_gib"]) > 64 / 1024
    assert asleep["image_source"] == "tmpfs" and float(asleep["stage_s"]) > 0 and float(asleep["wake_s"]) > 0
    assert float(asleep["restore_to_first_token_s"]) > float(asleep["restore_s"])
    assert float(asleep["limit_s"]) > 0 and asleep["limit_read_from"] == "mode parameter"
    assert not stage.exists()  # the staged copy is RAM: removed with the trial
    assert level2["status"] == "ok" and level2["quiesce"] == "sleep2" and level2["image_source"] == "disk"
    assert float(level2["reload_s"]) > 0 and float(level2["wake_s"]) > 0
    assert float(asleep["image_gib"]) - float(level2["image_gib"]) >= 0.9 * 64 / 1024  # the weights left out
    # CRIU's log splits the restore: the sleeping stand-in's weights came back as a memfd, by the page reader.
    assert float(asleep["restore_memfd_gib"]) >= 0.9 * 64 / 1024 and float(asleep["restore_memfd_s"]) >= 0
    assert "restore_memfd_gib" not in level2 or not level2["restore_memfd_gib"]  # sleep2 dropped them
    # How the pages came in (the kernel's counters across CRIU's restore) and under which THP settings.
    assert int(asleep["restore_pgfault"]) > 0 and asleep["thp"] == "leave"
    assert asleep["thp_enabled"] == thp_before["enabled"]
    assert level2["thp"] == "never" and level2["thp_enabled"] == "never" and level2["thp_shmem_enabled"] == "never"
    assert read_thp() == thp_before  # put back after the trial
    assert r["snapshot.cuda_checkpoint"]["status"] == "skipped" and r["snapshot.cuda_checkpoint"]["quiesce"] == "sleep"
    log = (results / "trials/snapshot.criu.r1@localhost/raw/localhost/server.log").read_text()
    assert "POST /sleep?level=1" in log and log.count("wake up the engine with tags: None") == 2
    report = (results / "report.md").read_text()
    assert "| CRIU restore from tmpfs, engine asleep (sleep) | snapshot |" in report
    assert "| CRIU restore from disk, engine asleep (sleep2), page cache dropped | level2 |" in report
    assert "![every restore by stage](snapshot_restore.png)" in report
    assert (results / "snapshot_restore.png").stat().st_size > 1000
    assert port_free(port)
