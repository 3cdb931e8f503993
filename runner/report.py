"""Rebuild ``summary.csv`` and ``report.md`` from what is on disk in a results folder.

One row per planned trial: ok, failed, skipped, interrupted, and ``pending`` for trials the plan
holds but no run has reached yet. Metrics of a trial that did not finish ok stay empty (NaN in
pandas, an empty cell in the CSV), never 0.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from runner.errors import RunnerError
from runner.experiments import KINDS
from runner.experiments.base import TrialContext
from runner.store import ResultsStore

__all__ = ["build_report", "markdown_table", "summary_frame"]

logger = logging.getLogger(__name__)

_BASE_COLUMNS = ["trial_id", "experiment", "kind", "mode", "repeat", "host", "engine", "status", "reason",
                 "duration_s"]


def _load_records(store: ResultsStore) -> dict[str, dict[str, Any]]:
    """Every trial record; an ok trial's metrics are collected again from its raw files, so a
    report rebuilt by a newer version of a parser reflects it (stored metrics stay if that fails)."""
    records = {}
    for record in store.iter_trials():
        if "id" not in record:
            continue
        kind = KINDS.get(str(record.get("kind")))
        if record.get("status") == "ok" and kind is not None:
            ctx = TrialContext(record["mode"], record.get("params") or {}, record.get("engine") or {},
                               store.trial_dir(record["id"]), record["host"])
            try:
                record["metrics"] = kind.collect(ctx)
            except Exception:  # the stored metrics of the run stand
                logger.warning("could not collect %s again; keeping its stored metrics", record["id"], exc_info=True)
        records[record["id"]] = record
    return records


def summary_frame(store: ResultsStore, records: dict[str, dict[str, Any]] | None = None,
                  plan: dict[str, Any] | None = None) -> pd.DataFrame:
    plan = plan or store.read_json("plan.json") or {"trials": []}
    records = dict(_load_records(store) if records is None else records)
    rows: list[dict[str, Any]] = []
    for t in plan["trials"]:
        r = records.pop(t["id"], None)
        rows.append(_row(t, r))
    rows.extend(_row(r, r) for r in records.values())  # trials of an earlier plan stay visible
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=_BASE_COLUMNS)
    metric_cols = sorted(c for c in frame.columns if c not in _BASE_COLUMNS)
    # Nullable dtypes: an integer metric with a gap stays an integer, the gap an empty cell.
    return frame[_BASE_COLUMNS + metric_cols].convert_dtypes()


def _row(planned: dict[str, Any], record: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "trial_id": planned["id"], "experiment": planned["experiment"], "kind": planned["kind"],
        "mode": planned["mode"], "repeat": planned["repeat"], "host": planned["host"],
        "engine": (planned.get("engine") or {}).get("kind", "none"),
        "status": "pending", "reason": "not run yet", "duration_s": None,
    }
    if record is not None:
        status = record.get("status", "running")
        row.update(status=status, reason=record.get("reason", ""), duration_s=record.get("duration_s"))
        if status == "running":
            row["reason"] = "run did not finish (process stopped); the next run repeats it"
        if status == "ok":
            row.update({k: v for k, v in (record.get("metrics") or {}).items() if not isinstance(v, dict | list)})
    return row


def markdown_table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "_none_\n"
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        cells = ["" if pd.isna(v) else str(v).replace("|", "\\|").replace("\n", " ") for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _hosts_section(store: ResultsStore) -> str:
    rows = []
    hosts_dir = store.root / "hosts"
    for path in sorted(hosts_dir.glob("*/facts.json")) if hosts_dir.is_dir() else []:
        facts = json.loads(path.read_text())
        gpus = facts.get("gpus") or []
        names = sorted({g.get("name", "?") for g in gpus})
        mem = (facts.get("memory") or {}).get("total_bytes")
        rows.append({
            "host": path.parent.name, "gpus": f"{len(gpus)} x {', '.join(names)}" if gpus else "none",
            "driver": facts.get("driver_version", ""), "kernel": facts.get("kernel", ""),
            "mem_gib": round(mem / 2**30, 1) if mem else None, "numa_nodes": len(facts.get("numa") or []),
        })
    return markdown_table(pd.DataFrame(rows))


def _plan_ordered(plan: dict[str, Any], records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Trial records in plan order (setup-major), then any left from an earlier plan."""
    records = dict(records)
    ordered = [records.pop(t["id"]) for t in plan["trials"] if t["id"] in records]
    return ordered + list(records.values())


def _kind_sections(store: ResultsStore, records: dict[str, dict[str, Any]], plan: dict[str, Any]) -> list[str]:
    """Each kind with a ``KindReport`` gets its CSV (one or more rows per trial) and section."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in _plan_ordered(plan, records):
        kind = KINDS.get(str(record.get("kind")))
        if kind is None or kind.report is None:
            continue
        front = {"trial_id": record["id"], "host": record["host"], "mode": record["mode"],
                 "repeat": record["repeat"], "status": record.get("status"), "reason": record.get("reason", "")}
        rows = kind.report.rows(record) or [{}]
        by_kind.setdefault(kind.name, []).extend({**front, **row} for row in rows)
    parts = []
    for name, rows in by_kind.items():
        spec = KINDS[name].report
        assert spec is not None
        frame = pd.DataFrame(rows).convert_dtypes()
        store.write_text(spec.csv_name, frame.to_csv(index=False))
        if spec.section is not None:
            parts.append(spec.section(frame, store.root))
    return parts


def build_report(root: Path) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``report.md`` under ``root``; return their paths."""
    if not (root / "plan.json").is_file():
        raise RunnerError(f"{root}: not a results folder (no plan.json): run a campaign first")
    store = ResultsStore(root)
    records = _load_records(store)
    plan = store.read_json("plan.json") or {"trials": []}
    frame = summary_frame(store, records, plan)
    csv_path = store.write_text("summary.csv", frame.to_csv(index=False))
    run = store.read_json("run.json") or {}
    counts = frame["status"].value_counts().to_dict() if not frame.empty else {}
    engines = sorted(set(frame["engine"])) if not frame.empty else []
    parts = [
        f"# Campaign {run.get('campaign', root.name)}\n",
        f"- trials: {len(frame)} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'none'})",
        f"- engine: {', '.join(engines) or 'none'}",
        f"- git: {(run.get('git') or {}).get('sha')} (dirty: {(run.get('git') or {}).get('dirty')})",
        f"- tools: {', '.join(f'{k} {v}' for k, v in (run.get('tools') or {}).items())}",
    ]
    if "stand-in" in engines:
        parts.append("- **engine=stand-in**: this campaign rehearsed the tooling; its timings say nothing "
                     "about vLLM.")
    rehearsal = sorted({str(e["rehearsal_model"]) for t in plan["trials"]
                        if (e := t.get("engine") or {}).get("rehearsal_model")})
    if rehearsal:
        parts.append(f"- **random weights** ({', '.join(rehearsal)}, made by nodetools.model_maker): timings, memory "
                     "and caches are the real engine's; its answers, and so the quality checks, mean nothing.")
    parts.extend(_kind_sections(store, records, plan))
    parts.append("\n## Hosts\n")
    parts.append(_hosts_section(store))
    parts.append("\n## Trials\n")
    # Metrics live in the kinds' sections and in summary.csv; this table says what ran and how it ended.
    parts.append(markdown_table(frame[[c for c in _BASE_COLUMNS if c != "reason"]] if not frame.empty else frame))
    not_ok = frame[frame["status"] != "ok"] if not frame.empty else frame
    parts.append("\n## Not ok: failed, skipped, interrupted and pending trials, with reasons\n")
    parts.append(markdown_table(not_ok[["trial_id", "host", "status", "reason"]] if not not_ok.empty else not_ok))
    md_path = store.write_text("report.md", "\n".join(parts) + "\n")
    return csv_path, md_path
