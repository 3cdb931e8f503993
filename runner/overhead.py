"""The campaign's own overhead: its wall time outside the windows its trials measured.

A startup trial measures from the start command to the first token (and, with sleep/wake, from the
sleep request to the first token after the wake); the engine's stop (``stop_s``), what a restart pays
before its start, is measured too and reported apart. Everything else of the campaign's wall (each
run's start to its end in ``run.json``: Ansible, the node programs before the start, the copies
home, the records, the report) is the tool's own cost, which a campaign should keep small:
``benchmarks/bench_trial_overhead.py`` splits it further from the same files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["campaign_overhead", "overhead_line"]


def _window(metrics: Mapping[str, Any]) -> float:
    first = metrics.get("first_token_s")
    if not isinstance(first, int | float):
        return 0.0
    # The sleep request to the first token after the wake: the sleep, then the wake request to its token.
    wake = [metrics.get(k) for k in ("sleep_http_s", "wake_to_first_token_s")]
    return float(first) + sum(float(v) for v in wake if isinstance(v, int | float))


def campaign_overhead(runs: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``wall_s`` (the runs that ended), ``measured_s`` (the ok startup trials' windows), ``stop_s``,
    ``outside_fraction`` and ``outside_fraction_stops_measured``; {} when nothing was measured."""
    wall = sum(float(r["ended"]) - float(r["started"]) for r in runs
               if isinstance(r.get("started"), int | float) and isinstance(r.get("ended"), int | float))
    measured = stops = 0.0
    trials = 0
    for record in records:
        if record.get("kind") != "startup" or record.get("status") != "ok":
            continue
        metrics = record.get("metrics") or {}
        measured += _window(metrics)
        stop = metrics.get("stop_s")
        stops += float(stop) if isinstance(stop, int | float) else 0.0
        trials += 1
    if wall <= 0 or not trials:
        return {}
    return {"wall_s": round(wall, 1), "measured_s": round(measured, 1), "stop_s": round(stops, 1), "trials": trials,
            "outside_fraction": round(max(0.0, wall - measured) / wall, 4),
            "outside_fraction_stops_measured": round(max(0.0, wall - measured - stops) / wall, 4)}


def overhead_line(runs: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]]) -> str:
    """The report's line, or "" when the campaign measured no start."""
    o = campaign_overhead(runs, records)
    if not o:
        return ""
    return (f"- the campaign's own overhead: {o['outside_fraction']:.1%} of its {o['wall_s']:.0f} s wall was outside "
            f"the {o['trials']} ok starts' measured windows ({o['outside_fraction_stops_measured']:.1%} counting the "
            f"engines' stops, {o['stop_s']:.0f} s, as measured); `benchmarks/bench_trial_overhead.py --from` "
            "splits it")
