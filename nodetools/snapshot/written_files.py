"""Files the dumped engine held open for writing, put back to their dumped size before each later restore.

CRIU records the size of every regular file a process holds open, except one opened write-only
with O_APPEND (a log the way the timer opens server.log), and refuses a restore when it changed:
``File tmp/run/server.log has bad size 18781 (expect 18073)`` (the H200, by hand: an engine whose
log was opened without O_APPEND wrote on after the first restore, and the second from the same
images failed). Before the dump this module lists the regular files the tree holds open for
writing whose size CRIU checks; right after it (the tree is gone) their sizes are the dumped ones;
before each later restore a file that grew is cut back to that size, the bytes written after the
dump kept beside it in ``FILE.after-dump-N`` (nothing is lost). A file that shrank cannot be put
back: it is recorded, and CRIU's own line says the rest. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from nodetools.proc import PROC, group_members

__all__ = ["WrittenFiles", "size_checked_files"]

MAX_FILES = 256  # an engine holds a handful: more is not what this is for


def _flags(fdinfo: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in fdinfo.read_text().splitlines():
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    return None


def _size_checked(flags: int) -> bool:
    """Open for writing, and not write-only with O_APPEND (which CRIU leaves unchecked)."""
    mode = flags & os.O_ACCMODE
    return mode != os.O_RDONLY and not (mode == os.O_WRONLY and flags & os.O_APPEND)


def size_checked_files(pgid: int, proc_root: Path = PROC) -> list[str]:
    """Regular files a process of group ``pgid`` holds open for writing whose size CRIU checks."""
    found: set[str] = set()
    for pid, _ in group_members(pgid, proc_root):
        with contextlib.suppress(OSError):
            for fd in (proc_root / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = str(fd.readlink())
                    flags = _flags(proc_root / str(pid) / "fdinfo" / fd.name)
                    if (target.startswith("/") and not target.endswith(" (deleted)") and flags is not None
                            and _size_checked(flags) and stat.S_ISREG(Path(target).stat().st_mode)):
                        found.add(target)
    return sorted(found)[:MAX_FILES]


class WrittenFiles:
    """Before the dump: ``seen(pgid)``; right after it: ``dumped()``; before each later restore: ``put_back()``."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.record: dict[str, Any] = {"files": {}, "put_back": []}

    def seen(self, pgid: int, proc_root: Path = PROC) -> None:
        self.sizes = dict.fromkeys(size_checked_files(pgid, proc_root), 0)

    def dumped(self) -> None:
        for path in list(self.sizes):
            try:
                self.sizes[path] = Path(path).stat().st_size
            except OSError:
                del self.sizes[path]  # gone with the tree: nothing CRIU can check
        self.record["files"] = dict(self.sizes)

    def put_back(self) -> int:
        """Cut each file that grew back to its dumped size (the rest kept beside it); how many."""
        count = 0
        for path, size in self.sizes.items():
            try:
                now = Path(path).stat().st_size
            except OSError:
                continue
            if now < size:
                self.record["put_back"].append({"path": path, "shrank_to": now, "dumped": size})
                continue
            if now == size:
                continue
            tail = Path(f"{path}.after-dump-{len(self.record['put_back']) + 1}")
            with open(path, "rb") as src, tail.open("wb") as dst:  # noqa: PTH123 - a path string from /proc
                src.seek(size)
                shutil.copyfileobj(src, dst)
            os.truncate(path, size)
            self.record["put_back"].append({"path": path, "grew_to": now, "dumped": size, "kept": str(tail)})
            count += 1
        return count
