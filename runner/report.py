"""Rebuild ``summary.csv``, ``summary.json`` and ``report.md`` from what is on disk in a results folder.

One row per planned trial: ok, failed, skipped, interrupted, and ``pending`` for trials the plan
holds but no run has reached yet. Metrics of a trial that did not finish ok stay empty (NaN in
pandas, an empty cell in the CSV, ``null`` in the JSON), never 0. ``summary.json`` holds the same
rows with typed values, plus one aggregate per experiment, mode and host: how many trials ended
how, and the min, median and max of each numeric metric over the ok repeats only.

Everything here is written with plain ``open()`` (then renamed into place), so the files get the
permissions the umask gives and can be shared like any other file.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runner.errors import RunnerError
from runner.experiments import KINDS
from runner.experiments.base import TrialContext
from runner.files import atomic_write_text
from runner.markdown import markdown_rows
from runner.overhead import overhead_line
from runner.provenance import collect_stamp
from runner.records import TrialRecord
from runner.report_summary import BASE_COLUMNS as _BASE_COLUMNS
from runner.report_summary import aggregate_rows, json_value, summary_json, typed_rows
from runner.report_table import Table, positional
from runner.store import ResultsStore

__all__ = ["aggregate_rows", "build_report", "json_value", "typed_rows"]

logger = logging.getLogger(__name__)


def _load_records(store: ResultsStore) -> dict[str, TrialRecord]:
    """Every trial record; an ok trial's metrics are collected again from its raw files unless this
    very code collected them (``collected_with``, runner/provenance.py), so a report rebuilt by a
    newer version of a parser reflects it and one rebuilt by the same is quick. Stored metrics stay where that fails,
    and those it cannot recompute stay beside the new ones (a results folder copied without its
    largest logs, e.g. a CRIU dump.log, keeps what the run read from them)."""
    records = {}
    stamp = collect_stamp()
    for record in store.iter_trials():
        if "id" not in record:
            continue
        kind = KINDS.get(str(record.get("kind")))
        # Collected by this very code already (the stamp): the stored metrics are what a collect would give.
        if record.get("status") == "ok" and kind is not None and record.get("collected_with") != stamp:
            # The kind's collect opens the raw files: a FIFO or a link planted there is moved aside first.
            store.reader.only_files(store.trial_dir(record["id"]) / "raw")
            ctx = TrialContext(record["mode"], record.get("params") or {}, record.get("engine") or {},
                               store.trial_dir(record["id"]), record["host"])
            try:
                with _cycle_collector(on=True):  # a parser may leave cycles: freed as it goes
                    record["metrics"] = {**(record.get("metrics") or {}), **kind.collect(ctx)}
            except Exception:  # the stored metrics of the run stand
                logger.warning("could not collect %s again; keeping its stored metrics", record["id"], exc_info=True)
        records[record["id"]] = record
    return records


def _summary_table(rows: list[dict[str, Any]]) -> Table:
    """The summary's columns (the base ones, then every metric sorted) and cells, typed per column as
    pandas' ``convert_dtypes`` typed them (:class:`Table`)."""
    metrics = sorted({c for row in rows for c in row} - set(_BASE_COLUMNS))
    return Table(rows, _BASE_COLUMNS + metrics)


def _summary_rows(store: ResultsStore, records: dict[str, TrialRecord] | None = None,
                  plan: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    plan = plan or store.read_plan() or {"trials": []}
    records = dict(_load_records(store) if records is None else records)
    rows: list[dict[str, Any]] = []
    for t in plan["trials"]:
        r = records.pop(t["id"], None)
        rows.append(_row(t, r))
    rows.extend(_row(r, r) for r in records.values())  # trials of an earlier plan stay visible
    return rows


def _row(planned: dict[str, Any], record: TrialRecord | None) -> dict[str, Any]:
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


def _engine_notes(engines: list[str], plan: dict[str, Any]) -> list[str]:
    notes = []
    if "stand-in" in engines:
        notes.append("**engine=stand-in**: this campaign rehearsed the tooling; its timings say nothing about vLLM.")
    rehearsal = sorted({str(e["rehearsal_model"]) for t in plan["trials"]
                        if (e := t.get("engine") or {}).get("rehearsal_model")})
    if rehearsal:
        notes.append(f"**random weights** ({', '.join(rehearsal)}, made by nodetools.model_maker): timings, memory "
                     "and caches are the real engine's; its answers, and so the quality checks, mean nothing.")
    dummy = sum(1 for t in plan["trials"] if _load_format(t.get("engine") or {}) == "dummy")
    if dummy:
        some = "" if dummy == len(plan["trials"]) else f" ({dummy} of {len(plan['trials'])} trials)"
        notes.append(f"**dummy weights**{some} (--load-format dummy): vLLM made random weights on the GPU and read "
                     "none from disk, so no figure here includes loading weights; compute, KV cache and offload "
                     "timings are the real engine's.")
    return notes


def _load_format(engine: dict[str, Any]) -> str:
    args = engine.get("args") or {}
    return str(args.get("load-format") or args.get("load_format") or "")


def _fmt(value: float | int) -> str:
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1000):
        return str(int(value))
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return positional(float(value), 4)


def _cell(stats: dict[str, Any] | None, n_ok: int) -> str:
    if not stats:
        return ""
    text = _fmt(stats["median"])
    if stats["min"] != stats["max"]:
        text += f" [{_fmt(stats['min'])}, {_fmt(stats['max'])}]"
    if stats["n"] < n_ok:
        text += f" n={stats['n']}"
    return text


def _aggregate_section(rows: list[dict[str, Any]]) -> str:
    """Per experiment one table (from :func:`aggregate_rows`): a column per mode (and host where there
    are several), the counts, then ``median [min, max]`` of every numeric metric over the ok repeats."""
    if not rows:
        return "_none_\n"
    several_hosts = len({r["host"] for r in rows}) > 1
    parts = []
    by_experiment: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_experiment.setdefault(row["experiment"], []).append(row)
    for experiment, groups in by_experiment.items():
        labels = [f"{g['mode']} @ {g['host']}" if several_hosts else str(g["mode"]) for g in groups]
        table: list[dict[str, str]] = [
            {"": "trials ok", **{lab: str(g["n_ok"]) for lab, g in zip(labels, groups, strict=True)}},
            {"": "failed", **{lab: str(g["n_failed"]) for lab, g in zip(labels, groups, strict=True)}},
            {"": "skipped", **{lab: str(g["n_skipped"]) for lab, g in zip(labels, groups, strict=True)}},
        ]
        if any(g["n_other"] for g in groups):
            table.append({"": "interrupted, pending",
                          **{lab: str(g["n_other"]) for lab, g in zip(labels, groups, strict=True)}})
        metrics = list(dict.fromkeys(m for g in groups for m in g["metrics"]))
        table.extend({"": m, **{lab: _cell(g["metrics"].get(m), g["n_ok"]) for lab, g in zip(labels, groups,
                                                                                             strict=True)}}
                     for m in metrics)
        kind = groups[0]["kind"]
        parts.append(f"\n### {experiment}" + (f" ({kind})" if kind != experiment else "") + "\n")
        columns = ["", *labels]
        parts.append(markdown_rows(columns, [[row.get(c) for c in columns] for row in table]))
    return "\n".join(parts)


def _hosts_section(store: ResultsStore) -> str:
    rows = []
    for host in store.hosts():
        facts = store.read_facts(host)
        if facts is None:
            continue
        gpus = facts.get("gpus") or []
        names = sorted({g.get("name", "?") for g in gpus})
        mem = (facts.get("memory") or {}).get("total_bytes")
        rows.append({
            "host": host, "gpus": f"{len(gpus)} x {', '.join(names)}" if gpus else "none",
            "driver": facts.get("driver_version", ""), "kernel": facts.get("kernel", ""),
            "mem_gib": round(mem / 2**30, 1) if mem else None, "numa_nodes": len(facts.get("numa") or []),
        })
    # Cells as a plain frame's (no convert_dtypes): the memory stays a float, "64.0".
    return Table(rows, list(dict.fromkeys(c for row in rows for c in row)), whole_as_int=False).markdown()


def _plan_for_report(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan cut to what the report reads of it: each trial's id and factors, its engine's kind,
    rehearsal model and load format. Whole, a 10,000-trial plan is ~40 MB of JSON and ~190 MB in
    memory (the launch and node commands of every trial), beside the trials' own records."""
    def engine(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {k: value[k] for k in ("kind", "rehearsal_model") if k in value}
        if value.get("args"):
            out["args"] = {k: value["args"][k] for k in ("load-format", "load_format") if k in value["args"]}
        return out

    keys = ("id", "experiment", "kind", "mode", "repeat", "host")
    return {**plan, "trials": [{**{k: t[k] for k in keys}, **({"engine": engine(t["engine"])} if "engine" in t else {})}
                               for t in plan["trials"]]}


def _plan_ordered(plan: dict[str, Any], records: dict[str, TrialRecord]) -> list[TrialRecord]:
    """Trial records in plan order (setup-major), then any left from an earlier plan."""
    records = dict(records)
    ordered = [records.pop(t["id"]) for t in plan["trials"] if t["id"] in records]
    return ordered + list(records.values())


def _kind_sections(store: ResultsStore, records: dict[str, TrialRecord], plan: dict[str, Any]) -> list[str]:
    """Each kind with a ``KindReport`` gets its CSV (one or more rows per trial) and section."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for record in _plan_ordered(plan, records):
        kind = KINDS.get(str(record.get("kind")))
        if kind is None or kind.report is None:
            continue
        front = {"trial_id": record["id"], "host": record["host"], "mode": record["mode"],
                 "repeat": record["repeat"], "status": record.get("status"), "reason": record.get("reason", "")}
        try:
            rows = kind.report.rows(record) or [{}]
        except Exception:  # a record edited by hand: its row stays, without the kind's columns
            logger.warning("could not read %s for the %s table", record["id"], kind.name, exc_info=True)
            rows = [{}]
        by_kind.setdefault(kind.name, []).extend({**front, **row} for row in rows)
    parts = []
    for name, rows in by_kind.items():
        import pandas as pd  # noqa: PLC0415 - ~0.5 CPU s: only for a kind's own table and section
        spec = KINDS[name].report
        assert spec is not None
        frame = pd.DataFrame(rows).convert_dtypes()
        # A column named "_..." carries a structure to the kind's section only, never into its CSV.
        shown = [c for c in frame.columns if not str(c).startswith("_")]
        atomic_write_text(store.root / spec.csv_name, frame[shown].to_csv(index=False))
        if spec.section is not None:
            parts.append(spec.section(frame, store.root))
    return parts


@contextlib.contextmanager
def _cycle_collector(*, on: bool) -> Iterator[None]:
    """Python's cycle collector on or off inside, as it was after."""
    was_on = gc.isenabled()
    (gc.enable if on else gc.disable)()
    try:
        yield
    finally:
        (gc.enable if was_on else gc.disable)()


def _cycle_collector_off(build: Callable[[Path], tuple[Path, Path]]) -> Callable[[Path], tuple[Path, Path]]:
    """The cycle collector off while the report is built: it makes millions of small objects (the
    plan, 10,000 trial records, their rows and tables), none in a cycle, all freed by their reference
    counts; the collector walked them again and again, a quarter of a 10,000-trial report's CPU time.
    A kind's collect runs with it on (a parser's cycles: 90 MB over 10,000 trials); a chart's wait."""
    @functools.wraps(build)
    def wrapper(root: Path) -> tuple[Path, Path]:
        with _cycle_collector(on=False):
            return build(root)
    return wrapper


@_cycle_collector_off
def build_report(root: Path) -> tuple[Path, Path]:
    """Write ``summary.csv``, ``summary.json`` and ``report.md`` under ``root``; return the paths of
    the CSV and the Markdown."""
    if not root.is_dir():
        raise RunnerError(f"{root}: not a results folder (not a folder)")
    if not os.path.lexists(root / "plan.json"):
        raise RunnerError(f"{root}: not a results folder (no plan.json): run a campaign first")
    store = ResultsStore(root)
    plan = _plan_for_report(store.read_plan() or {"trials": []})  # first: whole, it must not sit beside the records
    records = _load_records(store)
    rows = _summary_rows(store, records, plan)
    table = _summary_table(rows)
    trials = typed_rows(table.columns, rows)
    run = store.read_run() or {}
    campaign = str(run.get("campaign") or plan.get("campaign") or root.name)
    counts = Counter(str(row["status"]) for row in rows)
    engines = sorted({row["engine"] for row in rows})
    notes = _engine_notes(engines, plan)
    csv_path = atomic_write_text(store.root / "summary.csv", table.csv())
    aggregates = aggregate_rows(trials)
    atomic_write_text(store.root / "summary.json", summary_json(table.columns, trials, campaign, notes, aggregates))
    del rows, trials  # two dicts a trial (~50 MB for 10,000) that nothing below reads: freed before the charts
    parts = [
        f"# Campaign {campaign}\n",
        f"- trials: {len(table.cells)} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'none'})",
        f"- engine: {', '.join(engines) or 'none'}",
        f"- git: {(run.get('git') or {}).get('sha')} (dirty: {(run.get('git') or {}).get('dirty')})",
        f"- tools: {', '.join(f'{k} {v}' for k, v in (run.get('tools') or {}).items())}",
        *(f"- {note}" for note in notes),
        "- data: `summary.csv` (one row per trial), `summary.json` (the same rows with typed values, plus the "
        "per-mode aggregates below)",
    ]
    overhead = overhead_line(run.get("runs") or [], records.values())
    if overhead:
        parts.append(overhead)
    parts.extend(_kind_sections(store, records, plan))
    parts.append("\n## Hosts\n")
    parts.append(_hosts_section(store))
    parts.append("\n## Per mode: min / median / max over the ok repeats\n")
    parts.append("Each cell is `median [min, max]` over the repeats that finished ok (`n=` when fewer of them "
                 "carry the metric); failed, skipped, interrupted and pending trials are counted, never averaged "
                 "in: their reasons are listed below.\n")
    parts.append(_aggregate_section(aggregates))
    parts.append("\n## Trials\n")
    # Metrics live in the kinds' sections and in summary.csv; this table says what ran and how it ended.
    parts.append(table.markdown([c for c in _BASE_COLUMNS if c != "reason"]))
    parts.append("\n## Not ok: failed, skipped, interrupted and pending trials, with reasons\n")
    parts.append(table.markdown(["trial_id", "host", "status", "reason"], where=lambda row: row["status"] != "ok"))
    if store.problems:
        parts.append("\n## Files that could not be used\n")
        parts.append("Each is left out of this report and, where it could be moved, kept under `quarantine/`; "
                     "a resumed run repeats its trial.\n")
        parts.extend(f"- `{line}`" for line in store.problems)
    md_path = atomic_write_text(store.root / "report.md", "\n".join(parts) + "\n")
    return csv_path, md_path
