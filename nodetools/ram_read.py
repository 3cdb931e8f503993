"""RAM's read rate: a file in tmpfs (or the page cache) read back by threads (stdlib only, no fio).

    python -m nodetools.ram_read [--target /dev/shm/gpu-campaign-ram-read] [--size-mib 4096]
                                 [--threads 4] [--repeats 5] [--out FILE]

A restore whose image was staged in tmpfs, or sits in the page cache, reads RAM, so its physical
limit needs RAM's read rate; fio measures it where fio is installed, and a node without a package
mirror has none. This writes one file of ``--size-mib`` MiB into ``--target`` (created when
missing), then reads it back with ``--threads`` threads, each its own contiguous slice, in 1 MiB
``os.preadv`` calls into one reused buffer of its own (the call releases the GIL, so the threads
read in parallel): one untimed warm-up pass, then ``--repeats`` timed passes. A pass lasts from the
first thread's start to the last thread's end. The file is written and read back at once, so it is
in RAM on any filesystem: on tmpfs or ramfs it is RAM itself, elsewhere the page cache (the record
names the filesystem and the file's resident fraction after the passes, so a page-cache read that
met the disk shows). The file is removed at the end, also on an error or SIGTERM; a target folder
this run created is removed too.

The warm-up checks every block's stamp (its offset, written into its first 8 bytes) and every pass
its byte count, so a read that returned the wrong bytes or too few cannot pass as a fast one.

Prints one JSON document (also written to ``--out``): the target, its filesystem type and mount,
``in_ram`` (tmpfs or ramfs), the size, threads, repeats, block size, each pass's seconds, their
median, ``gb_s`` (decimal GB/s over the median pass, as fio and the reference campaign quote rates),
``gb_s_max`` (the fastest pass), ``write_s`` and ``resident_fraction``. Errors are one line on
stderr; exit codes from ``nodetools/exitcodes.py``: 0 measured; 2 bad input (arguments, a target
that is not a folder or cannot be written, a size its filesystem or the RAM cannot hold); 3 a
write or read failed, or a pass read fewer or other bytes than were written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.proc import interrupt_on_term, write_json_atomic
from nodetools.residency import resident_fraction
from nodetools.tool_args import ToolParser

__all__ = ["DEFAULT_TARGET", "MAX_REPEATS", "MAX_SIZE_MIB", "MAX_THREADS", "BadInput", "ReadFailed", "main",
           "measure"]

PROG = "ram_read"
DEFAULT_TARGET = "/dev/shm/gpu-campaign-ram-read"
MAX_SIZE_MIB = 65536
MAX_THREADS = 64
MAX_REPEATS = 50
BLOCK = 1 << 20  # fio's 1M blocks in the storage kind's campaigns: one copy per call, the buffer stays in cache
RAM_FILESYSTEMS = ("tmpfs", "ramfs")
RAM_SHARE = 0.5  # the file may take at most this share of the RAM the kernel calls available
ROOM_MARGIN = 64 << 20  # free bytes the filesystem keeps beyond the file
_STAMP = 8
MEMINFO = Path("/proc/meminfo")


class BadInput(Exception):
    """A target or size this node cannot honour."""


class ReadFailed(Exception):
    """A write or read failed, or a pass read fewer or other bytes than were written."""


def _unescape(field: str) -> str:
    """/proc/self/mounts writes a space, tab, newline and backslash in a path as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem(path: Path, mounts: Path = Path("/proc/self/mounts")) -> tuple[str, str]:
    """The type and mount point of the filesystem holding the existing folder ``path``."""
    probe, best = str(path.resolve()), ("/", "unknown")
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return "unknown", "/"
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = _unescape(fields[1])
        if (probe == mount or probe.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
            best = (mount, fields[2])
    return best[1], best[0]


def available_ram(meminfo: Path = MEMINFO) -> int | None:
    """The kernel's MemAvailable in bytes, or None where it does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def room_problem(size: int, free: int, ram: int | None) -> str:
    """Why a file of ``size`` bytes does not fit (``free`` bytes on its filesystem, ``ram`` available), or ""."""
    if size + ROOM_MARGIN > free:
        return (f"--size-mib {size >> 20}: the folder's filesystem has {free / 2**30:.1f} GiB free, the file needs "
                f"{size / 2**30:.1f} GiB and {ROOM_MARGIN >> 20} MiB to spare")
    if ram is not None and size > ram * RAM_SHARE:
        return (f"--size-mib {size >> 20}: the file must stay within {RAM_SHARE:.0%} of the RAM available "
                f"({ram / 2**30:.1f} GiB), so it is read from RAM and the node keeps room")
    return ""


def _write_file(path: Path, size: int) -> float:
    """``size`` bytes of random blocks, each stamped with its offset; returns the seconds it took."""
    block = bytearray(os.urandom(BLOCK))
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for offset in range(0, size, BLOCK):
            block[:_STAMP] = offset.to_bytes(_STAMP, "little")
            view = memoryview(block)[:min(BLOCK, size - offset)]
            while len(view):
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _slices(size: int, threads: int) -> list[tuple[int, int]]:
    """Each thread's byte range: whole blocks, as even as the block count allows."""
    blocks = -(-size // BLOCK)
    edges = [i * blocks // threads * BLOCK for i in range(threads + 1)]
    return [(edges[i], min(edges[i + 1], size)) for i in range(threads)]


def _read_slice(fd: int, first: int, end: int, buffer: bytearray, check: bool) -> int:
    """Read [first, end) into ``buffer`` block by block; with ``check``, each block's stamp too."""
    view, offset = memoryview(buffer), first
    while offset < end:
        got = os.preadv(fd, [view[:min(BLOCK, end - offset)]], offset)
        if got <= 0:
            break
        if check and offset % BLOCK == 0 and got >= _STAMP and \
                int.from_bytes(buffer[:_STAMP], "little") != offset:
            raise ReadFailed(f"the block at byte {offset} holds the stamp of another: the read returned "
                             "other bytes than were written")
        offset += got
    return offset - first


def _pass(fd: int, slices: list[tuple[int, int]], buffers: list[bytearray], check: bool) -> tuple[float, int]:
    """One read of the whole file by every thread at once: (seconds, bytes read)."""
    gate = threading.Barrier(len(slices))
    spans: list[tuple[float, float, int]] = []
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            gate.wait()
            start = time.perf_counter()
            got = _read_slice(fd, *slices[index], buffers[index], check)
            spans.append((start, time.perf_counter(), got))  # list.append is atomic under the GIL
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            errors.append(exc)
            gate.abort()

    workers = [threading.Thread(target=work, args=(i,), name=f"ram_read-{i}") for i in range(len(slices))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:  # the first that is not another thread's broken barrier is the cause
        exc = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        raise exc if isinstance(exc, (ReadFailed, OSError)) else ReadFailed(f"a read failed: {exc}")
    return max(s[1] for s in spans) - min(s[0] for s in spans), sum(s[2] for s in spans)


def _timed_passes(path: Path, size: int, threads: int, repeats: int) -> list[float]:
    slices = _slices(size, threads)
    buffers = [bytearray(BLOCK) for _ in slices]
    fd = os.open(path, os.O_RDONLY)
    try:
        seconds = []
        for number in range(repeats + 1):  # pass 0 is the warm-up, which checks every block's stamp
            took, got = _pass(fd, slices, buffers, check=number == 0)
            if got != size:
                raise ReadFailed(f"pass {number} read {got} of the {size} bytes written")
            if number:
                seconds.append(took)
        return seconds
    finally:
        os.close(fd)


def measure(target: Path, size_mib: int, threads: int, repeats: int, meminfo: Path = MEMINFO) -> dict[str, Any]:
    """Write the file, time the passes, remove it (always); the JSON record."""
    size = size_mib * 2**20
    if threads > size_mib:
        raise BadInput(f"--threads {threads} needs at least {threads} MiB (one 1 MiB block each), not {size_mib}")
    target = Path(os.path.abspath(target))  # noqa: PTH100 - resolved once it exists
    if target.exists() and not target.is_dir():
        raise BadInput(f"--target {target}: not a folder")
    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--target {target}: cannot create it: {exc.strerror or exc}") from exc
    path = target / f"ram_read.{os.getpid()}.dat"
    try:
        fs_type, mount = filesystem(target)
        stat = os.statvfs(target)
        problem = room_problem(size, stat.f_bavail * stat.f_frsize, available_ram(meminfo))
        if problem:
            raise BadInput(problem)
        try:
            write_s = _write_file(path, size)
        except FileExistsError as exc:
            raise BadInput(f"{path} exists already: another ram_read of this pid's number?") from exc
        except OSError as exc:
            raise ReadFailed(f"writing {path}: {exc.strerror or exc}") from exc
        try:
            seconds = _timed_passes(path, size, threads, repeats)
        except OSError as exc:
            raise ReadFailed(f"reading {path}: {exc.strerror or exc}") from exc
        resident = resident_fraction([str(path)])
    finally:
        path.unlink(missing_ok=True)
        if created:
            with contextlib.suppress(OSError):  # something else was put there meanwhile: not ours to remove
                target.rmdir()
    median = statistics.median(seconds)
    return {
        "tool": "nodetools.ram_read", "target": str(target), "fs_type": fs_type, "mount": mount,
        "in_ram": fs_type in RAM_FILESYSTEMS, "size_bytes": size, "size_mib": size_mib, "threads": threads,
        "repeats": repeats, "block_bytes": BLOCK, "write_s": round(write_s, 6),
        "timing": "host monotonic clock from the first thread's start to the last thread's end, after one warm-up",
        "seconds": [round(s, 6) for s in seconds], "seconds_median": round(median, 6),
        "gb_s": round(size / median / 1e9, 3), "gb_s_max": round(size / min(seconds) / 1e9, 3),
        "resident_fraction": resident, "verified": True,
    }


def parser() -> argparse.ArgumentParser:
    p = ToolParser(prog=PROG, description="RAM's read rate: a file in tmpfs (or the page cache) written, then read "
                "back by threads with os.preadv.", epilog="Exit codes: 0 measured; 2 bad input; 3 a write or read "
                "failed, or a pass read fewer or other bytes than were written.")
    p.add_argument("--target", type=Path, default=Path(DEFAULT_TARGET),
                   help="the folder the file goes in (created when missing; tmpfs reads RAM, elsewhere the page cache)")
    p.add_argument("--size-mib", type=int, default=4096, help=f"the file's size, in MiB (1-{MAX_SIZE_MIB})")
    p.add_argument("--threads", type=int, default=4, help=f"threads reading a slice each (1-{MAX_THREADS})")
    p.add_argument("--repeats", type=int, default=5, help=f"timed passes after the warm-up (1-{MAX_REPEATS})")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    for name, value, high in (("--size-mib", args.size_mib, MAX_SIZE_MIB), ("--threads", args.threads, MAX_THREADS),
                              ("--repeats", args.repeats, MAX_REPEATS)):
        if not 1 <= value <= high:
            p.error(f"{name} must be 1-{high}, not {value}")
    interrupt_on_term()  # a stopped run still removes its file (measure's finally)
    try:
        record = measure(args.target, args.size_mib, args.threads, args.repeats)
    except BadInput as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return exitcodes.BAD_INPUT
    except ReadFailed as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return exitcodes.DIED
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: stopped by a signal; the file was removed\n")
        return exitcodes.TIMEOUT
    if args.out is not None:
        try:
            write_json_atomic(args.out, record)
        except OSError as exc:
            sys.stderr.write(f"{PROG}: cannot write {args.out}: {exc.strerror or exc}\n")
            return exitcodes.BAD_INPUT
    sys.stdout.write(json.dumps(record, indent=1) + "\n")
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
