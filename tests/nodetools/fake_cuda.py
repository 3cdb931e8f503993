"""The FAKE libcuda of the cuda-checkpoint tests (fake_libcuda.c, compiled with the machine's C compiler)
and how to run nodetools/cuda_checkpoint_api.py, and nodetools/h2d_copy.py, over it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodetools import cuda_checkpoint_api as api

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "nodetools" / "cuda_checkpoint_api.py"
FAKE_SOURCE = Path(__file__).with_name("fake_libcuda.c")
STATE = {"running": 0, "locked": 1, "checkpointed": 2, "failed": 3}


def run_tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, check=False, timeout=60,
                          env={**os.environ, **(env or {})})


def compile_fake(tmp: Path, name: str, *defines: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) to build the fake libcuda")
    out = tmp / name
    subprocess.run([cc, "-shared", "-fPIC", "-Wall", "-Werror", *defines, "-o", str(out), str(FAKE_SOURCE)],
                   check=True, capture_output=True, text=True)
    return out


class Fake:
    """One test's fake driver: the tool's environment, the pids' states and the call log."""

    def __init__(self, lib: Path, tmp: Path) -> None:
        self.states = tmp / "states"
        self.states.mkdir()
        self.log = tmp / "calls.log"
        self.env = {api.LIBCUDA_ENV: str(lib), "FAKE_LIBCUDA_STATE": str(self.states),
                    "FAKE_LIBCUDA_LOG": str(self.log)}

    def process(self, pid: int, state: str = "running") -> int:
        (self.states / str(pid)).write_text(f"{STATE[state]}\n")
        return pid

    def state(self, pid: int) -> str:
        return {v: k for k, v in STATE.items()}[int((self.states / str(pid)).read_text())]

    def calls(self) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return lines

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_tool(*args, env={**self.env, **env})


def run_h2d_copy(lib: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m nodetools.h2d_copy ARGS`` over the FAKE libcuda ``lib`` (``env``: its FAKE_LIBCUDA_* knobs)."""
    return subprocess.run([sys.executable, "-m", "nodetools.h2d_copy", *args], capture_output=True, text=True,
                          check=False, timeout=120, cwd=REPO,
                          env={**os.environ, "H2D_COPY_LIBCUDA": str(lib), **env})
