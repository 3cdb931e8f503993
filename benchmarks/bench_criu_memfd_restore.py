"""Time ``criu restore`` of a process holding one large memfd, with one or more CRIU binaries, and check the
memfd's content after each restore.

Not a test: run as root, ``.venv/bin/python benchmarks/bench_criu_memfd_restore.py --criu stock=/usr/local/sbin/criu
--criu par=/opt/criu-par/sbin/criu [--gib 4] [--repeat 3] [--images /dev/shm/cmr --images /var/tmp/cmr]``.

A Python holder creates a memfd of ``--gib`` GiB, maps it ``MAP_SHARED`` and fills it block by block (1 MiB
blocks, each with its index in its first bytes, so a block restored at the wrong offset is caught), leaving
every 37th block and a few single pages unwritten (holes: the dump then has several pagemap entries) and a
partial last page. It is dumped once per image folder; each CRIU then restores it ``--repeat`` times in turn
(stock, patched, stock, ...), detached, and the memfd is read back through ``/proc/<pid>/fd`` and compared.
Where a folder is not on tmpfs, the page cache is dropped before each restore (``--keep-cache`` keeps it);
a refused drop is said so. Each line: CRIU, folder, restore seconds (criu's wall time), the memfd phase
from CRIU's log (``restore_phases``), whether the content matched. The last lines give the medians.
``CRIU_SHMEM_RESTORE_THREADS`` passes through to CRIU (the patched build's thread count).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runner.parse.snapshot_logs import restore_phases

BLOCK = 1 << 20
PAGE = 4096
TAIL = 123  # a partial last page

# The holder: fills the memfd, writes "<pid> <fd>" to the ready file, then waits to be dumped.
HOLDER = r"""
import mmap, os, sys, time
size, ready = int(sys.argv[1]), sys.argv[2]
fd = os.memfd_create("bench-memfd")
os.ftruncate(fd, size)
m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
body = bytes(range(256)) * (1 << 12)
for i in range(size // (1 << 20)):
    if i % 37 == 5:
        continue
    block = i.to_bytes(8, "little") * 4 + body[32:]
    if i % 53 == 7:  # a one-page hole inside a block
        block = block[:8192] + bytes(4096) + block[12288:]
    m[i << 20:(i + 1) << 20] = block
tail = size % (1 << 20)
if tail:
    m[size - tail:] = bytes([0xA5]) * tail
with open(ready + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {fd}\n")
os.replace(ready + ".tmp", ready)
while True:
    time.sleep(3600)
"""


def expected_block(i: int, body: bytes) -> bytes:
    if i % 37 == 5:
        return bytes(BLOCK)
    block = i.to_bytes(8, "little") * 4 + body[32:]
    if i % 53 == 7:
        block = block[:8192] + bytes(4096) + block[12288:]
    return block


def check(path: str, size: int) -> str:
    """'ok', or where the content first differs."""
    body = bytes(range(256)) * (BLOCK // 256)
    with Path(path).open("rb", buffering=0) as fh:
        for i in range(size // BLOCK):
            got = fh.read(BLOCK)
            if got != expected_block(i, body):
                return f"block {i} differs"
        tail = size % BLOCK
        if tail and fh.read(tail) != bytes([0xA5]) * tail:
            return "tail differs"
        if fh.read(1):
            return "longer than expected"
    return "ok"


def wait_gone(pid: int, timeout: float = 60.0) -> None:
    """Until the pid is free (PID 1 may reap late): a restore needs it back."""
    end = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > end:
            raise SystemExit(f"pid {pid} still taken after {timeout} s")
        time.sleep(0.05)


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mnt, typ = line.split()[:3]
        if str(path).startswith(mnt.rstrip("/") + "/") and len(mnt) > len(best):
            best, kind = mnt, typ
    return kind


def drop_caches() -> str:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "dropped"
    except OSError as exc:
        return f"drop refused ({exc.strerror})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--criu", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--images", action="append", metavar="DIR", help="default /dev/shm/cmr and /var/tmp/cmr")
    ap.add_argument("--keep-cache", action="store_true")
    args = ap.parse_args()
    crius = dict(c.split("=", 1) for c in args.criu)
    size = int(args.gib * 2**30) // BLOCK * BLOCK + TAIL
    folders = [Path(d) for d in (args.images or ["/dev/shm/cmr", "/var/tmp/cmr"])]
    results: dict[tuple[str, str], list[float]] = {}
    print(f"memfd {size} bytes; CRIU_SHMEM_RESTORE_THREADS={os.environ.get('CRIU_SHMEM_RESTORE_THREADS', 'unset')}; "
          f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}", flush=True)
    for folder in folders:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        (folder / "img").mkdir(parents=True)
        ready = folder / "ready"
        t0 = time.monotonic()
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(size), str(ready)], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while not ready.exists():
            if holder.poll() is not None:
                raise SystemExit(f"holder exited {holder.returncode}")
            time.sleep(0.1)
        pid, fd = (int(x) for x in ready.read_text().split())
        first = check(f"/proc/{pid}/fd/{fd}", size)
        print(f"{folder} ({fs_type(folder)}): filled in {time.monotonic() - t0:.1f} s, check before dump: {first}",
              flush=True)
        dump = subprocess.run([next(iter(crius.values())), "dump", "-t", str(pid), "-D", str(folder / "img"),
                               "-o", "dump.log", "-v4"], check=False, capture_output=True, text=True)
        holder.wait()
        if dump.returncode:
            print((folder / "img" / "dump.log").read_text()[-2000:])
            return 1
        wait_gone(pid)
        tmpfs = fs_type(folder) == "tmpfs"
        for _ in range(args.repeat):
            for name, criu in crius.items():
                cache = "tmpfs" if tmpfs else ("warm cache" if args.keep_cache else drop_caches())
                log = f"restore-{name}.log"
                t0 = time.monotonic()
                done = subprocess.run([criu, "restore", "-D", str(folder / "img"), "-d", "-o", log, "-v4"],
                                      check=False, capture_output=True, text=True)
                took = time.monotonic() - t0
                text = (folder / "img" / log).read_text(errors="replace")
                if done.returncode:
                    print(f"{name}: restore failed rc={done.returncode}\n{text[-3000:]}")
                    return 1
                verdict = check(f"/proc/{pid}/fd/{fd}", size)
                phases = restore_phases(text)
                par = [line for line in text.splitlines() if "in parallel:" in line]
                os.kill(pid, signal.SIGKILL)
                wait_gone(pid)
                results.setdefault((name, str(folder)), []).append(took)
                print(f"{name:8} {folder} [{cache}] restore {took:.3f} s, memfd {phases.get('restore_memfd_gib')} GiB "
                      f"in {phases.get('restore_memfd_s')} s ({phases.get('restore_memfd_gb_s')} GB/s), "
                      f"content {verdict}{'; ' + par[-1].split(': ', 1)[-1] if par else ''}", flush=True)
                if verdict != "ok":
                    return 1
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    print("medians (restore s):")
    for (name, folder), values in results.items():
        print(f"  {name:8} {folder}: {statistics.median(values):.3f} ({', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
