"""Snapshot end to end on this machine: a real CRIU dump and restore of the running stand-in.

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

from nodetools.snapshot import criu_version
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


def campaign(tmp_path: Path, port: int, criu_params: str) -> str:
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
"""


def rows(results: Path) -> dict[str, dict[str, str]]:
    with (results / "snapshot.csv").open() as fh:
        return {r["mode"]: r for r in csv.DictReader(fh)}


def port_free(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return True
    return False


def test_criu_dumps_and_restores_the_running_stand_in(criu: str, write_campaign: Callable[[str], Path],
                                                      tmp_path: Path) -> None:
    port = free_port()
    path = write_campaign(campaign(tmp_path, port, f"{{criu: {criu}}}"))
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    r = rows(results)
    assert r["criu"]["status"] == "ok"
    assert float(r["criu"]["image_gib"]) > 0.001  # a real image of a real process
    assert 0 < float(r["criu"]["dump_s"]) < 30 and 0 < float(r["criu"]["restore_s"]) < 30
    # The restored server answered: restore to first token beats the cold start it replaces.
    assert float(r["criu"]["restore_to_first_token_s"]) < float(r["criu"]["first_token_s"])
    assert r["cuda_checkpoint"]["status"] == "skipped"
    assert r["cuda_checkpoint"]["reason"] == "no GPU: cuda-checkpoint needs an NVIDIA GPU and driver"
    assert port_free(port)
    raw = results / "trials/snapshot.criu.r1@localhost/raw/localhost"
    assert (raw / "dump.log").is_file() and (raw / "restore.log").is_file()


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
    row = rows(results)["criu"]
    assert row["status"] == "failed"
    assert "snapshot: criu dump failed with rc 1 (see dump.log)" in row["reason"]
    assert "criu_dump_failed: criu dump failed" in row["reason"] and "dump.log tail: " in row["reason"]
    timings = (results / "trials/snapshot.criu.r1@localhost/raw/localhost/timings.json").read_text()
    assert '"after_failed_dump": "running"' in timings  # CRIU thawed it: never left half-frozen
    assert port_free(port)  # and the engine was then stopped cleanly
