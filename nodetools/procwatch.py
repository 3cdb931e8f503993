"""Watch an engine's process group come to life: which processes appear, when each began, what it is.

vLLM starts as several processes of one group: the API server (the group's leader), the
EngineCore it spawns (``VLLM::EngineCore`` once it names itself), a model-inspection subprocess
on a cold cache, multiprocessing's resource tracker, TP workers, and the compilers a kernel JIT
runs. Each :meth:`GroupWatcher.poll` lists ``/proc`` and reads only the processes it has not
seen (plus the names of members not yet identified), so a poll costs one directory read on a
quiet node. A member's start comes from ``/proc/PID/stat`` (clock ticks after boot) through the
boot-time clock sampled at the start command, so it is exact to the tick however rarely the
watcher polls; what a poll can miss is a process that lived and died between two polls.

The engine's main processes (API server, EngineCore, workers) are also sampled every
``USAGE_EVERY_S`` while they start: their CPU seconds (``/proc/PID/stat``), the bytes they read
from storage and through read calls (``/proc/PID/io``), and, where the engine's import profile is
taken (:mod:`nodetools.import_profile`), the size of its file: so the runner can say what a
process's imports cost in CPU and disk, and which of them came before which log line.
Stdlib only: this runs on the node.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodetools.proc import PROC, stat_fields

__all__ = ["MAX_MEMBERS", "USAGE_EVERY_S", "GroupWatcher", "Member", "clock_sample", "role_of"]

MAX_MEMBERS = 200  # processes recorded one by one; more are only counted (a JIT's compilers)
USAGE_EVERY_S = 0.5  # the main processes' CPU, reads and profile size are sampled this often
MAX_USAGE_SAMPLES = 7200  # an hour of a start at USAGE_EVERY_S
_SAMPLED_ROLES = ("api_server", "engine_core", "worker")
_CMDLINE_CHARS = 200
_COMPILERS = ("cc1", "cc1plus", "gcc", "g++", "cc", "c++", "clang", "ninja", "nvcc", "ptxas", "cicc", "ld",
              "as", "fatbinary", "nvlink")


def clock_sample() -> dict[str, Any]:
    """Wall, monotonic and boot-time clocks read together, the local time zone's offset, and the
    clock tick: what maps the timer's seconds and ``/proc`` start times to the wall clock."""
    boot = getattr(time, "CLOCK_BOOTTIME", None)
    wall = time.time()
    return {
        "wall": wall,
        "monotonic": time.monotonic(),
        "boottime": time.clock_gettime(boot) if boot is not None else None,
        "utc_offset_s": time.localtime(wall).tm_gmtoff,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
    }


def role_of(name: str, cmdline: str, leader: bool) -> str:
    """What a member of a vLLM group is, from its ``comm`` and command line."""
    if "EngineCor" in name or "EngineCore" in cmdline:
        return "engine_core"
    if "Worker" in name or "VllmWorker" in cmdline or "Worker_TP" in cmdline:
        return "worker"
    if "vllm.model_executor.models.registry" in cmdline:
        return "model_inspect"
    if "resource_tracker" in cmdline:
        return "resource_tracker"
    if leader:
        return "api_server"
    if name in _COMPILERS:
        return "compiler"
    return "other"


@dataclass
class Member:
    pid: int
    ppid: int
    start_ticks: int
    start_s: float | None  # seconds after the start command
    seen_s: float  # when a poll first saw it
    name: str = ""
    cmdline: str = ""
    role: str = "other"
    gone_s: float | None = None  # the first poll that no longer saw it
    # [seconds after the start command, CPU seconds, bytes read from storage, bytes read by calls,
    #  bytes of its import profile (None when none is taken)], every USAGE_EVERY_S while it starts
    usage: list[list[float | None]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {"pid": self.pid, "ppid": self.ppid, "start_s": self.start_s, "seen_s": round(self.seen_s, 3),
               "gone_s": None if self.gone_s is None else round(self.gone_s, 3), "name": self.name,
               "cmdline": self.cmdline, "role": self.role}
        if self.usage:
            out["usage"] = self.usage
        return out


@dataclass
class GroupWatcher:
    """The members of process group ``pgid``, as the polls saw them.

    ``clock`` is :func:`clock_sample` taken at the start command; times are seconds after it."""

    pgid: int
    clock: dict[str, Any]
    proc_root: Path = PROC
    profile_dir: Path | None = None  # where the engine's per-process import profiles grow, if taken
    members: dict[int, Member] = field(default_factory=dict)
    dropped: int = 0  # members beyond MAX_MEMBERS, counted only
    _foreign: set[int] = field(default_factory=set)
    _counted: set[int] = field(default_factory=set)
    _sampled_at: float = -USAGE_EVERY_S

    def _now(self) -> float:
        return time.monotonic() - float(self.clock["monotonic"])

    def _start_s(self, ticks: int) -> float | None:
        boot, tck = self.clock.get("boottime"), self.clock.get("clk_tck")
        if boot is None or not tck:
            return None
        return round(ticks / float(tck) - float(boot), 3)

    def _read(self, name: str, pid: int) -> str:
        try:
            return (self.proc_root / str(pid) / name).read_bytes()[:4096].replace(b"\0", b" ").decode(
                "utf-8", "replace").strip()
        except OSError:
            return ""

    def _name(self, member: Member) -> None:
        member.name = self._read("comm", member.pid) or member.name
        member.cmdline = (self._read("cmdline", member.pid) or member.cmdline)[:_CMDLINE_CHARS]
        member.role = role_of(member.name, member.cmdline, member.pid == self.pgid)

    def _usage(self, member: Member, now: float) -> None:
        fields = stat_fields(member.pid, self.proc_root)
        try:
            cpu = (int(fields[11]) + int(fields[12])) / float(self.clock.get("clk_tck") or 100)  # type: ignore[index]
        except (TypeError, IndexError, ValueError):
            return  # gone
        io = dict(line.split(":", 1) for line in self._read("io", member.pid).splitlines() if ":" in line)
        size: float | None = None
        if self.profile_dir is not None:
            try:
                size = (self.profile_dir / f"stderr-{member.pid}.txt").stat().st_size
            except OSError:
                size = 0
        member.usage.append([round(now, 3), round(cpu, 2), _int(io.get("read_bytes")), _int(io.get("rchar")), size])

    def sample(self, now: float | None = None, force: bool = False) -> None:
        """The main processes' CPU, reads and profile size, at most every USAGE_EVERY_S (``force``: now,
        at a moment the record marks, such as the log's first byte: the API server's imports end)."""
        now = self._now() if now is None else now
        if now - self._sampled_at < USAGE_EVERY_S and not force:
            return
        self._sampled_at = now
        for member in self.members.values():
            if member.gone_s is None and member.role in _SAMPLED_ROLES and len(member.usage) < MAX_USAGE_SAMPLES:
                self._usage(member, now)

    def poll(self) -> None:
        now = self._now()
        try:
            pids = {int(e) for e in os.listdir(self.proc_root) if e.isdigit()}  # noqa: PTH208 - names only, every poll
        except OSError:
            return
        self._foreign &= pids  # a pid the kernel hands out again is looked at again
        for pid, member in self.members.items():
            if member.gone_s is None and pid not in pids:
                member.gone_s = now
            elif member.gone_s is None and member.role in ("other", "api_server"):
                self._name(member)  # a spawned child names itself once its imports are done
        for pid in pids - self._foreign - self.members.keys() - self._counted:
            fields = stat_fields(pid, self.proc_root)
            try:
                pgid, ppid, ticks = int(fields[2]), int(fields[1]), int(fields[19])  # type: ignore[index]
            except (TypeError, IndexError, ValueError):
                continue  # gone between the listing and the read
            if pgid != self.pgid:
                self._foreign.add(pid)
            elif len(self.members) >= MAX_MEMBERS:
                self._counted.add(pid)
                self.dropped += 1
            else:
                member = Member(pid, ppid, ticks, self._start_s(ticks), now)
                self._name(member)
                self.members[pid] = member
        self.sample(now)

    def roles(self) -> dict[int, str]:
        return {pid: member.role for pid, member in self.members.items()}

    def records(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in sorted(self.members.values(), key=lambda m: (m.start_ticks, m.pid))]


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except ValueError:
        return None
