"""The startup report's import section: each process's import window to the package, CPU against
disk, the bytecode each start began from, and the chart (``startup_imports.png``).

It reads the startup table's ``_imports`` and ``_pyc_packages`` columns (a trial's
:func:`runner.experiments.startup_imports.import_metrics` and ``pyc_metrics``), which stay out of
``startup.csv``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.markdown import markdown_table

__all__ = ["imports_section"]

_PROCESSES = (("api", "API server"), ("engine", "EngineCore"))
_TOP = 10


def _mb(value: Any) -> float | None:
    return round(value / 1e6, 1) if isinstance(value, int | float) else None


def _costliest(packages: dict[str, float], n: int) -> list[tuple[str, float]]:
    """The ``n`` packages of most seconds: a trial's record is stored with sorted keys, so the order it
    was measured in is gone by the time the report reads it."""
    return sorted(packages.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _summary(rows: list[dict[str, Any]]) -> list[str]:
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    table = []
    for r in rows:
        for process, label in _PROCESSES:
            entry = r["_imports"].get(process)
            if not entry:
                continue
            packages = entry.get("packages") or {}
            table.append({"mode": r["mode"], "repeat": r["repeat"], "process": label, "window_s": entry["seconds"],
                          "profiled_s": entry.get("profiled_s"), "cpu_s": entry.get("cpu_s"),
                          "read_mb": _mb(entry.get("read_bytes")),
                          "costliest": ", ".join(f"{k} {v:.2f}" for k, v in _costliest(packages, 3))})
    return [markdown_table(pd.DataFrame(table))] if table else []


def _packages(rows: list[dict[str, Any]], process: str) -> list[str]:
    """The ``_TOP`` costliest packages of one process, each mode's mean own seconds in the window."""
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    seconds: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        entry = r["_imports"].get(process) or {}
        for package, value in (entry.get("packages") or {}).items():
            seconds.setdefault(package, {}).setdefault(str(r["mode"]), []).append(value)
    if not seconds:
        return []
    modes = list(dict.fromkeys(str(r["mode"]) for r in rows))
    means = {p: {m: sum(v) / len(v) for m, v in by_mode.items()} for p, by_mode in seconds.items()}
    top = sorted(means, key=lambda p: -max(means[p].values()))[:_TOP]
    table = pd.DataFrame([{"package": p, **{m: round(means[p][m], 2) if m in means[p] else None for m in modes}}
                          for p in top])
    return [markdown_table(table)]


def _bytecode(rows: list[dict[str, Any]]) -> list[str]:
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    table, seen = [], set()
    for r in rows:
        if r["mode"] in seen or not isinstance(r.get("_pyc_packages"), dict):
            continue
        seen.add(r["mode"])
        for package, p in r["_pyc_packages"].items():
            reasons = ", ".join(f"{k} {v}" for k, v in (p.get("reasons") or {}).items()) or "-"
            table.append({"mode": r["mode"], "package": package, "modules": p["modules"],
                          "without a usable .pyc": p["modules"] - p["current"], "why": reasons,
                          "folder writable": p.get("writable")})
    return [markdown_table(pd.DataFrame(table))] if table else []


def imports_section(frame: Any, root: Path) -> str:
    """Markdown for the import windows of the ok trials, with the chart; "" when none has a profile."""
    from runner.report_charts import engine_note, import_bars, imports_chart  # noqa: PLC0415 - matplotlib

    if "_imports" not in frame.columns:
        return ""
    ok = frame[frame["status"] == "ok"]
    rows = [r for r in ok.to_dict("records") if isinstance(r.get("_imports"), dict)]
    if not rows:
        return ""
    lines = ["\n### The imports, to the package\n",
             "Each engine process ran with Python's own import profiler (`-X importtime`, one file per process, "
             "`importtime.txt`, kept out of the server log). A process's import window is the API server's start "
             "command to its first log line, the EngineCore's process start to its first line. In it: the seconds "
             "of the imports that finished (`profiled_s`, split by the package whose own modules took them; what "
             "they pulled in of other packages counts for those), the CPU seconds the process spent (close to the "
             "window: the imports are CPU-bound) and the bytes it read from storage (page-cache hits are not "
             "reads).\n"]
    lines += _summary(rows)
    for process, label in _PROCESSES:
        table = _packages(rows, process)
        if table:
            lines += [f"\nThe {_TOP} costliest packages of the {label}'s import window, seconds of their own "
                      "modules (mean of each mode's repeats):\n", *table]
    bytecode = _bytecode(rows)
    if bytecode:
        lines += ["\nThe bytecode each mode's start began from (read before the start, counted packages only): "
                  "modules without a usable `.pyc` and why (`missing`: no file, `stale`: one for another source, "
                  "`other_interpreter`: only another Python's, `no_pycache_dir`: no `__pycache__` there).\n",
                  *bytecode]
    chart = imports_chart(import_bars(ok), root / "startup_imports.png", engine_note(ok, root))
    if chart is not None:
        lines.append(f"\n![imports by package]({chart.name})\n")
    return "\n".join(lines)
