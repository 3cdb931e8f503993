"""The images folder of a dump: emptied, measured, its filesystem named, its page-cache state set.

A restore reads the whole image, so where it lies is part of the result: a disk (read at the
disk's rate once the page cache is dropped), or tmpfs (RAM, which dropping the page cache does not
empty: such a restore is "warm" whatever was asked, and the record says so with the filesystem
type and the image's resident fraction measured right before the restore).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from nodetools.residency import drop, resident_fraction, warm

__all__ = ["CACHE_STATES", "RAM_FILESYSTEMS", "empty", "filesystem", "set_cache", "size_bytes", "stage"]

CACHE_STATES = ("dropped", "warm")
RAM_FILESYSTEMS = ("tmpfs", "ramfs")


def empty(images: Path) -> None:
    if images.exists():
        shutil.rmtree(images)
    images.mkdir(parents=True)


def size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _unescape(field: str) -> str:
    """/proc/self/mounts writes a space, tab, newline and backslash in a path as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem(path: Path, mounts: Path = Path("/proc/self/mounts")) -> dict[str, Any]:
    """The filesystem holding ``path`` (or its nearest existing parent): type, mount point, free bytes."""
    probe = Path(os.path.abspath(path))  # noqa: PTH100 - symbolic links are resolved below, once it exists
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    probe = probe.resolve()
    best: tuple[str, str] = ("/", "unknown")
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = _unescape(fields[1])
        inside = str(probe) == mount or str(probe).startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    stat = os.statvfs(probe)
    return {"fs_type": best[1], "mount": best[0], "free_bytes": stat.f_bavail * stat.f_frsize,
            "in_ram": best[1] in RAM_FILESYSTEMS}


def set_cache(images: Path, state: str) -> dict[str, Any]:
    """Put the image's pages in ``state`` before a restore: ``dropped`` (sync, then the node's whole
    page cache dropped: the restore reads the disk) or ``warm`` (every image file read once); then
    measure the share of the image in the page cache, which is what the restore really met."""
    if state == "dropped":
        drop()
    elif state == "warm":
        warm([str(images)])
    else:
        raise ValueError(f"restore cache state {state!r} is not one of {', '.join(CACHE_STATES)}")
    fraction = resident_fraction([str(images)])  # counted in whole pages: a file's last one may overshoot
    return {"cache": state, "image_resident_fraction": None if fraction is None else min(1.0, fraction)}


def stage(images: Path, staged: Path) -> dict[str, Any]:
    """Copy the images into ``staged`` (a folder in RAM: the restore then reads memory, not the disk);
    the copy is a stage of its own: ``stage_s``, and the bytes and filesystem of where they went."""
    if staged.exists():
        shutil.rmtree(staged)
    started = time.time()
    shutil.copytree(images, staged, symlinks=True)
    return {"stage_s": round(time.time() - started, 4), "staged_bytes": size_bytes(staged),
            "stage_dir": {"path": str(staged), **filesystem(staged)}}
