"""Writing results files: atomically (a reader or a full disk never sees half a file) and with the
mode the umask gives (results are shared; mkstemp's 0600 is not what a team wants). Opening a file
a user named (a campaign, ``-e @FILE``, ``-l @FILE``, a log) only where it is a regular file, and
never waiting on it."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from runner.errors import ResultsWriteError

__all__ = ["KERNEL_FILE", "NotRegularFile", "atomic_write_text", "open_regular", "read_at_most", "share_tree"]

KERNEL_FILE = "a kernel file (/proc, /sys)"
_KERNEL_FS = ("/proc", "/sys")

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _umask() -> int:
    # /proc/self/status reads it without changing it (os.umask(0) would, for every thread at once).
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def atomic_write_text(path: Path, text: str) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: a reader
    (or a full disk) never sees half a file. Raises ``ResultsWriteError`` when the disk refuses."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ResultsWriteError(path, exc) from exc
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # what open() would give: results are shared, not 0600
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
        return path
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ResultsWriteError(path, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def share_tree(root: Path) -> None:
    """Give every folder and regular file under ``root`` (itself included) the mode the umask gives,
    as the rest of the results folder has: ansible-runner makes its artefacts 0700/0600. Symlinks
    are left alone; a file that vanished meanwhile is skipped."""
    umask = _umask()
    for folder, _, files in os.walk(root):
        here = Path(folder)
        for path, mode in ((here, 0o777), *((here / name, 0o666) for name in files)):
            with contextlib.suppress(OSError):
                if not path.is_symlink():
                    path.chmod(mode & ~umask)


class NotRegularFile(Exception):
    """The path is no regular file: ``kind`` says what it is ("a directory", "a named pipe (FIFO)", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(kind)


class _NoWaitFile(io.FileIO):
    """A file opened with ``O_NONBLOCK`` whose reads raise ``BlockingIOError`` where ``FileIO``
    returns None: a regular file on a disk never waits, but one in /proc or /sys may (``/proc/kmsg``
    waits for the kernel's next message, forever), and a reader must not treat None as data."""

    _WOULD_WAIT = "reading it would wait for data that may never come (a kernel file such as /proc/kmsg)"

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        if data is None:
            raise BlockingIOError(errno.EAGAIN, self._WOULD_WAIT)
        return data

    def readall(self) -> bytes:
        data = super().readall()
        if data is None:
            raise BlockingIOError(errno.EAGAIN, self._WOULD_WAIT)
        return data

    def readinto(self, buffer: Any) -> int:
        n = super().readinto(buffer)
        if n is None:
            raise BlockingIOError(errno.EAGAIN, self._WOULD_WAIT)
        return n


def open_regular(path: Path) -> io.FileIO:
    """``path`` opened for reading (unbuffered), if it is a regular file; ``NotRegularFile`` if not,
    ``OSError`` if it cannot be opened. It is looked at before it is opened (a device is never
    opened: opening some has effects), opened without waiting (a FIFO swapped in meanwhile) and
    checked again; no read of it ever waits. A file of /proc or /sys is kernel state, never an
    input: reading some changes it (``/proc/kmsg`` hands each message to one reader only)."""
    info = Path(path).stat()
    if not stat.S_ISREG(info.st_mode):  # first: a pipe as /dev/stdin resolves into /proc, and is a pipe
        raise NotRegularFile(_kind(info.st_mode))
    real = os.path.realpath(path)
    if any(real == top or real.startswith(top + "/") for top in _KERNEL_FS):
        raise NotRegularFile(KERNEL_FILE)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(_kind(mode))
        return _NoWaitFile(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_at_most(fh: io.RawIOBase, limit: int) -> bytes:
    """Up to ``limit`` bytes of an unbuffered file, to its end (one read may return less)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        data = fh.read(limit - size)
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
