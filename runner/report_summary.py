"""``summary.json``: every trial's row with JSON-typed values, and one aggregate per experiment, mode
and host (how many trials ended how; min, median and max of each numeric metric over the ok
repeats), which report.md's per-mode table shows too.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

__all__ = ["BASE_COLUMNS", "SUMMARY_JSON_FORMAT", "aggregate_rows", "json_value", "summary_json", "typed_rows"]

BASE_COLUMNS = ["trial_id", "experiment", "kind", "mode", "repeat", "host", "engine", "status", "reason",
                "duration_s"]
# Columns that describe a trial rather than measure it: never aggregated.
_FACTOR_COLUMNS = frozenset(BASE_COLUMNS) - {"duration_s"}
_COUNTED = ("ok", "failed", "skipped")  # every other status (interrupted, pending, running) counts as "other"
SUMMARY_JSON_FORMAT = 1


def json_value(value: Any) -> Any:
    """A cell as a JSON value of its own type: ``None`` for a gap (never 0), bool, int, float, str."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:  # most cells (a record's own values): quick
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    import numpy as np  # noqa: PLC0415 - with pandas: only when a report is built
    import pandas as pd  # noqa: PLC0415 - pandas costs 0.5-1 s: only when a report is built
    if value is None or value is pd.NA:
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value if isinstance(value, str) else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _numeric_columns(trials: list[dict[str, Any]]) -> list[str]:
    """Metric columns whose values are all numbers (booleans and text are not aggregated)."""
    columns = dict.fromkeys(c for t in trials for c in t if c not in _FACTOR_COLUMNS)
    out = []
    for col in columns:
        values = [t[col] for t in trials if t.get(col) is not None]
        if values and all(_is_number(v) for v in values):
            out.append(col)
    return out


def typed_rows(columns: list[str], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` (as the trial records hold them: a float stays a float) in the summary's ``columns``,
    each value JSON-typed; a gap is ``None``."""
    return [{col: json_value(row.get(col)) for col in columns} for row in rows]


def aggregate_rows(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per experiment, mode and host (the host only splits where an experiment ran on more
    than one; with one host it is just named): trials counted by status, and per numeric metric the
    ``n``, ``min``, ``median`` and ``max`` over the ok repeats. A failed or skipped trial is counted
    and its reason listed, never aggregated; a metric no ok repeat has is left out, not 0."""
    metrics = sorted(_numeric_columns(trials), key=lambda c: c == "duration_s")  # the trial's wall time last
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for t in trials:
        groups.setdefault((t["experiment"], t["kind"], t["mode"], t["host"]), []).append(t)
    out = []
    for (experiment, kind, mode, host), group in groups.items():
        statuses = [str(t["status"]) for t in group]
        row: dict[str, Any] = {
            "experiment": experiment, "kind": kind, "mode": mode, "host": host, "n_trials": len(group),
            **{f"n_{s}": statuses.count(s) for s in _COUNTED},
            "n_other": sum(s not in _COUNTED for s in statuses),
            "not_ok": [{"trial_id": t["trial_id"], "status": t["status"], "reason": t.get("reason") or ""}
                       for t in group if t["status"] != "ok"],
            "metrics": {},
        }
        ok = [t for t in group if t["status"] == "ok"]
        for col in metrics:
            values = [t[col] for t in ok if t.get(col) is not None]
            if values:
                row["metrics"][col] = {"n": len(values), "min": min(values), "median": statistics.median(values),
                                       "max": max(values)}
        out.append(row)
    return out


def summary_json(columns: list[str], trials: list[dict[str, Any]], campaign: str, notes: list[str],
                 aggregates: list[dict[str, Any]] | None = None) -> str:
    """The document as ``json.dumps(doc, indent=2)`` writes it, byte for byte; ``aggregates`` are
    :func:`aggregate_rows` of ``trials`` (computed here when not given)."""
    head = {"format": SUMMARY_JSON_FORMAT, "campaign": campaign, "notes": [n.replace("**", "") for n in notes],
            "columns": columns}
    tail = {"aggregates": aggregate_rows(trials) if aggregates is None else aggregates}
    if not all(type(v) in _SCALARS for row in trials for v in row.values()):
        return json.dumps({**head, "trials": trials, **tail}, indent=2) + "\n"
    # The trials (10,000 rows of one level in a large campaign) through the json module's C encoder:
    # the indenting encoder is Python, most of a second for them. Its separators give the same text.
    return (json.dumps(head, indent=2)[:-2] + ',\n  "trials": ' + _flat_rows(trials) + ",\n"
            + json.dumps(tail, indent=2)[2:] + "\n")


_SCALARS = frozenset({str, int, float, bool, type(None)})
_ROW_ENCODER = json.JSONEncoder(separators=(",\n      ", ": "))  # a row's items, three levels in


def _flat_rows(rows: list[dict[str, Any]]) -> str:
    """Rows of scalars as the value of a top-level key in ``json.dumps(..., indent=2)``."""
    if not rows:
        return "[]"
    items = ["{\n      " + _ROW_ENCODER.encode(row)[1:-1] + "\n    }" if row else "{}" for row in rows]
    return "[\n    " + ",\n    ".join(items) + "\n  ]"
