"""The campaign's own overhead: its wall time outside the windows its trials measured.

A startup trial measures from the start command to the first token (and, with sleep/wake, from the
sleep request to the first token after the wake), plus its mode's own preparation where the mode
has one and records it (``bytecode_compile_s``: the remedy's one-time cost, a row of its own). A
snapshot trial measures the engine's start, its sleep, the dump, the staging copy and every
restore to its first token. The engine's stop (``stop_s``), what a restart pays before its start,
is measured too and reported apart. A trial cut short by a stop (``interrupted``) measured nothing
whole: its seconds are the stop's loss, reported apart, not the tool's. Everything else of the
campaign's wall (each run's start to its end in ``run.json``: Ansible, the node programs before
the start, the copies home, the records, the report) is the tool's own cost, which a campaign
should keep small: ``benchmarks/bench_trial_overhead.py`` splits it further from the same files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["campaign_overhead", "measured_seconds", "overhead_line"]

MEASURED_KINDS = ("startup", "snapshot")
# A snapshot trial's stages, each timed by the node tool; the restores are summed per page-cache
# state (restore_<cache>_to_first_token_s), else the one restore_to_first_token_s.
_SNAPSHOT_STAGES = ("first_token_s", "sleep_s", "dump_s", "stage_s")


def _num(metrics: Mapping[str, Any], key: str) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def measured_seconds(kind: str, metrics: Mapping[str, Any]) -> float:
    """The seconds an ok trial of ``kind`` measured (0.0 for a kind that measures no window)."""
    if kind == "startup":
        if not isinstance(metrics.get("first_token_s"), int | float):
            return 0.0
        return sum(_num(metrics, k) for k in ("first_token_s", "sleep_http_s", "wake_to_first_token_s",
                                              "bytecode_compile_s"))
    if kind == "snapshot":
        restores = [k for k in metrics if k.startswith("restore_") and k.endswith("_to_first_token_s")
                    and k != "restore_to_first_token_s"]
        restore = sum(_num(metrics, k) for k in restores) if restores else _num(metrics, "restore_to_first_token_s")
        return sum(_num(metrics, k) for k in _SNAPSHOT_STAGES) + restore
    return 0.0


def campaign_overhead(runs: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``wall_s`` (the runs that ended), ``measured_s`` (the ok trials' windows and stages), ``stop_s``,
    ``cut_s`` (trials cut short by a stop), ``outside_fraction`` and ``outside_fraction_stops_measured``;
    {} when nothing was measured."""
    ended = [r for r in runs if isinstance(r.get("started"), int | float) and isinstance(r.get("ended"), int | float)]
    wall = sum(float(r["ended"]) - float(r["started"]) for r in ended)
    stopped = any(r.get("interrupted") for r in ended)  # a run that crashed never ended: its trials are not in the wall
    measured = stops = cut = 0.0
    trials = 0
    for record in records:
        if record.get("status") == "interrupted":
            if not stopped:
                continue
            duration = record.get("duration_s")
            cut += float(duration) if isinstance(duration, int | float) else 0.0
            continue
        if record.get("kind") not in MEASURED_KINDS or record.get("status") != "ok":
            continue
        metrics = record.get("metrics") or {}
        seconds = measured_seconds(str(record.get("kind")), metrics)
        if seconds <= 0:
            continue
        measured += seconds
        stops += _num(metrics, "stop_s")
        trials += 1
    wall -= min(cut, wall)
    if wall <= 0 or not trials:
        return {}
    return {"wall_s": round(wall, 1), "measured_s": round(measured, 1), "stop_s": round(stops, 1), "trials": trials,
            "cut_s": round(cut, 1),
            "outside_fraction": round(max(0.0, wall - measured) / wall, 4),
            "outside_fraction_stops_measured": round(max(0.0, wall - measured - stops) / wall, 4)}


def overhead_line(runs: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> str:
    """The report's line, or "" when the campaign measured nothing."""
    o = campaign_overhead(runs, records)
    if not o:
        return ""
    cut = (f"; {o['cut_s']:.0f} s of trials cut short by a stop are left out of the wall, a loss of their own"
           if o["cut_s"] else "")
    return (f"- the campaign's own overhead: {o['outside_fraction']:.1%} of its {o['wall_s']:.0f} s wall was outside "
            f"the {o['trials']} ok trials' measured windows and stages ({o['outside_fraction_stops_measured']:.1%} "
            f"counting the engines' stops, {o['stop_s']:.0f} s, as measured){cut}; "
            "`benchmarks/bench_trial_overhead.py --from` splits it")
