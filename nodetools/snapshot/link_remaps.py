"""CRIU's link-remap files, kept so that one dump can be restored more than once.

With ``--link-remap``, a file the engine holds under a name that no longer leads to it (a
semaphore of vLLM 0.24.0's in /dev/shm on the H200; here, a file unlinked while another hard link
keeps it) is dumped as a hard link ``link_remap.N`` in the same folder, outside the images (a file
with no link left is copied into the images instead, as a ghost file). The first restore opens it
and unlinks it, so a second restore from the same images fails with "Can't link
dev/shm/link_remap.N -> ..." / "Can't open vma". This module finds the folders of the files the
tree holds unlinked before the dump, copies the ``link_remap.*`` files the dump created there,
and puts back any a restore consumed before the next restore. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from nodetools.proc import PROC, group_members

__all__ = ["LinkRemaps", "deleted_file_dirs"]

PREFIX = "link_remap."
DELETED = " (deleted)"
MAX_SAVED_BYTES = 64 << 20  # semaphores and small files; a large deleted file is CRIU's to handle


def _deleted_targets(pid: int, proc_root: Path) -> set[str]:
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for line in (proc_root / str(pid) / "maps").read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].endswith(DELETED):
                found.add(fields[5][: -len(DELETED)])
    with contextlib.suppress(OSError):
        for fd in (proc_root / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                target = str(fd.readlink())
                if target.endswith(DELETED):
                    found.add(target[: -len(DELETED)])
    return found


def deleted_file_dirs(pgid: int, proc_root: Path = PROC) -> list[str]:
    """Folders holding files that a process of group ``pgid`` has open or mapped after unlinking them
    (real paths only: not /dev/zero's shared mappings, memfd or anonymous inodes)."""
    dirs: set[str] = set()
    for pid, _ in group_members(pgid, proc_root):
        for target in _deleted_targets(pid, proc_root):
            if not target.startswith("/") or target.startswith("/memfd:") or target == "/dev/zero":
                continue
            parent = os.path.dirname(target)  # noqa: PTH120 - a string from /proc, maybe gone
            if os.path.isdir(parent):  # noqa: PTH112
                dirs.add(parent)
    return sorted(dirs)


def _remaps_in(dirs: list[str]) -> set[str]:
    names: set[str] = set()
    for folder in dirs:
        with contextlib.suppress(OSError):
            names |= {str(p) for p in Path(folder).glob(PREFIX + "*")}
    return names


def _copy_owned(src: str | Path, dst: str | Path) -> None:
    """A copy with the mode, times and owner of ``src`` (the restored process opens it as its owner)."""
    shutil.copy2(src, dst)
    with contextlib.suppress(OSError):
        st = Path(src).stat()
        os.chown(dst, st.st_uid, st.st_gid)


class LinkRemaps:
    """Before the dump: ``seen(pgid)``; after it: ``keep(store)``; before each later restore: ``put_back()``."""

    def __init__(self) -> None:
        self.dirs: list[str] = []
        self.before: set[str] = set()
        self.saved: dict[str, str] = {}  # the link_remap file -> its copy
        self.record: dict[str, Any] = {"dirs": [], "kept": [], "put_back": 0}

    def seen(self, pgid: int, proc_root: Path = PROC) -> None:
        self.dirs = deleted_file_dirs(pgid, proc_root)
        self.before = _remaps_in(self.dirs)
        self.record["dirs"] = self.dirs

    def keep(self, store: Path) -> None:
        """Copy the link_remap files the dump made into ``store`` (ownership, mode and times kept)."""
        made = sorted(_remaps_in(self.dirs) - self.before)
        for index, path in enumerate(made):
            with contextlib.suppress(OSError):
                if Path(path).stat().st_size > MAX_SAVED_BYTES:
                    self.record.setdefault("too_big", []).append(path)
                    continue
                store.mkdir(parents=True, exist_ok=True)
                copy = store / f"{index}-{Path(path).name}"
                _copy_owned(path, copy)
                self.saved[path] = str(copy)
        self.record["kept"] = sorted(self.saved)

    def put_back(self) -> int:
        """Restore every kept file a restore consumed; returns how many were put back."""
        count = 0
        for path, copy in self.saved.items():
            if not Path(path).exists():
                _copy_owned(copy, path)
                count += 1
        self.record["put_back"] += count
        return count

    def remove_left(self) -> list[str]:
        """At the end of a trial: the link_remap files still there (a failed restore leaves them)."""
        left = [p for p in self.saved if Path(p).exists()]
        for path in left:
            with contextlib.suppress(OSError):
                Path(path).unlink()
        return left
