"""cuda_checkpoint_api.py and the snapshot experiment's cuda_checkpoint mode on a real NVIDIA GPU.

Skipped without one (CI). The CUDA processes are tests/nodetools/cuda_holder.py: ctypes over
libcuda, device memory holding a known pattern, read back after the restore. On a GPU node, from
the repository root (this runs with the system's Python and pytest alone; no conftest needed):

    python3 -m pytest --noconftest -p no:cacheprovider tests/nodetools/test_snapshot_cuda_checkpoint_gpu.py
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodetools import cuda_checkpoint_api as api
from nodetools.snapshot.cuda_checkpoint_mode import find_cuda_processes

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "nodetools" / "cuda_checkpoint_api.py"
HOLDER = Path(__file__).with_name("cuda_holder.py")


def _gpu() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    try:
        api.Driver()
    except (api.NoDriver, api.CudaError) as exc:
        return str(exc)
    return ""


pytestmark = pytest.mark.skipif(bool(_gpu()), reason=f"needs an NVIDIA GPU with driver >= 570: {_gpu()}")


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, check=False, timeout=300)


def gpu_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


class Holder:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HOLDER), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["ready"], line
        self.pids = [int(p) for p in line[1].split(",")]

    def finish(self) -> str:
        out, _ = self.proc.communicate("go\n", timeout=120)
        return out.strip()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        if holder.proc.poll() is None:
            os.killpg(holder.proc.pid, 9)
            holder.proc.wait()


def test_checkpoint_and_restore_keep_the_device_memory(holders: list[Holder]) -> None:
    holders.append(holder := Holder("context", "1024"))
    pid = str(holder.pids[0])
    assert tool("--get-state", "--pid", pid).stdout == "running\n"
    refused = tool("--action", "checkpoint", "--pid", pid)
    assert refused.returncode == 1 and "CUDA_ERROR_ILLEGAL_STATE" in refused.stderr
    before = gpu_used_mib()
    for action, state in (("lock", "locked"), ("checkpoint", "checkpointed")):
        done = tool("--action", action, "--pid", pid, *(["--timeout", "10000"] if action == "lock" else []))
        assert done.returncode == 0, done.stderr
        assert tool("--get-state", "--pid", pid).stdout == f"{state}\n"
    assert gpu_used_mib() < before - 900  # the 1 GiB went to host memory
    assert int(tool("--get-restore-tid", "--pid", pid).stdout) > 0
    for action, state in (("restore", "locked"), ("unlock", "running")):
        done = tool("--action", action, "--pid", pid)
        assert done.returncode == 0, done.stderr
        assert tool("--get-state", "--pid", pid).stdout == f"{state}\n"
    assert gpu_used_mib() > before - 100
    assert tool("--toggle", "--pid", pid).returncode == 0
    assert tool("--get-state", "--pid", pid).stdout == "checkpointed\n"
    assert tool("--toggle", "--pid", pid).returncode == 0
    assert tool("--get-state", "--pid", pid).stdout == "running\n"
    assert holder.finish() == "intact"


def test_the_maps_fallback_finds_the_cuda_child_not_its_parent(holders: list[Holder]) -> None:
    holders.append(tree := Holder("tree", "256"))
    holders.append(loaded := Holder("load"))
    parent, child = tree.pids
    assert find_cuda_processes(tree.proc.pid) == [child]  # the parent never initialised CUDA
    assert find_cuda_processes(loaded.proc.pid) == []  # libcuda loaded, not initialised: maps no device
    assert tool("--get-state", "--pid", str(parent)).returncode == 1
    assert tree.finish() == "intact"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("nvidia_smi_lists_pids", [True, False])
def test_the_snapshot_experiment_checkpoints_a_vllm_shaped_engine(tmp_path: Path, nvidia_smi_lists_pids: bool) -> None:
    port = free_port()
    launch = tmp_path / "launch.json"
    launch.write_text(json.dumps({"argv": [sys.executable, str(HOLDER), "serve", str(port), "2048"], "env": {},
                                  "port": port, "model": "m", "gpus": [0]}))
    env = dict(os.environ)
    if not nvidia_smi_lists_pids:  # as in VMs and containers where nvidia-smi shows no processes
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        real = shutil.which("nvidia-smi")
        (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\ncase "$1" in --query-compute-apps*) exit 0;; esac\n'
                                            f'exec {real} "$@"\n')
        (bin_dir / "nvidia-smi").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    out = tmp_path / "timings.json"
    done = subprocess.run([sys.executable, "-m", "nodetools.snapshot", "measure", "--mode", "cuda_checkpoint",
                           "--launch", str(launch), "--log", str(tmp_path / "server.log"), "--out", str(out),
                           "--images", str(tmp_path / "images"), "--cuda-checkpoint", str(TOOL),
                           "--timeout-s", "300"], capture_output=True, text=True, check=False, env=env, cwd=REPO,
                          timeout=600)
    timings = json.loads(out.read_text())
    assert done.returncode == 0, (done.stderr, timings)
    assert timings["gpu_pids_source"] == ("nvidia-smi" if nvidia_smi_lists_pids else "proc-maps")
    assert len(timings["gpu_pids"]) == 1  # the worker; the HTTP server holds no CUDA context
    assert sum(timings["gpu_mem_mib_while"]) < sum(timings["gpu_mem_mib_before"]) - 1900
    assert sum(timings["gpu_mem_mib_after"]) > sum(timings["gpu_mem_mib_before"]) - 100
    for key in ("lock_s", "checkpoint_s", "restore_s", "unlock_s", "restore_to_first_token_s", "tool_start_s"):
        assert timings[key] > 0
    sys.stdout.write(json.dumps({k: timings[k] for k in timings if k.endswith("_s") or k.startswith("gpu")}) + "\n")


def test_libcuda_exports_what_the_tool_needs() -> None:
    lib = ctypes.CDLL(os.environ.get(api.LIBCUDA_ENV) or api.LIBCUDA)
    assert all(hasattr(lib, name) for name in api.CHECKPOINT_SYMBOLS)
