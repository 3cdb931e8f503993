"""What a node tool holds while its engine runs: a lease naming its processes, and a lock on the port.

**Lease.** Every tool that starts an engine writes ``<lease dir>/<trial>.<tool>.<pid>.json`` (the
lease dir is by default ``.leases`` beside the trial's folder, so one per campaign and host):
its own pid and start time, each engine process group it started (group id, its leader's start
time, the engine's container when it has one), the trial id, its work folder, the ports and a
timestamp. It is rewritten (atomically) as groups are added and removed when the tool ends
normally. A lease that outlives its tool, or whose tool lives on after its controller was killed,
is what ``python -m nodetools.reap`` stops.

**Port lock.** ``<lock dir>/gpu-campaign-port-<port>.lock`` (lock dir ``$GPU_CAMPAIGN_LOCK_DIR``,
else ``/tmp``) is held with an exclusive ``fcntl.flock`` for as long as the engine lives: the tool
takes it before it starts anything and passes it to the engine (so an engine orphaned by a killed
tool still holds it), and writes its pid, host, trial and start time into it. A second start
finds it held and stops with one line naming the holder (``PortBusy``).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nodetools.proc import port_open, start_time, write_json_atomic

__all__ = ["LOCK_DIR_ENV", "Claim", "Lease", "PortBusy", "PortLock", "add_claim_options", "claim", "default_lease_dir",
           "default_trial", "lock_path"]

LOCK_DIR_ENV = "GPU_CAMPAIGN_LOCK_DIR"
LEASE_DIR_NAME = ".leases"
VERSION = 1


def _absolute(path: Path) -> Path:
    """Absolute and normalised, symbolic links kept (``resolve`` would follow them)."""
    return Path(os.path.abspath(path))  # noqa: PTH100


def default_lease_dir(workdir: Path) -> Path:
    """``.leases`` beside the trial's folder: the runner's per-host folder of the campaign (the path
    as given, symbolic links kept: the playbook names the same folder the same way)."""
    return _absolute(workdir).parent / LEASE_DIR_NAME


def default_trial(workdir: Path) -> str:
    """The trial id when none is given: the trial folder's name (the runner names it after the trial)."""
    return _absolute(workdir).name


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "-", name) or "trial"


class Lease:
    """The lease file of one tool run; ``add_group`` records an engine group as soon as it starts."""

    def __init__(self, root: Path, tool: str, trial: str, workdir: Path, ports: list[int]) -> None:
        self.root = root
        self.pid = os.getpid()
        self.path = root / f"{_safe(trial)}.{_safe(tool.replace(' ', '-'))}.{self.pid}.json"
        self.data: dict[str, Any] = {
            "version": VERSION, "tool": tool, "trial": trial, "host": socket.gethostname(),
            "workdir": str(workdir.resolve()), "ports": list(ports), "created": time.time(),
            "owner": {"pid": self.pid, "start": start_time(self.pid)}, "groups": []}

    def write(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.data["updated"] = time.time()
        write_json_atomic(self.path, self.data)

    def set_restore_on_reap(self, paths: list[str], entries: list[dict[str, str]]) -> None:
        """Replace what the reaper must put back for ``paths`` (kernel settings this tool changed)
        with ``entries`` (path, previous value, what; none once put back), and rewrite the lease."""
        kept = [e for e in self.data.get("restore_on_reap") or [] if e.get("path") not in paths]
        self.data["restore_on_reap"] = kept + entries
        self.write()

    def add_group(self, pgid: int, what: str, container: str = "") -> None:
        """Record process group ``pgid`` (its leader's start time read now) and rewrite the lease."""
        self.data["groups"] = [g for g in self.data["groups"] if g["pgid"] != pgid]
        self.data["groups"].append({"pgid": pgid, "start": start_time(pgid), "what": what, "container": container})
        self.write()

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def lock_path(port: int, lock_dir: str | Path | None = None) -> Path:
    return Path(lock_dir or os.environ.get(LOCK_DIR_ENV) or "/tmp") / f"gpu-campaign-port-{port}.lock"


class PortBusy(Exception):
    """The engine port is taken: another holder of its lock, or a server that already answers."""


class PortLock:
    """An exclusive, non-blocking ``flock`` on the port's lock file, with its holder written into it."""

    def __init__(self, port: int, trial: str, tool: str, lock_dir: str | Path | None = None) -> None:
        self.port = port
        self.trial = trial
        self.tool = tool
        self.path = lock_path(port, lock_dir)
        self.fd: int | None = None

    def holder(self) -> str:
        """The holder in words, from what it wrote into the lock file."""
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if not info.get("pid"):
            return "an unknown holder"
        alive = start_time(int(info["pid"])) == info.get("pid_start")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.get("started") or 0)))
        words = (f"pid {info['pid']} ({info.get('tool') or 'a node tool'}) on {info.get('host')}, "
                 f"trial {info.get('trial') or '?'}, since {since}")
        return words if alive else f"the engine of {words}; that tool is gone but its engine lives on"

    def _open(self) -> tuple[int, bool]:
        """(descriptor, writable). An existing file is opened without O_CREAT (a sticky /tmp with
        protected_regular refuses O_CREAT on another user's file); one we may not write is still
        lockable read-only, its holder then unnamed."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return os.open(self.path, os.O_RDWR), True
        except FileNotFoundError:
            pass
        except PermissionError:
            return os.open(self.path, os.O_RDONLY), False
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # another user's run must be able to take and name it too
        return fd, True

    def acquire(self) -> None:
        try:
            fd, writable = self._open()
        except OSError as exc:
            raise PortBusy(f"port {self.port}: cannot open its lock file {self.path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PortBusy(f"port {self.port} is locked by {self.holder()} (lock file {self.path}; "
                           "python -m nodetools.reap stops an orphan)") from None
        self.fd = fd
        if writable:
            info = {"pid": os.getpid(), "pid_start": start_time(os.getpid()), "host": socket.gethostname(),
                    "trial": self.trial, "tool": self.tool, "port": self.port, "started": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode(), 0)

    def release(self) -> None:
        """Drop our hold; an engine that inherited the descriptor keeps the lock until it exits."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Claim:
    """What a tool holds for its engines: the port locks and the lease."""

    def __init__(self, locks: list[PortLock], lease: Lease) -> None:
        self.locks = {lock.port: lock for lock in locks}
        self.lease = lease

    def lock_fds(self, port: int) -> tuple[int, ...]:
        """The descriptor an engine on ``port`` inherits (``pass_fds``) to hold the lock as long as it lives."""
        fd = self.locks[port].fd if port in self.locks else None
        return () if fd is None else (fd,)


@contextlib.contextmanager
def claim(tool: str, trial: str, workdir: Path, ports: list[int], lease_dir: Path | None = None,
          lock_dir: str | Path | None = None) -> Iterator[Claim]:
    """Lock every port (``PortBusy`` when one is held or already answers), then write the lease;
    on the way out remove the lease and release the locks. Stop the engines inside the block."""
    locks: list[PortLock] = []
    lease = Lease(lease_dir or default_lease_dir(workdir), tool, trial, workdir, ports)
    try:
        for port in ports:
            lock = PortLock(port, trial, tool, lock_dir)
            lock.acquire()
            locks.append(lock)
            if port_open(port):
                raise PortBusy(f"port {port} already answers: another server is running")
        lease.write()
        yield Claim(locks, lease)
        lease.remove()  # only when the block ended normally: after an error the reaper decides
    finally:
        for lock in locks:
            lock.release()


def add_claim_options(p: argparse.ArgumentParser) -> None:
    """``--trial``, ``--lease-dir`` and ``--lock-dir`` of every tool that starts an engine: what :func:`claim` takes."""
    p.add_argument("--trial", default="", help="the trial id for the lease and the port lock (the folder's name)")
    p.add_argument("--lease-dir", type=Path, default=None, help="the lease folder (.leases beside the trial folder)")
    p.add_argument("--lock-dir", default=None, help="where the port lock files live ($GPU_CAMPAIGN_LOCK_DIR or /tmp)")
