"""When a KV tier pays: the break-even model, pure arithmetic over measured figures.

A revisited history that is not on the GPU is either recomputed, at the engine's prefill rate
``R`` (tokens/s), or read back from a tier, ``B`` bytes a token at the tier's read rate ``G``. A
token costs ``1/R`` seconds to recompute and ``B/G`` to read, so a tier pays when ``G > B x R``:
the break-even read rate, whatever the history's length. ``R`` comes from the hbm_only run,
which recomputes every revisit: its revisit turns' uncached prompt tokens over the seconds the
engine spent prefilling them (the union of the requests' waits for their first token, so
requests in flight together are not counted twice).

The same terms predict a revisit turn: the seconds it spends outside prefill (decode and the gaps
between requests: ``o`` a request, what hbm_only's turns left after their prefill), plus its
uncached tokens at ``R``, plus every tier's tokens at ``B / G`` (a read before the first token,
not hidden behind other requests' work). A prediction off by more than 25% names the wrong term.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Baseline", "TierRead", "TurnShape", "baseline", "breakeven_read_gb_s", "merge", "path_gb_s",
           "predict_turn_s", "read_seconds", "verdict"]


@dataclass(frozen=True)
class TurnShape:
    """One revisit turn as the requests measured it."""

    requests: int
    uncached_tokens: int  # prompt tokens the engine computed (prompt minus cached)
    prefill_busy_s: float  # seconds at least one request waited for its first token
    wall_s: float  # first request sent to last one finished


@dataclass(frozen=True)
class Baseline:
    """What recomputing costs on this engine: the hbm_only run's revisit turns."""

    prefill_tok_s: float  # R
    other_s_per_request: float  # o: a turn's seconds outside prefill, per request
    turns: int = 0

    def compute_s(self, turn: TurnShape) -> float:
        """A turn's seconds without any tier read: outside prefill, plus its uncached tokens at R."""
        return turn.requests * self.other_s_per_request + turn.uncached_tokens / self.prefill_tok_s


@dataclass(frozen=True)
class TierRead:
    """What one tier served during the revisit turns: tokens, and the rate it read them at (GB/s)."""

    tier: str
    tokens: int
    gb_s: float | None


def baseline(turns: Iterable[TurnShape]) -> Baseline | None:
    """R and o from hbm_only's revisit turns (totals, so long turns weigh more); None without any."""
    turns = [t for t in turns if t.prefill_busy_s > 0 and t.requests > 0]
    if not turns:
        return None
    busy = sum(t.prefill_busy_s for t in turns)
    other = max(0.0, sum(t.wall_s for t in turns) - busy)
    return Baseline(sum(t.uncached_tokens for t in turns) / busy, other / sum(t.requests for t in turns), len(turns))


def merge(baselines: Sequence[Baseline]) -> Baseline | None:
    """The median of several hbm_only repeats' baselines."""
    if not baselines:
        return None
    return Baseline(statistics.median(b.prefill_tok_s for b in baselines),
                    statistics.median(b.other_s_per_request for b in baselines), sum(b.turns for b in baselines))


def breakeven_read_gb_s(kv_bytes_per_token: float, prefill_tok_s: float) -> float:
    """The read rate (decimal GB/s) at which reading a token costs what recomputing it does: B x R."""
    return kv_bytes_per_token * prefill_tok_s / 1e9


def path_gb_s(*hops: float | None) -> float | None:
    """The rate of a path whose hops run one after another (a file read, then the copy to the GPU)."""
    if not hops or any(h is None or h <= 0 for h in hops):
        return None
    return 1 / sum(1 / h for h in hops if h)


def read_seconds(tokens: int, kv_bytes_per_token: float, gb_s: float | None) -> float | None:
    if not tokens:
        return 0.0
    if not gb_s or gb_s <= 0:
        return None
    return tokens * kv_bytes_per_token / 1e9 / gb_s


def predict_turn_s(base: Baseline, turns: Sequence[TurnShape], reads: Sequence[TierRead],
                   kv_bytes_per_token: float) -> float | None:
    """The mean revisit turn the model predicts, or None when a tier that served tokens has no rate."""
    if not turns:
        return None
    seconds = sum(base.compute_s(t) for t in turns)
    for read in reads:
        cost = read_seconds(read.tokens, kv_bytes_per_token, read.gb_s)
        if cost is None:
            return None
        seconds += cost
    return seconds / len(turns)


def verdict(rate_gb_s: float | None, breakeven_gb_s: float | None) -> str:
    """Whether reading from the tier beats recomputing on this node, in the report's words."""
    if breakeven_gb_s is None:
        return ""
    if rate_gb_s is None:
        return f"would pay at >= {breakeven_gb_s:.2f} GB/s (its rate was not measured)"
    if rate_gb_s >= breakeven_gb_s:
        return "pays on this node"
    return f"would pay at >= {breakeven_gb_s:.2f} GB/s (it read {rate_gb_s:.2f} GB/s)"
