"""What of a file is in the page cache, and moving it in or out: the resident fraction, warm, evict, drop.

``evict`` is the polite drop: ``posix_fadvise(DONTNEED)`` on each file (after ``fdatasync``, as
the kernel keeps dirty pages), then the resident fraction read back, so a trial records what it
achieved. It leaves the rest of a shared machine's page cache alone (the libraries and Python
files other users, and the engine's own imports, have there); ``drop`` empties the whole cache,
which is right only where the node is the campaign's alone.

The resident fraction comes from util-linux ``fincore`` (or mincore(2) where fincore is missing);
a cold-start trial records it right before the start, so "page cache dropped" is a measured
state, not an assumption. ``python -m nodetools.pagecache`` is the command line over these.
Stdlib only: this runs on the node.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["drop", "evict", "files_under", "resident_fraction", "warm"]

_CHUNK = 8 << 20


def files_under(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        out += [f for f in (sorted(path.rglob("*")) if path.is_dir() else [path]) if f.is_file()]
    return out


def resident_fraction(paths: list[str]) -> float | None:
    """Share of the files' bytes in the page cache, or None when unknown (no files, no fincore)."""
    files = files_under(paths)
    if not files:
        return None
    if shutil.which("fincore") is None:  # util-linux without fincore (the borrowed H200's image)
        return _resident_fraction_mincore(files)
    done = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE",
                           *map(str, files)], capture_output=True, text=True, check=False)
    resident = size = 0
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            resident += int(parts[0])
            size += int(parts[1])
    return round(resident / size, 4) if size else None


def _resident_fraction_mincore(files: list[Path]) -> float | None:
    """fincore's answer from mincore(2) itself: map each file, ask which of its pages are resident."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    page = mmap.PAGESIZE
    resident = size = 0
    for path in files:
        length = path.stat().st_size
        if length == 0:
            continue
        with path.open("rb") as fh:
            addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fh.fileno(), 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * ((length + page - 1) // page))()
                if libc.mincore(addr, length, vec) != 0:
                    return None
            finally:
                libc.munmap(addr, length)
        resident += min(length, sum(b & 1 for b in vec) * page)
        size += length
    return round(resident / size, 4) if size else None


def warm(paths: list[str]) -> int:
    """Read every file once; returns the bytes read."""
    total = 0
    for f in files_under(paths):
        with f.open("rb", buffering=0) as fh:
            while chunk := fh.read(_CHUNK):
                total += len(chunk)
    return total


def evict(paths: list[str]) -> dict[str, object]:
    """Ask the kernel to drop these files' pages; returns what it achieved:
    ``{"method": "files", "files": N, "bytes": B, "resident_after": fraction or None}``.

    A page that another process holds mapped and locked stays; the fraction read back says so."""
    files = files_under(paths)
    total = 0
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # DONTNEED skips dirty pages
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return {"method": "files", "files": len(files), "bytes": total,
            "resident_after": resident_fraction(paths) if files else None}


def drop() -> None:
    """The whole page cache: sync, then ``echo 3 > /proc/sys/vm/drop_caches`` (root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
