"""Writing results files: atomically (a reader or a full disk never sees half a file) and with the
mode the umask gives (results are shared; mkstemp's 0600 is not what a team wants)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from runner.errors import ResultsWriteError

__all__ = ["atomic_write_text", "share_tree"]


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
