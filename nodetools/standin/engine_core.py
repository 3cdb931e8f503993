"""The stand-in's EngineCore process: what a timer watching the engine's process group sees of vLLM.

vLLM's API server spawns the EngineCore as a child process that names itself ``VLLM::EngineCore``
(setproctitle: the command line, and the 15 bytes of it the kernel keeps as ``comm``). The
stand-in runs its engine in its own process, so this child does no work: it exists, in the
stand-in's process group, with vLLM's name, from its spawn until the stand-in ends (its stdin is
a pipe from the stand-in, closed by the kernel when the stand-in dies; a stop of the whole group
stops it too).
"""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import sys

__all__ = ["ENGINE_CORE_TITLE", "EngineCoreProcess", "start_engine_core_process"]

ENGINE_CORE_TITLE = "VLLM::EngineCore"  # vLLM's setproctitle name; the kernel keeps 15 bytes of it as comm
# The child: names its comm like vLLM's (prctl PR_SET_NAME), then waits for the stand-in's pipe to close.
_ENGINE_CORE_CHILD = """\
import ctypes, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the stand-in, which closes the pipe
try:
    ctypes.CDLL(None).prctl(15, b"VLLM::EngineCore", 0, 0, 0)
except (AttributeError, OSError):
    pass
sys.stdin.buffer.read()
"""


class EngineCoreProcess:
    """The stand-in's EngineCore process: started by :func:`start_engine_core_process`."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 2.0) -> None:
        """Close its pipe (it exits), reap it; kill it if it does not go."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout_s)


def start_engine_core_process() -> EngineCoreProcess:
    """Spawn the EngineCore process; it is stopped (its pipe closed, reaped) when the stand-in exits."""
    proc = subprocess.Popen([ENGINE_CORE_TITLE, "-c", _ENGINE_CORE_CHILD], executable=sys.executable,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    core = EngineCoreProcess(proc)
    atexit.register(core.stop)
    return core
