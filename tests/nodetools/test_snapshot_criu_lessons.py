"""The three lessons of the first real vLLM dump, as real CRIU runs of the stand-in on this machine.

``nodetools.snapshot measure --mode criu`` against ``snapshot_engine.py`` (the stand-in, with an
io_uring mapped as vLLM's API server maps one, or an established loopback TCP connection inside
the tree). Needs root and CRIU >= 4.2 (``CRIU_BIN``, default /usr/local/sbin/criu); the sysctl
``kernel.io_uring_disabled`` is the machine's own and is checked back at its value after each test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodetools.proc import port_open
from nodetools.snapshot.criu_node import criu_version
from nodetools.snapshot.io_uring import SYSCTL
from runner.parse.snapshot_logs import classify
from tests.nodetools.fake_cuda import TOOL

REPO = Path(__file__).resolve().parents[2]
ENGINE = Path(__file__).with_name("snapshot_engine.py")
CRIU = os.environ.get("CRIU_BIN", "/usr/local/sbin/criu")
FAST = {"STANDIN_PROCESS_START_S": "0", "STANDIN_MODEL_INIT_S": "0", "STANDIN_DYNAMO_S": "0",
        "STANDIN_COMPILE_MISS_S": "0", "STANDIN_JIT_MISS_S": "0", "STANDIN_GRAPH_CAPTURE_S": "0",
        "STANDIN_KV_ALLOC_S": "0", "STANDIN_API_START_S": "0", "STANDIN_PROFILE_S": "0"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or (criu_version(CRIU) or (0,)) < (4, 2),
                                reason=f"needs root and CRIU >= 4.2 at {CRIU}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def sysctl_kept() -> Iterator[str]:
    """The machine's io_uring setting: every test must leave it as it found it."""
    before = SYSCTL.read_text().strip()
    yield before
    after = SYSCTL.read_text().strip()
    SYSCTL.write_text(f"{before}\n")
    assert after == before, f"kernel.io_uring_disabled left at {after} (was {before})"


class Trial:
    def __init__(self, tmp: Path, model: Path, *engine: str) -> None:
        self.dir = tmp / "trial"
        self.dir.mkdir()
        self.leases, self.locks = tmp / "leases", tmp / "locks"
        self.port = free_port()
        self.out = self.dir / "timings.json"
        launch = {"argv": [sys.executable, str(ENGINE), *engine, "--", "serve", str(model), "--host", "127.0.0.1",
                           "--port", str(self.port), "--served-model-name", "m"],
                  "env": FAST, "port": self.port, "model": "m", "gpus": []}
        (self.dir / "launch.json").write_text(json.dumps(launch))

    def argv(self, *options: str, criu: str = CRIU) -> list[str]:
        return [sys.executable, "-m", "nodetools.snapshot", "measure", "--mode", "criu", "--criu", criu,
                "--launch", str(self.dir / "launch.json"), "--log", str(self.dir / "server.log"), "--out",
                str(self.out), "--images", str(self.dir / "images"), "--lease-dir", str(self.leases), "--lock-dir",
                str(self.locks), "--timeout-s", "120", "--answers", "1", *options]

    def measure(self, *options: str, criu: str = CRIU, path: str | None = None) -> tuple[int, dict[str, Any]]:
        env = {**os.environ, **({"PATH": path} if path else {})}
        done = subprocess.run(self.argv(*options, criu=criu), capture_output=True, text=True, check=False, env=env,
                              cwd=REPO, timeout=300)
        return done.returncode, json.loads(self.out.read_text())

    def log(self, name: str) -> str:
        return (self.dir / name).read_text(errors="replace")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(path), "--size-mib", "8"],
                   check=True, capture_output=True, cwd=REPO)
    return path


def fake_bin(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def path_without_iptables() -> str:
    """This PATH without the folders that hold iptables (/usr/sbin, /sbin)."""
    keep = [d for d in os.environ["PATH"].split(os.pathsep)
            if d and not (Path(d) / "iptables").exists() and not (Path(d) / "iptables-restore").exists()]
    return os.pathsep.join(keep)


# --- 1. io_uring ------------------------------------------------------------------------------------


def test_io_uring_is_off_for_the_engines_whole_life_and_put_back(tmp_path: Path, model: Path,
                                                                 sysctl_kept: str) -> None:
    trial = Trial(tmp_path, model, "--io-uring")
    rc, out = trial.measure()
    assert rc == 0, out.get("error")
    assert "snapshot_engine: io_uring: refused" in trial.log("server.log")  # set before the engine started
    changed = {"restored": sysctl_kept} if sysctl_kept != "2" else {}
    assert out["io_uring"] == {"sysctl": "kernel.io_uring_disabled", "available": True, "previous": sysctl_kept,
                               "during_engine": "2", **changed}
    assert out["restore_to_first_token_s"] > 0 and out["port_free_after_dump"] is True
    assert list(trial.leases.glob("*.json")) == []  # the lease and its restore_on_reap went with the tool


def test_an_engine_that_maps_an_io_uring_fails_the_dump_with_criu_s_own_line(tmp_path: Path, model: Path,
                                                                            sysctl_kept: str) -> None:
    if sysctl_kept != "0":
        pytest.skip(f"io_uring is already restricted on this machine ({sysctl_kept})")
    trial = Trial(tmp_path, model, "--io-uring")
    rc, out = trial.measure("--keep-io-uring")
    assert rc == 3 and out["error"] == "criu dump failed with rc 1 (see dump.log)"
    assert "snapshot_engine: io_uring: mapped" in trial.log("server.log")
    assert "Unknown shit 600 (anon_inode:[io_uring])" in trial.log("dump.log")
    assert "criu_io_uring" in classify(trial.log("dump.log"))
    assert out["after_failed_dump"] == "running" and out["io_uring"]["left_alone"] is True
    assert not port_open(trial.port)  # then stopped cleanly


# --- 2. an established TCP connection and the network lock -------------------------------------------


def test_a_network_lock_the_node_cannot_do_fails_with_criu_s_lines(tmp_path: Path, model: Path) -> None:
    # iptables "present" but failing, as a node whose iptables cannot run (exit 127 on the H200: absent)
    fakes = tmp_path / "bin"
    for name in ("iptables", "iptables-restore"):
        fake_bin(fakes, name, "echo 'fake iptables: cannot run here' >&2; exit 127")
    trial = Trial(tmp_path, model, "--tcp-pair")
    rc, out = trial.measure("--network-lock", "iptables", path=f"{fakes}{os.pathsep}{path_without_iptables()}")
    assert rc == 3 and out["network_lock"]["method"] == "iptables"
    dump = trial.log("dump.log")
    assert "Iptables configuration failed" in dump and "Failed to lock TCP connection" in dump
    assert "criu_tcp_lock" in classify(dump)
    assert out["after_failed_dump"] == "running" and not port_open(trial.port)


def test_auto_takes_a_lock_the_node_has(tmp_path: Path, model: Path) -> None:
    trial = Trial(tmp_path, model, "--tcp-pair")
    rc, out = trial.measure(path=path_without_iptables())  # no iptables: nftables if CRIU can, else skip
    assert rc == 0, out.get("error")
    lock = out["network_lock"]
    assert lock["asked"] == "auto" and lock["iptables"] is None
    assert lock["method"] == ("nftables" if lock["criu_nftables_lock"] else "skip")
    assert out["restore_to_first_token_s"] > 0


def test_without_tcp_established_the_dump_says_so(tmp_path: Path, model: Path) -> None:
    trial = Trial(tmp_path, model, "--tcp-pair")
    rc, out = trial.measure("--network-lock", "skip", "--criu-flags", json.dumps(["--shell-job", "--file-locks"]))
    assert rc == 3 and out["criu_flags"] == ["--shell-job", "--file-locks"]
    assert "criu_tcp_established" in classify(trial.log("dump.log"))


@pytest.mark.skipif(shutil.which("iptables") is None, reason="needs iptables")
def test_a_failed_restore_removes_the_rules_criu_locked_the_connections_with(tmp_path: Path, model: Path) -> None:
    fake_criu = fake_bin(tmp_path / "bin", "fake-criu-restore-fails",
                         f'if [ "$1" = restore ]; then echo "fake: restore refused" >&2; exit 1; fi\n'
                         f'exec {CRIU} "$@"')
    trial = Trial(tmp_path, model, "--tcp-pair")
    rc, out = trial.measure("--network-lock", "iptables", criu=str(fake_criu))
    assert rc == 3 and out["error"] == "criu restore failed with rc 1 (see restore-dropped.log)"
    assert out["dump_s"] > 0 and out["image_bytes"] > 0  # the dump locked the connection's packets
    removed = out["network_lock_left_after_failure"]
    assert removed and all(line.startswith("iptables removed: -A ") and "0xc114" in line for line in removed)
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    assert "0xc114" not in rules.lower()


# --- io_uring put back by the reaper when the tool is killed ---------------------------------------


def test_a_killed_tool_leaves_the_setting_to_the_reaper(tmp_path: Path, model: Path, sysctl_kept: str) -> None:
    if sysctl_kept == "2":
        pytest.skip("io_uring is already disabled on this machine: nothing to put back")
    trial = Trial(tmp_path, model)
    tool = subprocess.Popen(trial.argv(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        lease: dict[str, Any] = {}
        while time.monotonic() < deadline and not (lease.get("groups") and port_open(trial.port)):
            leases = list(trial.leases.glob("*.json"))
            lease = json.loads(leases[0].read_text()) if leases else {}
            time.sleep(0.1)
        assert lease.get("restore_on_reap") == [{"path": str(SYSCTL), "value": sysctl_kept,
                                                 "what": "kernel.io_uring_disabled"}]
        assert SYSCTL.read_text().strip() == "2"
        tool.send_signal(signal.SIGKILL)
        tool.wait(timeout=30)
    finally:
        if tool.poll() is None:
            tool.kill()
    assert SYSCTL.read_text().strip() == "2"  # nobody put it back yet
    done = subprocess.run([sys.executable, "-m", "nodetools.reap", "--root", str(trial.leases), "--grace-s", "10"],
                          capture_output=True, text=True, check=False, cwd=REPO, timeout=120)
    reaped = json.loads(done.stdout)
    assert done.returncode == 0 and reaped["restored"] == [f"kernel.io_uring_disabled = {sysctl_kept}"]
    assert SYSCTL.read_text().strip() == sysctl_kept
    assert not port_open(trial.port) and list(trial.leases.glob("*.json")) == []


# --- 5. which cuda-checkpoint CRIU's plugin runs ----------------------------------------------------


def test_a_cuda_checkpoint_path_is_what_the_plugin_finds_on_criu_s_path(tmp_path: Path, model: Path) -> None:
    trial = Trial(tmp_path, model)
    rc, out = trial.measure("--cuda-checkpoint", str(TOOL))
    assert rc == 0, out.get("error")
    tool = out["cuda_checkpoint_tool"]
    assert tool["tool"] == "cuda_checkpoint_api" and tool["source"] == "content" and tool["path"] == str(TOOL)
    shim = trial.dir / "cuda-checkpoint-bin" / "cuda-checkpoint"
    done = subprocess.run([str(shim), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "not NVIDIA's tool" in done.stdout
    assert "No GPU device found; CUDA plugin is disabled" in trial.log("dump.log")  # no GPU here: none acted


# --- 4. one dump, two restores: the link-remap files the first restore consumes ---------------------

def test_a_dump_with_a_link_remap_restores_twice(tmp_path: Path, model: Path) -> None:
    """vLLM 0.24.0 on the H200: the second restore from one dump failed with "Can't link
    dev/shm/link_remap.N" (the first had unlinked it). The tool keeps a copy and puts it back."""
    keep = Path("/dev/shm") / f"gpu-campaign-test-{os.getpid()}"  # the second name: on the same filesystem
    keep.mkdir()
    try:
        trial = Trial(tmp_path, model, "--unlinked-shm", str(keep))
        rc, out = trial.measure("--restore-cache", "dropped,warm")
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    assert "unlinked shm: /dev/shm/snapshot-engine-" in trial.log("server.log")
    assert rc == 0, out.get("error")
    assert [r["cache"] for r in out["restores"]] == ["dropped", "warm"]
    assert all(r["restore_to_first_token_s"] > 0 for r in out["restores"])
    remaps = out["link_remaps"]
    assert "/dev/shm" in remaps["dirs"]
    assert remaps["kept"] and all("/dev/shm/link_remap." in p for p in remaps["kept"])
    assert remaps["put_back"] == len(remaps["kept"])  # the second restore needed them again
    assert not [p for p in remaps["kept"] if Path(p).exists()], "link_remap files left in /dev/shm"
    assert not (tmp_path / "trial" / "images.link-remaps").exists()
