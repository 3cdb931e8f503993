"""One run at a time per results folder: an exclusive ``flock`` held for the whole run.

Two runs into one folder would both run every trial, interleave their events and server logs and
lose a ``run.json`` entry. The lock file sits beside the folder (``.<name>.lock``), so ``--fresh``
moving the folder aside never frees it, and it names its holder for the refusal message. The
kernel drops a flock when its holder dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from runner.errors import ResultsLockedError

__all__ = ["ResultsLock"]


class ResultsLock:
    def __init__(self, root: Path) -> None:
        root = root.resolve()
        self.path = root.parent / f".{root.name}.lock"
        self._fd: int | None = None

    def acquire(self, argv: list[str] | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ResultsLockedError(
                f"{self.path.parent / self.path.name[1:-5]} is in use by another run ({holder}); wait for it to "
                "finish, stop it, or give this run another --results folder") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": argv or []}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultsLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "holder unknown"
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {info.get('started_at', '?')}"
