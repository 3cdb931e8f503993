"""One run at a time per results folder: a ``flock`` on ``.lock`` inside the folder.

Two runs into one folder would both run every trial, interleave their events and server logs and
lose a ``run.json`` entry. The lock file lives inside the folder, so it is the folder itself (its
device and inode) that is locked, whatever path reaches it: a symbolic link, a bind mount or a
relative path all find the same file (a lock beside the folder, named after the path, let a run
through a bind mount in beside another). ``--fresh`` moves what the folder holds aside, never the
folder and its lock. A run holds the lock exclusively; ``report`` holds it shared, so a report
waits for no one but is refused while a run writes the folder (and a run while a report reads it).
The file names its holder (pid, host, start, command) for the refusal. The kernel drops a flock
when its holder dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import stat
import time
from pathlib import Path
from types import TracebackType

from runner.errors import ResultsLockedError, ResultsWriteError, RunnerError
from runner.results_reader import LOCK_NAME

__all__ = ["ResultsLock", "make_results_folder"]

# The disk refused (exit 4, like a write that fails mid-run); any other failure means the path
# cannot be a results folder (under a file, inside /proc, a name over NAME_MAX): bad input, exit 2.
_DISK_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO})
_HOLDER_BYTES = 8192


def make_results_folder(root: Path) -> Path:
    """Create ``root`` (and its parents) as a folder; a refusal is one line, never a traceback."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _refuse(root, exc, "cannot create the results folder")
    if not root.is_dir():
        raise RunnerError(f"--results {root}: cannot be a results folder: it is not a folder")
    return root


def _refuse(path: Path, exc: OSError, what: str) -> None:
    if exc.errno in _DISK_REFUSALS:
        raise ResultsWriteError(path, exc) from exc
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    raise RunnerError(f"--results {path}: {what}: {exc.strerror or exc}{where}") from exc


class ResultsLock:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / LOCK_NAME
        self._fd: int | None = None
        self._shared = False

    def acquire(self, argv: list[str] | None = None, *, shared: bool = False) -> None:
        """Take the lock (``shared`` for a report) or raise ``ResultsLockedError`` naming the holder."""
        make_results_folder(self.root)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            _refuse(self.root, exc, f"cannot open its lock file {LOCK_NAME}")
            raise  # unreachable: _refuse raises
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunnerError(f"--results {self.root}: its lock file {self.path} is not a regular file: remove it")
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ResultsLockedError(_refusal(self.root, holder, shared)) from None
        except OSError as exc:
            os.close(fd)
            _refuse(self.root, exc, f"cannot lock {LOCK_NAME}")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "argv": [a[:200] for a in (argv or [])][:30],  # within _HOLDER_BYTES
                "role": "report" if shared else "run"}
        with contextlib.suppress(OSError):  # a full disk: the lock holds all the same, naming no holder
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode()[:_HOLDER_BYTES], 0)
        self._fd, self._shared = fd, shared

    def release(self) -> None:
        if self._fd is not None:
            if not self._shared:  # a report leaves the file alone: another report may hold it too
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ResultsLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _refusal(root: Path, holder: dict[str, object], shared: bool) -> str:
    role = holder.get("role")
    if shared:  # a report, refused by a run
        return (f"{root} is in use by a run ({_describe(holder)}); a report of the folder is refused while a run "
                "writes it: the run writes its report when it ends, or run report again then")
    if role == "report":
        return (f"{root} is in use by a report ({_describe(holder)}); it takes seconds: run the same command "
                "again when it has ended")
    return (f"{root} is in use by another run ({_describe(holder)}); wait for it to finish, stop it, or give this "
            "run another --results folder")


def _read_holder(fd: int) -> dict[str, object]:
    try:
        info = json.loads(os.pread(fd, _HOLDER_BYTES, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    return info if isinstance(info, dict) else {}


def _describe(info: dict[str, object]) -> str:
    if not info:
        return "holder unknown"
    argv = info.get("argv")
    command = "python -m runner " + shlex.join(map(str, argv)) if isinstance(argv, list) and argv else ""
    command = "".join(c if c.isprintable() else " " for c in command)  # one line, whatever the argv held
    if len(command) > 300:
        command = command[:297] + "..."
    return (f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, started {info.get('started_at', '?')}"
            + (f": {command}" if command else ""))
