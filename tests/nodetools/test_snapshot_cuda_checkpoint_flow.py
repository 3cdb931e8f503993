"""nodetools.snapshot's cuda_checkpoint mode without a GPU: finding the engine's CUDA processes, the
order of the actions over a process tree, per-process seconds, putting things back after a failure,
and the gates with nodetools/cuda_checkpoint_api.py in place of NVIDIA's binary.

The processes are real (a process group with children that map a temporary file, standing for
/dev/nvidia*); the driver is the FAKE libcuda of tests/nodetools/fake_libcuda.c (compiled here;
skipped where there is no C compiler) behind the real cuda_checkpoint_api.py.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import os
import re
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodetools import exitcodes
from nodetools.snapshot import cuda_checkpoint_mode
from nodetools.snapshot import gates as gates_module
from nodetools.snapshot.cuda_checkpoint_mode import CudaCheckpointRun, find_cuda_processes
from nodetools.snapshot.cuda_tool import argv as cuda_checkpoint_argv
from nodetools.snapshot.gates import gates
from tests.nodetools.fake_cuda import TOOL, Fake, compile_fake

CHILD = """\
import mmap, os, sys, time
path, how = sys.argv[1], sys.argv[2]
if how == "own-group":
    os.setpgid(0, 0)  # its own process group, still in the engine's session
if how != "plain":
    f = open(path, "r+b")
    m = mmap.mmap(f.fileno(), 4096)
print(os.getpid(), flush=True)
time.sleep(300)
"""
LEADER = """\
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2], how], stdout=subprocess.PIPE, text=True)
        for how in ("map", "own-group", "map", "plain")]
print(" ".join(k.stdout.readline().strip() for k in kids), flush=True)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_fake(tmp_path_factory.mktemp("fakecuda"), "fake_libcuda.so")


@pytest.fixture
def fake(fake_libcuda: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    driver = Fake(fake_libcuda, tmp_path)
    for key, value in driver.env.items():
        monkeypatch.setenv(key, value)
    return driver


class Engine:
    """A process group shaped like vLLM's: a leader without the device, children that map it."""

    def __init__(self, tmp: Path) -> None:
        self.device = tmp / "fake-nvidia0"
        self.device.write_bytes(bytes(4096))
        child = tmp / "child.py"
        child.write_text(CHILD)
        self.leader = subprocess.Popen([sys.executable, "-c", LEADER, str(child), str(self.device)],
                                       stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.leader.stdout is not None
        self.mapper, self.own_group, self.not_cuda, self.plain = map(int, self.leader.stdout.readline().split())
        self.outsider = subprocess.Popen([sys.executable, str(child), str(self.device), "map"], stdout=subprocess.PIPE,
                                         text=True, start_new_session=True)
        assert self.outsider.stdout is not None
        self.outsider.stdout.readline()
        self.pattern = re.escape(str(self.device))

    def stop(self) -> None:
        for pid in (self.mapper, self.own_group, self.not_cuda, self.plain, self.leader.pid, self.outsider.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.leader.wait(timeout=10)
        self.outsider.wait(timeout=10)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    started = Engine(tmp_path)
    yield started
    started.stop()


def test_finds_the_group_and_session_processes_that_map_the_device(engine: Engine) -> None:
    found = find_cuda_processes(engine.leader.pid, Path("/proc"), engine.pattern)
    # not the leader nor the child that maps nothing, not the process of another session
    assert found == sorted([engine.mapper, engine.own_group, engine.not_cuda])
    assert find_cuda_processes(engine.outsider.pid, Path("/proc"), engine.pattern) == [engine.outsider.pid]
    assert find_cuda_processes(engine.leader.pid, Path("/proc"), r"/dev/no-such-device") == []


def test_the_default_pattern_is_the_gpu_device_files(engine: Engine) -> None:
    pattern = cuda_checkpoint_mode.CUDA_MAPS_PATTERN
    assert re.search(pattern, "/dev/nvidia0") and re.search(pattern, "/dev/nvidiactl")
    assert find_cuda_processes(engine.leader.pid) == []  # a machine without a GPU: nothing maps /dev/nvidia*


def test_an_unreadable_proc_entry_is_passed_over(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "12").mkdir(parents=True)
    (proc / "12" / "stat").write_text("12 (a (b) c) S 1 77 77 0 -1\n")
    (proc / "12" / "maps").write_text("7f00-7f01 rw-s 00000000 00:05 4    /dev/nvidia0\n"
                                      "7f01-7f02 rw-p 00000000 00:00 0 \n")
    (proc / "13").mkdir()  # gone before it could be read
    (proc / "self").mkdir()
    assert find_cuda_processes(77, proc) == [12]
    assert find_cuda_processes(78, proc) == []


def make_run(tmp_path: Path, tool: str = str(TOOL), quiesce: str = "none", port: int = 1) -> CudaCheckpointRun:
    args = argparse.Namespace(log=tmp_path / "server.log", poll_s=0.05, timeout_s=60, images=tmp_path / "images",
                              cuda_checkpoint=tool, mode="cuda_checkpoint", quiesce=quiesce)
    run = CudaCheckpointRun(args, {"port": port, "model": "m", "argv": ["true"]})
    # no engine answers here: the first token after the restore is taken as 0.5 s
    run.wait_token = lambda key, since, record=None: run.out.__setitem__(key, 0.5) or True  # type: ignore[method-assign]
    return run


def actions(calls: list[str]) -> list[tuple[str, int]]:
    return [(c.split()[0].removeprefix("cuCheckpointProcess"), int(c.split()[1])) for c in calls
            if c.startswith("cuCheckpointProcess") and "GetState" not in c]


def test_locks_all_before_checkpointing_any_and_restores_all_before_unlocking_any(
        engine: Engine, fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nvidia-smi lists no PIDs (a VM, a container): the /proc maps fallback finds them
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    real = find_cuda_processes
    monkeypatch.setattr(cuda_checkpoint_mode, "find_cuda_processes",
                        lambda pgid: real(pgid, Path("/proc"), engine.pattern))
    pids = sorted([engine.mapper, engine.own_group])
    for pid in pids:
        fake.process(pid)  # the fake driver knows these two as CUDA processes; not engine.not_cuda
    run = make_run(tmp_path)
    run.timer.proc = engine.leader  # type: ignore[assignment]
    assert run.after_first_token() == 0, run.out.get("error")
    assert actions(fake.calls()) == [("Lock", p) for p in pids] + [("Checkpoint", p) for p in pids] + [
        ("Restore", p) for p in pids] + [("Unlock", p) for p in pids]
    out = run.out
    assert out["gpu_pids"] == pids and out["gpu_pids_source"] == "proc-maps"
    assert "CUDA_ERROR_NOT_INITIALIZED" in out["gpu_pids_skipped"][str(engine.not_cuda)]
    assert set(out["per_process_s"]) == {str(p) for p in pids}
    for per in out["per_process_s"].values():
        assert set(per) == {"get_state", "lock", "checkpoint", "restore", "unlock"}
        assert all(0 < s < 30 for s in per.values())
    for action in ("lock", "checkpoint", "restore", "unlock"):
        assert out[f"{action}_s"] >= sum(out["per_process_s"][str(p)][action] for p in pids) * 0.9
    assert out["tool_start_s"] > 0 and out["restore_to_first_token_s"] == 0.5
    assert out["cuda_checkpoint_tool"]["path"] == str(TOOL)
    assert out["cuda_checkpoint_tool"]["tool"] == "cuda_checkpoint_api"
    assert all(fake.state(p) == "running" for p in pids)


def test_a_failed_checkpoint_puts_every_process_back_to_running(fake: Fake, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pids = [fake.process(7001), fake.process(7002)]
    monkeypatch.setenv("FAKE_LIBCUDA_FAIL", "cuCheckpointProcessCheckpoint:7002")
    run = make_run(tmp_path)
    monkeypatch.setattr(run, "gpu_pids", lambda: (pids, "nvidia-smi"))
    assert run.after_first_token() == exitcodes.DIED
    assert run.out["error"].startswith("cuda-checkpoint --action checkpoint --pid 7002 failed: ")
    assert "CUDA_ERROR_OUT_OF_MEMORY" in run.out["error"]
    assert run.out["after_failed_cuda_checkpoint"] == {"7001": "running", "7002": "running"}
    assert actions(fake.calls()) == [("Lock", 7001), ("Lock", 7002), ("Checkpoint", 7001), ("Checkpoint", 7002),
                                     ("Restore", 7001), ("Unlock", 7001), ("Unlock", 7002)]
    assert "restore_s" not in run.out


class SleepRoutes:
    """vLLM's sleep routes on a loopback port, noting each request with the driver calls made before it."""

    def __init__(self, fake: Fake) -> None:
        seen: list[tuple[str, list[tuple[str, int]]]] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                seen.append((self.path, actions(fake.calls())))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_quiesced_engine_sleeps_before_the_lock_and_wakes_after_the_unlock(
        fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    routes = SleepRoutes(fake)
    pids = [fake.process(7201)]
    run = make_run(tmp_path, quiesce="sleep", port=routes.port)
    run.timer.proc = subprocess.Popen(["sleep", "30"], start_new_session=True)  # type: ignore[assignment]
    monkeypatch.setattr(run, "gpu_pids", lambda: (pids, "nvidia-smi"))
    try:
        assert run.after_first_token() == 0, run.out.get("error")
    finally:
        routes.server.shutdown()
        run.timer.proc.kill()
        run.timer.proc.wait()
    everything = [("Lock", 7201), ("Checkpoint", 7201), ("Restore", 7201), ("Unlock", 7201)]
    assert routes.seen == [("/sleep?level=1", []), ("/wake_up", everything)]
    assert run.out["quiesce"]["asked"] == "sleep" and run.out["quiesce"]["sleep_s"] >= 0
    assert run.out["wake_s"] >= 0 and "sleep_host_bytes" in run.out["quiesce"]


def test_a_listed_process_the_tool_cannot_reach_is_an_error(fake: Fake, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path)
    monkeypatch.setattr(run, "gpu_pids", lambda: ([7101], "nvidia-smi"))  # no state: not CUDA to the driver
    assert run.after_first_token() == exitcodes.DIED
    assert run.out["error"].startswith("cuda-checkpoint --get-state --pid 7101 failed: ")
    assert actions(fake.calls()) == []


def test_no_cuda_process_in_the_group(fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(tmp_path)
    monkeypatch.setattr(run, "gpu_pids", lambda: ([], "proc-maps"))
    assert run.after_first_token() == exitcodes.DIED
    assert run.out["error"].startswith("no process of the engine holds a CUDA context")


def fake_nvidia_smi(tmp_path: Path, driver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nvidia-smi"
    path.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu=driver_version) echo "{driver}";; '
                    '--query-gpu=index,persistence_mode) echo "0, Enabled";; *) echo "0, 1024";; esac\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_gate_takes_the_driver_api_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, "580.159.04", monkeypatch)
    reasons, _ = gates("cuda_checkpoint", cuda_checkpoint=str(TOOL), gpus=[0])
    assert reasons == []
    copy = tmp_path / "copied" / "cuda_checkpoint_api.py"  # shipped without its executable bit
    copy.parent.mkdir()
    copy.write_text(TOOL.read_text())
    copy.chmod(0o644)
    assert gates("cuda_checkpoint", cuda_checkpoint=str(copy), gpus=[0])[0] == []
    assert cuda_checkpoint_argv(str(copy)) == [sys.executable, str(copy)]
    assert cuda_checkpoint_argv(str(TOOL)) == [str(TOOL)]
    assert cuda_checkpoint_argv("cuda-checkpoint") == ["cuda-checkpoint"]
    reasons, _ = gates("cuda_checkpoint", cuda_checkpoint=str(tmp_path / "nowhere.py"), gpus=[0])
    assert reasons == [f"cuda-checkpoint not found ({tmp_path / 'nowhere.py'}): the cuda_checkpoint role installs "
                       "it; without NVIDIA's binary, give the path of nodetools/cuda_checkpoint_api.py"]


def test_the_lock_action_needs_driver_570(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvidia_smi(tmp_path, "550.144.03", monkeypatch)
    reasons, _ = gates("cuda_checkpoint", cuda_checkpoint=str(TOOL), gpus=[0])
    assert reasons == ["cuda-checkpoint's lock/checkpoint/restore/unlock actions need driver >= 570; this node has 550"]


def test_host_ram_gate_counts_the_engines_share_of_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first H200 run refused an engine at gpu-memory-utilization 0.5: the gate counted the whole
    140.4 GiB card against 125 GiB of RAM. The engine's share is what a checkpoint moves."""
    path = tmp_path / "nvidia-smi"
    path.write_text('#!/bin/sh\ncase "$1" in --query-gpu=driver_version) echo "580.159.04";; '
                    '--query-gpu=index,persistence_mode) echo "0, Enabled";; *) echo "0, 143771";; esac\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gates_module, "mem_available_bytes", lambda: 125 * 2**30)
    reasons, facts = gates("cuda_checkpoint", cuda_checkpoint=str(TOOL), gpus=[0], gpu_memory_fraction=1.0)
    assert reasons == ["checkpointing moves up to 140.4 GiB of GPU memory (1 of GPU(s) 0) to host RAM, but only "
                       "125.0 GiB is available"]
    reasons, facts = gates("cuda_checkpoint", cuda_checkpoint=str(TOOL), gpus=[0], gpu_memory_fraction=0.5)
    assert reasons == [] and facts["host_ram_needed_bytes"] == 143771 * 2**20 // 2
