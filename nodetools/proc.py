"""Processes, process groups, ports and signals on the node: what every node tool that starts an
engine needs, in one place.

A process is named by its pid *and* its start time (field 22 of ``/proc/PID/stat``, clock ticks
after boot): a pid the kernel handed to another process since has another start time, so nothing
here signals a process it cannot prove is the one it means. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "PROC", "become_subreaper", "group_io", "group_is_ours", "group_members", "interrupt_on_term", "is_running",
    "launch_env", "port_open", "reap_adopted_zombies", "run_captured", "signal_group", "start_time", "stat_fields",
    "stat_ids", "state", "stop_child_group", "stop_group", "term_as_interrupt", "wait_gone", "write_json_atomic",
]

PROC = Path("/proc")
_ZOMBIE = ("Z", "X", "x")


def stat_fields(pid: int, proc_root: Path = PROC) -> list[str] | None:
    """Fields 3 onwards of ``/proc/PID/stat`` (the command, field 2, may hold spaces and parentheses:
    everything up to its last ``)`` is skipped), or None when the process is gone."""
    try:
        return (proc_root / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def stat_ids(stat: str) -> tuple[int, int]:
    """(process group, session) from a /proc/PID/stat line."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[2]), int(fields[3])


def start_time(pid: int, proc_root: Path = PROC) -> int | None:
    """When the process started (field 22, clock ticks after boot), or None when it is gone."""
    fields = stat_fields(pid, proc_root)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def state(pid: int, proc_root: Path = PROC) -> str:
    """The process state letter (R, S, T, Z...), or '' when it is gone."""
    fields = stat_fields(pid, proc_root)
    return fields[0] if fields else ""


def is_running(pid: int, start: int | None = None, proc_root: Path = PROC) -> bool:
    """The process exists, is not a zombie, and (when ``start`` is given) started at ``start``."""
    fields = stat_fields(pid, proc_root)
    if not fields or fields[0] in _ZOMBIE:
        return False
    return start is None or (len(fields) > 19 and fields[19] == str(start))


def group_members(pgid: int, proc_root: Path = PROC) -> list[tuple[int, int]]:
    """(pid, start time) of every live (not zombie) process of process group ``pgid``."""
    out = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name), proc_root)
        with contextlib.suppress(IndexError, ValueError):
            if fields and fields[0] not in _ZOMBIE and int(fields[2]) == pgid:
                out.append((int(entry.name), int(fields[19])))
    return sorted(out)


def group_is_ours(pgid: int, start: int, proc_root: Path = PROC) -> tuple[bool, str]:
    """(the group recorded with leader start time ``start`` still has live members, why not ours).

    Linux does not hand out a pid again while a process group of that number has members, so: the
    leader there with another start time means the number was reused (not ours); the leader there
    (even a zombie) with our start time, or gone but members that started after it, means ours."""
    leader = start_time(pgid, proc_root)
    if leader is not None and leader != start:
        return False, f"process group {pgid}: pid {pgid} now belongs to a process started later (reused)"
    members = [s for _, s in group_members(pgid, proc_root) if s >= start]
    return bool(members), ""


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process of group ``pgid`` (0: only ask whether any, zombies included, has
    that group id); False when none has. The caller proves first that the group is the one it means."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


IO_FIELDS = ("rchar", "wchar", "read_bytes", "write_bytes")


def group_io(pgid: int, proc_root: Path = PROC) -> dict[str, Any]:
    """The I/O of process group ``pgid``'s live processes from ``/proc/<pid>/io``, per process
    (``"<pid>:<start time>"`` -> ``rchar``, ``wchar``, ``read_bytes``, ``write_bytes``): ``rchar`` /
    ``wchar`` are bytes through read()/write() (files, page-cache hits included, but pipes and
    sockets too), ``read_bytes`` / ``write_bytes`` what the storage layer moved. Per process, so a
    delta between two readings counts only processes alive in both. A KV tier on disk shows here
    whatever its engine's metrics count."""
    processes: dict[str, dict[str, int]] = {}
    for pid, start in group_members(pgid, proc_root):
        try:
            text = (proc_root / str(pid) / "io").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        with contextlib.suppress(KeyError, ValueError):
            processes[f"{pid}:{start}"] = {k: int(fields[k]) for k in IO_FIELDS}
    return {"processes": processes}


def wait_gone(check: Callable[[], bool], timeout_s: float, step_s: float = 0.05) -> bool:
    """Poll ``check()`` (True while something still runs) until it is False or ``timeout_s`` passed;
    True when it ended."""
    deadline = time.monotonic() + timeout_s
    while check():
        if time.monotonic() > deadline:
            return False
        time.sleep(step_s)
    return True


def stop_child_group(proc: subprocess.Popen[Any], grace_s: float) -> None:
    """TERM the process group our child ``proc`` leads, KILL it after ``grace_s``, and KILL the
    stragglers that outlived the leader. Safe by construction: an unreaped child keeps its pid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop_group(pgid: int, grace_s: float = 60) -> None:
    """Stop a process group that is not our child (a restored tree): CONT (a frozen tree must be able
    to die), TERM, wait up to ``grace_s``, KILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)
        os.killpg(pgid, signal.SIGTERM)
    if wait_gone(lambda: bool(group_members(pgid)), grace_s, 0.1):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def launch_env(launch: dict[str, Any], secrets: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with a launch file's ``env`` on top: what the engine (and any
    vLLM command beside it) runs with; with ``secrets`` (:func:`nodetools.secret_env.take_secrets`),
    the values of the names the launch lists in ``secret_env``, for the engine's environment only."""
    env = {**os.environ, **{k: str(v) for k, v in (launch.get("env") or {}).items()}}
    for name in launch.get("secret_env") or []:
        if secrets and name in secrets:
            env[str(name)] = secrets[name]
    return env


def run_captured(argv: list[str], timeout: float, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """Run a tool to its end with its output captured as text; a non-zero exit is the caller's to read."""
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout, env=env)


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (prctl PR_SET_CHILD_SUBREAPER), so a
    tree that ``criu restore -d`` detaches is adopted here, not by PID 1 (which in some containers
    never reaps, and a zombie keeps its pid from the next restore); False where the call failed."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_adopted_zombies(pgid: int, proc_root: Path = PROC) -> list[int]:
    """``waitpid`` every zombie of process group ``pgid`` whose parent is this process (an orphan a
    subreaper adopted); the pids reaped. Only those: a child this process waits for elsewhere
    (``subprocess``) is never a zombie of that group."""
    reaped = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name), proc_root)
        with contextlib.suppress(IndexError, ValueError):
            if fields and fields[0] in _ZOMBIE and int(fields[1]) == os.getpid() and int(fields[2]) == pgid:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(entry.name), os.WNOHANG)
                    reaped.append(int(entry.name))
    return reaped


def port_open(port: int, timeout: float = 0.2, host: str = "127.0.0.1") -> bool:
    """Something accepts TCP connections on ``host:port``."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interrupt_on_term() -> None:
    """SIGTERM raises KeyboardInterrupt: Ansible's task timeout, or the reaper, still stops the engine
    through the tool's own ``finally``."""
    signal.signal(signal.SIGTERM, term_as_interrupt)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write then rename: a killed tool never leaves a torn record behind, and two writers of one
    record (two campaigns on a node) never rename each other's half-written file into place."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
