"""Where a start's import seconds go: per process, per package, CPU against disk, and the bytecode.

From a startup trial's raw files: ``importtime.txt`` (Python's own import profile of every engine
process, :mod:`runner.parse.importtime`), the timer's samples of each main process's CPU seconds,
storage reads and profile size (``timings.json`` ``processes[].usage``), the start's boundaries
(:func:`runner.parse.startup_timeline.boundaries`) and what ``prepare`` read of the engine's
bytecode before the start. The API server's imports are its window from the start command to its
first log line (``api_imports_s``), the EngineCore's from its process's start to its first line
(``engine_imports_s``). In each window: the CPU seconds the process spent (so CPU-bound imports
show as CPU close to the window), the bytes it read from storage (disk, not page cache), and the
seconds of each package's own modules among the imports that finished in it; what the profile
names of the window is ``import_profiled_fraction``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.errors import ParseError
from runner.parse.importtime import ImportProfile, read_importtime, top_packages, window
from runner.parse.startup_timeline import boundaries

__all__ = ["IMPORT_COLUMNS", "WINDOWS", "import_metrics", "pyc_metrics"]

# The process whose imports each window holds: (role, the boundary it starts at, the one it ends at).
WINDOWS = {"api": ("api_server", "start", "api_first"), "engine": ("engine_core", "engine_process", "engine_first")}
IMPORT_COLUMNS = ("import_top_package", "import_cpu_s", "import_read_mb", "import_profiled_fraction",
                  "api_import_cpu_s", "engine_import_cpu_s", "pyc_missing_modules")
_USAGE_CPU, _USAGE_READ, _USAGE_PROFILE = 1, 2, 4  # columns of a usage sample (nodetools/procwatch.py)
TOP = 10


def _at(samples: Sequence[Sequence[Any]], start_s: float, t: float, column: int) -> float | None:
    """A cumulative counter of a process at ``t``, linear between the samples; 0 at its start."""
    points = [(start_s, 0.0), *((float(s[0]), float(s[column])) for s in samples if s[column] is not None)]
    if t < points[0][0] or len(points) == 1:
        return None if len(points) == 1 else 0.0
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1] if t - points[-1][0] <= 1.0 else None  # past the last sample: only just


def _process(timings: Mapping[str, Any], role: str) -> Mapping[str, Any] | None:
    return next((p for p in timings.get("processes") or [] if p.get("role") == role), None)


def _window(member: Mapping[str, Any], profile: ImportProfile | None, a: float, b: float) -> dict[str, Any]:
    usage = member.get("usage") or []
    start = float(member.get("start_s") or 0.0)

    def delta(column: int) -> float | None:
        lo, hi = _at(usage, start, a, column), _at(usage, start, b, column)
        return None if lo is None or hi is None else max(0.0, hi - lo)

    cpu = delta(_USAGE_CPU)
    out: dict[str, Any] = {"seconds": round(b - a, 3), "cpu_s": None if cpu is None else round(cpu, 3),
                           "read_bytes": delta(_USAGE_READ)}
    if profile is not None:
        lo, hi = _at(usage, start, a, _USAGE_PROFILE), _at(usage, start, b, _USAGE_PROFILE)
        packages = window(profile, hi, lo or 0.0) if hi is not None else {}
        out["profiled_s"] = round(sum(packages.values()), 3)
        out["packages"] = dict(list(packages.items())[:TOP])
        out["other_packages_s"] = round(out["profiled_s"] - sum(out["packages"].values()), 3)  # past the TOP
    return out


def _profiles(raw: Path) -> dict[int, ImportProfile]:
    path = raw / "importtime.txt"
    if not path.is_file():
        return {}
    try:
        return {p.pid: p for p in read_importtime(path) if p.pid is not None}
    except ParseError:
        return {}


def import_metrics(raw: Path, timings: Mapping[str, Any], log: Mapping[str, Any],
                   first_token_s: float) -> dict[str, Any]:
    """The import columns of a startup row, and ``imports`` (per process: the window's seconds, CPU,
    reads, its packages, and the whole profile's costliest packages) for the report's tables."""
    profiles = _profiles(raw)
    times = boundaries(first_token_s, log, timings)
    detail: dict[str, Any] = {}
    for name, (role, begin, end) in WINDOWS.items():
        member = _process(timings, role)
        if member is None or begin not in times or end not in times:
            continue
        profile = profiles.get(int(member.get("pid") or -1))
        entry = _window(member, profile, times[begin], times[end])
        if profile is not None:
            entry["whole"] = {"total_s": round(profile.total_s, 3), "modules": profile.modules,
                              "top": top_packages(profile, TOP)}
        detail[name] = entry
    if not detail:
        return {}
    out: dict[str, Any] = {"imports": detail}
    for name, entry in detail.items():
        if entry["cpu_s"] is not None:
            out[f"{name}_import_cpu_s"] = round(entry["cpu_s"], 2)
    cpu = [e["cpu_s"] for e in detail.values() if e["cpu_s"] is not None]
    reads = [e["read_bytes"] for e in detail.values() if e["read_bytes"] is not None]
    if cpu:
        out["import_cpu_s"] = round(sum(cpu), 2)
    if reads:
        out["import_read_mb"] = round(sum(reads) / 1e6, 1)
    profiled = [e for e in detail.values() if "profiled_s" in e]
    if profiled:
        seconds = sum(e["seconds"] for e in profiled)
        out["import_profiled_fraction"] = round(min(1.0, sum(e["profiled_s"] for e in profiled) / seconds), 3) \
            if seconds > 0 else None
        totals: dict[str, float] = {}
        for entry in profiled:
            for package, s in entry["packages"].items():
                totals[package] = totals.get(package, 0.0) + s
        if totals:
            out["import_top_package"] = max(totals, key=lambda k: totals[k])
    return out


def pyc_metrics(before: Mapping[str, Any]) -> dict[str, Any]:
    """``pyc_missing_modules`` (the counted packages' modules without a usable .pyc) and, per package,
    why (``pyc_packages``: modules, current, the reasons: missing, stale, other_interpreter,
    no_pycache_dir), from what prepare read before the start."""
    packages = (before.get("bytecode") or {}).get("packages") or {}
    counted = {name: p for name, p in packages.items() if isinstance(p, dict) and p.get("modules")}
    if not counted:
        return {}
    out: dict[str, Any] = {"pyc_missing_modules": sum(p["modules"] - p["current"] for p in counted.values()),
                           "pyc_packages": {name: {"modules": p["modules"], "current": p["current"],
                                                   "reasons": p.get("reasons") or {}, "writable": p.get("writable")}
                                            for name, p in counted.items()}}
    compiled = before.get("bytecode_compiled")
    if isinstance(compiled, dict) and "seconds" in compiled:
        out["bytecode_compile_s"] = compiled["seconds"] if compiled.get("compiled") else 0.0
    return out
