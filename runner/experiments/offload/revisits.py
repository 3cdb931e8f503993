"""The revisit turns of an offload trial as the break-even model reads them, and the hbm_only
baseline of its results folder.

A turn's prefill seconds are the union of its requests' waits for their first token (``t_start``
to ``t_start + ttft_s``): while any request waits, the engine is prefilling, and requests in
flight together share that time rather than add to it. The baseline is what the hbm_only trials
of the same experiment and host measured, read from their ``trial.json`` (``prefill_tok_s``,
``other_s_per_request``), the way ``limits`` reads the storage trials: any trial's collect, and
the report's, can use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.experiments.offload.breakeven import Baseline, TurnShape, baseline, merge
from runner.results_reader import ResultsReader

__all__ = ["BASELINE_MODE", "folder_baseline", "prefill_busy_s", "turn_shapes"]

BASELINE_MODE = "hbm_only"  # recomputes every revisit: its prefill rate is what a tier must beat
_MAX_TRIALS = 10_000  # a plan holds at most that many


def prefill_busy_s(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def turn_shapes(frame: Any) -> list[TurnShape]:
    """Each revisit turn (turn >= 1) whose requests all answered and reported their cached tokens."""
    final = frame[frame["final"]]
    out = []
    for _turn, group in final[final["turn"] >= 1].groupby("turn", sort=True):
        ok = group[group["status"] == "ok"]
        if len(ok) != len(group) or ok["cached_tokens"].isna().any() or ok[["t_start", "ttft_s"]].isna().any().any():
            continue
        ends = ok["t_end"].where(ok["t_end"].notna(), ok["t_start"] + ok["latency_s"])
        busy = prefill_busy_s(zip(ok["t_start"], ok["t_start"] + ok["ttft_s"], strict=True))
        out.append(TurnShape(requests=len(ok), uncached_tokens=int((ok["prompt_tokens"] - ok["cached_tokens"]).sum()),
                             prefill_busy_s=float(busy), wall_s=float(ends.max() - ok["t_start"].min())))
    return out


def _stored(record: dict[str, Any]) -> Baseline | None:
    metrics = record.get("metrics") or {}
    rate, other = metrics.get("prefill_tok_s"), metrics.get("other_s_per_request")
    if not isinstance(rate, int | float) or not isinstance(other, int | float) or rate <= 0 or other < 0:
        return None
    return Baseline(float(rate), float(other), int(metrics.get("baseline_turns") or 0))


def folder_baseline(trial_dir: Path, host: str, own: list[TurnShape] | None = None) -> tuple[Baseline | None, str]:
    """The hbm_only baseline for a trial in ``trial_dir`` (``<results>/trials/<id>``): the median over
    the ok hbm_only trials of its experiment and host, with ``own`` turns (an hbm_only trial's
    own, not stored yet) counted as one more; and which trials it came from, in words."""
    root = trial_dir.parent.parent
    reader = ResultsReader(root, quarantine=False)
    mine = reader.json(f"trials/{trial_dir.name}/trial.json") or {}
    found: list[Baseline] = []
    names: list[str] = []
    own_base = baseline(own or [])
    if own_base is not None:
        found.append(own_base)
        names.append(trial_dir.name)
    for count, name in enumerate(reader.folders("trials")):
        if count >= _MAX_TRIALS:
            break
        if name == trial_dir.name:
            continue
        record = reader.json(f"trials/{name}/trial.json")
        if (not isinstance(record, dict) or record.get("kind") != "offload" or record.get("mode") != BASELINE_MODE
                or record.get("status") != "ok" or record.get("host") != host
                or (mine.get("experiment") and record.get("experiment") != mine.get("experiment"))):
            continue
        stored = _stored(record)
        if stored is not None:
            found.append(stored)
            names.append(name)
    return merge(found), ", ".join(names)
