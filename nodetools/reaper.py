"""The reaper: stop what a killed run left on the node, the tools and engine process groups its leases name.

Every lease under a root (``nodetools.lease``; only one trial's when asked) is stale by the time
this runs: a playbook runs it at the start of a trial's first phase, and the runner works through
one host's trials one at a time, so a lease still there belongs to an attempt whose controller is
gone. For each: the tool that wrote it gets SIGTERM (it stops its engine and ends), every process
group it names gets SIGCONT and SIGTERM, and whatever still runs after the grace time gets
SIGKILL; the engine's container is removed. A process is only ever signalled after its start
time (``/proc/PID/stat`` field 22) proved it is the one the lease recorded: a pid or group id the
kernel has handed out again is reported as skipped and left alone. A lease is removed once nothing
it names runs, after the kernel settings its tool changed for the engine (``restore_on_reap``:
only files under /proc/sys, such as kernel.io_uring_disabled) are put back.

:func:`clear` empties a trial's old folder, first stopping this user's processes whose command line
names a path in it when asked. ``python -m nodetools.reap`` is the command line over both. Stdlib
only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodetools.proc import PROC, group_is_ours, is_running, signal_group, start_time, stat_fields, wait_gone

__all__ = ["clear", "reap", "remove_container", "restore_settings", "users_of"]

KILL_WAIT_S = 10.0


@dataclass
class _Target:
    """A process (``group`` False) or a process group proven to be the one a lease recorded."""

    pid: int
    start: int
    group: bool
    what: str

    def running(self) -> bool:
        if not self.group:
            return is_running(self.pid, self.start)
        return group_is_ours(self.pid, self.start)[0]

    def signal(self, sig: int) -> None:
        if not self.running():  # checked again right before each signal
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.group:
                if sig == signal.SIGTERM:
                    signal_group(self.pid, signal.SIGCONT)  # a frozen (criu, SIGSTOP) tree must be able to die
                signal_group(self.pid, sig)
            else:
                os.kill(self.pid, sig)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _lease_targets(lease: dict[str, Any], name: str) -> tuple[list[_Target], list[str]]:
    targets, skipped = [], []
    owner = lease.get("owner") or {}
    pid, start = owner.get("pid"), owner.get("start")
    tool = str(lease.get("tool") or "node tool")
    if isinstance(pid, int) and pid != os.getpid():
        if isinstance(start, int) and is_running(pid, start):
            targets.append(_Target(pid, start, False, f"{tool} pid {pid} (trial {lease.get('trial')})"))
        elif is_running(pid) and start_time(pid) != start:
            skipped.append(f"{name}: pid {pid} now belongs to another process (reused): left alone")
    for group in lease.get("groups") or []:
        pgid, start = group.get("pgid"), group.get("start")
        what = f"process group {pgid} ({group.get('what') or 'engine'}, trial {lease.get('trial')})"
        if not isinstance(pgid, int) or not isinstance(start, int):
            skipped.append(f"{name}: {what}: no start time recorded, cannot prove it is ours: left alone")
            continue
        ours, why = group_is_ours(pgid, start)
        if ours:
            targets.append(_Target(pgid, start, True, what))
        elif why:
            skipped.append(f"{name}: {why}: left alone")
    return targets, skipped


def _stop(targets: list[_Target], grace_s: float) -> list[_Target]:
    """SIGTERM, up to ``grace_s`` to end, SIGKILL, up to KILL_WAIT_S more; the targets still running."""
    for target in targets:
        target.signal(signal.SIGTERM)
    if not wait_gone(lambda: any(t.running() for t in targets), grace_s):
        for target in targets:
            target.signal(signal.SIGKILL)
        wait_gone(lambda: any(t.running() for t in targets), KILL_WAIT_S)
    return [t for t in targets if t.running()]


def remove_container(name: str) -> bool:
    """``docker rm --force`` the engine's container; True when one was removed."""
    if not name or shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "rm", "--force", name], capture_output=True, text=True, check=False,
                          timeout=120)
    return done.returncode == 0 and bool(done.stdout.strip())


def reap(root: Path, trial: str | None = None, grace_s: float = 30.0) -> dict[str, Any]:
    """Stop what the leases under ``root`` (only ``trial``'s when given) name and remove them."""
    out: dict[str, Any] = {"stopped": [], "skipped": [], "still_running": [], "leases": [], "restored": []}
    leases: list[tuple[Path, dict[str, Any], list[_Target]]] = []
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        lease = _load(path)
        if lease is None:
            out["skipped"].append(f"{path.name}: not a readable lease: removed")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        if trial is not None and lease.get("trial") != trial:
            continue
        targets, skipped = _lease_targets(lease, path.name)
        out["skipped"] += skipped
        leases.append((path, lease, targets))
    everything = [t for _, _, targets in leases for t in targets]
    left = _stop(everything, grace_s)
    out["stopped"] += [t.what for t in everything if t not in left]
    out["still_running"] += [t.what for t in left]
    for path, lease, targets in leases:
        for group in lease.get("groups") or []:
            if remove_container(str(group.get("container") or "")):
                out["stopped"].append(f"container {group['container']}")
        if not any(t in left for t in targets):
            restored, refused = restore_settings(lease, path.name)
            out["restored"] += restored
            out["skipped"] += refused
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            out["leases"].append(path.name)
    return out


# The only files a lease may ask the reaper to write back: kernel settings (the snapshot tool's
# kernel.io_uring_disabled, its transparent huge pages for a restore).
SETTINGS_ROOTS = ("/proc/sys/", "/sys/kernel/mm/transparent_hugepage/")


def restore_settings(lease: dict[str, Any], name: str) -> tuple[list[str], list[str]]:
    """Put back the kernel settings the lease's tool changed for its engine (``restore_on_reap``:
    path, previous value, what; the snapshot tool's kernel.io_uring_disabled and THP), once nothing it
    started runs: (what was restored, what was refused and why)."""
    restored, refused = [], []
    for entry in lease.get("restore_on_reap") or []:
        path, value = str(entry.get("path") or ""), str(entry.get("value") or "")
        what = str(entry.get("what") or path)
        if not path.startswith(SETTINGS_ROOTS) or ".." in Path(path).parts or not value:
            refused.append(f"{name}: restore_on_reap {path!r}: not a kernel setting (/proc/sys, transparent_hugepage) "
                           "with a value: left alone")
            continue
        try:
            Path(path).write_text(f"{value}\n")
        except OSError as exc:
            refused.append(f"{name}: could not put {what} back to {value}: {exc}")
            continue
        restored.append(f"{what} = {value}")
    return restored, refused


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        fields = stat_fields(pid)
        pid = int(fields[1]) if fields else 0
    return pids


def _names(arg: str, folders: tuple[str, ...]) -> bool:
    value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
    return any(value == f or value.startswith(f + "/") for f in folders)


def users_of(folder: Path, proc_root: Path = PROC) -> list[tuple[int, int, str]]:
    """(pid, start time, command) of this user's processes, other than this one and its ancestors,
    whose command line names ``folder`` or a path in it."""
    folders = tuple({str(folder).rstrip("/"), str(folder.resolve()).rstrip("/")})
    skip, uid, found = _ancestors(), os.getuid(), []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        pid = int(entry.name)
        start = start_time(pid, proc_root)
        if start is not None and is_running(pid, start, proc_root) and any(_names(a, folders) for a in argv):
            found.append((pid, start, " ".join(a for a in argv if a)[:200]))
    return sorted(found)


def clear(folder: Path, users: bool, grace_s: float) -> dict[str, Any]:
    """Stop the folder's users (``users``), then remove the folder."""
    out: dict[str, Any] = {"stopped": [], "still_running": [], "cleared": []}
    if users:
        targets = [_Target(pid, start, False, f"pid {pid} ({cmd})") for pid, start, cmd in users_of(folder)]
        left = _stop(targets, grace_s)
        out["stopped"] = [t.what for t in targets if t not in left]
        out["still_running"] = [t.what for t in left]
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
        out["cleared"].append(str(folder))
    elif folder.exists() or folder.is_symlink():
        folder.unlink()
        out["cleared"].append(str(folder))
    return out
