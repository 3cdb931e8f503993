"""The KV ladder's columns of an offload row: which path LMCache ran, which tier served each hit and
at what rate, and the break-even model against the hbm_only trials of the same results folder.

Called by ``collect`` with the figures it already has. The model's terms (``breakeven``): the
baseline's prefill rate and seconds outside prefill (``revisits``), the KV bytes a token (the
model's config the node read; the stand-in's knob for the stand-in), and each tier's tokens and
rate (``tiers``). hbm_only's own row predicts itself (a check of the arithmetic, not of the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodetools.offload.lmcache_gate import scan_logs
from runner.errors import ParseError
from runner.experiments.base import TrialContext
from runner.experiments.limits import host_limits
from runner.experiments.offload.breakeven import (
    Baseline,
    TurnShape,
    baseline,
    breakeven_read_gb_s,
    predict_turn_s,
    verdict,
)
from runner.experiments.offload.revisits import BASELINE_MODE, folder_baseline, turn_shapes
from runner.experiments.offload.sizing import plan_sizing
from runner.experiments.offload.tiers import TierInputs, tier_columns, tier_reads
from runner.parse.metrics import prefix_cache_run_rates

__all__ = ["LADDER_COLUMNS", "ladder_columns"]

# The row's columns this module adds (offload.csv keeps them in this order).
LADDER_COLUMNS = (
    "lmcache_path", "tier_hit_tokens_gpu", "tier_hit_tokens_cpu", "tier_hit_tokens_fs", "tier_hit_source",
    "tier_read_gb_cpu", "tier_read_gb_fs", "tier_read_gb_s_cpu", "tier_read_gb_s_fs", "tier_read_gb_s",
    "tier_read_tier", "tier_read_source", "prefill_tok_s", "other_s_per_request", "baseline_turns",
    "breakeven_read_gb_s", "turn_wall_mean_revisit_s", "predicted_revisit_turn_s", "predicted_error_pct",
    "tier_verdict", "model_note",
)

Pairs = list[tuple[dict[str, float], dict[str, float]]]


def _hits(pairs: Pairs) -> tuple[float | None, float | None]:
    """GPU and external prefix-cache hit tokens during the load, summed over engine copies."""
    gpu = external = None
    for first, last in pairs:
        rates = prefix_cache_run_rates(first, last)
        if "prefix_cache_hits" in rates:
            gpu = (gpu or 0.0) + rates["prefix_cache_hits"]
        if "external_prefix_cache_hits" in rates:
            external = (external or 0.0) + rates["external_prefix_cache_hits"]
    return gpu, external


def _kv_bytes(ctx: TrialContext, run: Mapping[str, Any]) -> int | None:
    """The KV bytes a tier moves per token: the stand-in's knob, else the model's config the node read."""
    planned = plan_sizing(ctx.params, ctx.engine).get("kv_bytes_per_token")
    if (ctx.engine.get("kind") or "stand-in") == "stand-in":
        return planned
    return run.get("kv_bytes_per_token") or planned


def _disk_limit(ctx: TrialContext) -> tuple[float | None, str]:
    if ctx.trial_dir is None:
        return None, ""
    limits = host_limits(ctx.trial_dir.parent.parent, ctx.host)
    disk = limits.disk_read() if limits is not None else None
    return (disk.gb_s, disk.source) if disk is not None else (None, "")


def _turns(raw: Path) -> list[TurnShape]:
    from runner.parse.loadgen import read_requests  # noqa: PLC0415 - pulls in pandas (~1 s): only when collecting

    try:
        return turn_shapes(read_requests(raw / "requests.jsonl"))
    except ParseError:
        return []


def _model(ctx: TrialContext, turns: list[TurnShape], columns: dict[str, Any], kv_bytes: int | None,
           tiers: tuple[str, ...]) -> dict[str, Any]:
    own = baseline(turns) if ctx.mode == BASELINE_MODE else None
    out: dict[str, Any] = {}
    if own is not None:
        out.update(prefill_tok_s=round(own.prefill_tok_s, 1), other_s_per_request=round(own.other_s_per_request, 4),
                   baseline_turns=own.turns)
    if turns:
        out["turn_wall_mean_revisit_s"] = round(sum(t.wall_s for t in turns) / len(turns), 4)
    if ctx.trial_dir is None or not kv_bytes:
        return out
    base, trials = folder_baseline(ctx.trial_dir, ctx.host, turns if ctx.mode == BASELINE_MODE else None)
    if base is None:
        out["model_note"] = "no ok hbm_only trial of this experiment and host yet: no break-even figure"
        return out
    out["breakeven_read_gb_s"] = round(breakeven_read_gb_s(kv_bytes, base.prefill_tok_s), 3)
    out["model_note"] = _note(base, kv_bytes, trials)
    # A tier whose tokens are unknown (no /metrics) would be priced as free: no prediction then.
    known = all(f"tier_hit_tokens_{t}" in columns for t in tiers)
    predicted = predict_turn_s(base, turns, tier_reads(columns), kv_bytes) if known else None
    if predicted is not None:
        out["predicted_revisit_turn_s"] = round(predicted, 3)
        if out.get("turn_wall_mean_revisit_s"):
            out["predicted_error_pct"] = round(100 * (predicted / out["turn_wall_mean_revisit_s"] - 1), 1)
    if columns.get("tier_read_tier"):
        out["tier_verdict"] = verdict(columns.get("tier_read_gb_s"), out["breakeven_read_gb_s"])
    return out


def _note(base: Baseline, kv_bytes: int, trials: str) -> str:
    return (f"recompute {base.prefill_tok_s:,.0f} tokens/s and {base.other_s_per_request:.3f} s a request outside "
            f"prefill ({trials}, {base.turns} revisit turns); KV {kv_bytes:,} bytes a token")


def ladder_columns(ctx: TrialContext, raw: Path, run: Mapping[str, Any], metrics: Mapping[str, Any],
                   pairs: Pairs, logs: list[Path]) -> dict[str, Any]:
    """The ladder's columns of one trial: ``lmcache_path``, the ``tier_*`` accounting and the model's."""
    recipe = ctx.params.get("recipe") or {}
    lmcache = str(recipe.get("python_module") or "") == "lmcache"
    out: dict[str, Any] = {}
    if lmcache:
        out["lmcache_path"] = scan_logs(logs) or None
    gpu, external = _hits(pairs)
    kv_bytes = _kv_bytes(ctx, run)
    limit, limit_source = _disk_limit(ctx)
    by_tier = {k[len("external_hit_tokens_"):]: int(v) for k, v in metrics.items()
               if k.startswith("external_hit_tokens_")}
    inputs = TierInputs(
        gpu_hits=gpu, external_hits=external, host_tier=bool(recipe.get("host_gib_per_copy")),
        fs_tier=bool(recipe.get("fs")), lmcache=lmcache, by_tier=by_tier, kv_bytes_per_token=kv_bytes,
        transfers={k: v for k, v in metrics.items() if k.startswith("kv_")},
        file_read_gb=metrics.get("engine_file_read_gb"), disk_read_gb=metrics.get("engine_disk_read_gb"),
        disk_limit_gb_s=limit, disk_limit_source=limit_source)
    columns = tier_columns(inputs)
    out.update(columns)
    tiers = tuple(t for t, present in (("cpu", inputs.host_tier), ("fs", inputs.fs_tier)) if present)
    out.update(_model(ctx, _turns(raw), columns, kv_bytes, tiers))
    return {k: v for k, v in out.items() if v is not None}
