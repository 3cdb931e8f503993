"""The stand-in's EngineCore process: a real child named like vLLM's, in the stand-in's process
group, that appears before the ``process_start_s`` wait (its imports) and ends with the stand-in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.standin.support import REPO

PARENT = """\
import asyncio, sys, time
from nodetools.standin.cli import parse_serve_args
from nodetools.standin.startup import spawn_engine_core
cfg = parse_serve_args([sys.argv[1], "--standin-process-start-s", "0.4"], {})
started = time.monotonic()
core = asyncio.run(spawn_engine_core(cfg))
print(core.pid, round(time.monotonic() - started, 3), flush=True)
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(60)
"""


def proc_text(pid: int, name: str) -> str:
    return (Path("/proc") / str(pid) / name).read_bytes().replace(b"\0", b" ").decode().strip()


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = proc_text(pid, "stat").rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def start_parent(model: Path, how: str) -> tuple[subprocess.Popen[str], int, float]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(model), how], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, start_new_session=True)
    assert parent.stdout is not None
    pid, waited = parent.stdout.readline().split()
    return parent, int(pid), float(waited)


def test_the_engine_core_is_a_named_child_in_the_group_and_its_imports_follow_its_spawn(model_dir: Path) -> None:
    parent, core, waited = start_parent(model_dir, "stay")
    try:
        assert waited >= 0.4  # process_start_s: the EngineCore's imports, after the process appeared
        assert proc_text(core, "comm") == "VLLM::EngineCor"  # the 15 bytes the kernel keeps, as for vLLM's
        assert proc_text(core, "cmdline").startswith("VLLM::EngineCore")
        assert os.getpgid(core) == parent.pid  # the stand-in's group: a stop of the group stops it
        assert int(proc_text(core, "stat").rsplit(")", 1)[1].split()[1]) == parent.pid
        # A killed stand-in closes the pipe: the EngineCore goes too (no orphan holding anything).
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert gone_within(core, 5)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


def test_a_stand_in_that_exits_reaps_its_engine_core(model_dir: Path) -> None:
    parent, core, _ = start_parent(model_dir, "exit")
    assert parent.wait(timeout=10) == 0
    assert gone_within(core, 5)
