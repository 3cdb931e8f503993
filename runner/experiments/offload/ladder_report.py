"""The report's ladder table: per mode, which tier served the revisits, its read rate against the
break-even rate, the verdict, and the model's revisit turn against the measured one."""

from __future__ import annotations

from typing import Any

from runner.experiments.offload.breakeven import verdict
from runner.markdown import markdown_table

__all__ = ["ladder_section"]

_TIER_WORDS = {"cpu": "host RAM", "fs": "file system"}


def _median(group: Any, column: str) -> float | None:
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    if column not in group:
        return None
    values = pd.to_numeric(group[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else None


def _tokens(group: Any, column: str) -> int | None:
    value = _median(group, column)
    return None if value is None else round(value)


def _first(group: Any, column: str) -> str:
    if column not in group:
        return ""
    values = [str(v) for v in group[column].dropna() if str(v)]
    return values[0] if values else ""


def _row(mode: str, group: Any) -> dict[str, Any]:
    rate, breakeven = _median(group, "tier_read_gb_s"), _median(group, "breakeven_read_gb_s")
    tier = _first(group, "tier_read_tier")
    measured, predicted = _median(group, "turn_wall_mean_revisit_s"), _median(group, "predicted_revisit_turn_s")
    return {
        "mode": mode, "repeats": len(group), "lmcache_path": _first(group, "lmcache_path"),
        "tokens_gpu": _tokens(group, "tier_hit_tokens_gpu"), "tokens_cpu": _tokens(group, "tier_hit_tokens_cpu"),
        "tokens_fs": _tokens(group, "tier_hit_tokens_fs"), "deepest_tier": _TIER_WORDS.get(tier, ""),
        "tier_read_gb_s": rate, "breakeven_read_gb_s": breakeven,
        "verdict": verdict(rate, breakeven) if tier else "",
        "revisit_turn_s": measured, "predicted_s": predicted,
        "error_pct": round(100 * (predicted / measured - 1), 1) if predicted and measured else None,
    }


def ladder_section(shown: Any) -> str:
    """Markdown for the ok trials of ``shown`` (the offload table), or "" without ladder figures."""
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    ok = shown[shown["status"] == "ok"]
    if ok.empty or not any(c in ok for c in ("tier_hit_tokens_gpu", "breakeven_read_gb_s")):
        return ""
    table = pd.DataFrame([_row(str(mode), group) for mode, group in ok.groupby("mode", sort=False)])
    lines = ["\n### The ladder: which tier served the revisits, and whether reading it beats recomputing\n",
             "Tokens served per tier during the load (GPU: the prefix cache; below it the engine's external hits, "
             "split by its per-tier counters or the engines' file reads), the deepest tier's read rate towards the "
             "GPU against the break-even rate (the KV bytes a token x the hbm_only run's recompute rate: reading "
             "faster than that beats recomputing), and the mean revisit turn the model predicts against the "
             "measured one (medians over the ok repeats; `tier_read_source` and `model_note` in offload.csv say "
             "where each figure came from):\n", markdown_table(table)]
    turns = dict(zip(table["mode"], table["revisit_turn_s"], strict=True))
    if turns.get("lmcache_cpu") and turns.get("native_cpu"):
        lines.append(f"\nlmcache_cpu's revisit turn over native_cpu's: {turns['lmcache_cpu'] / turns['native_cpu']:.2f}"
                     f" ({turns['lmcache_cpu']:.2f} s / {turns['native_cpu']:.2f} s).")
    notes = sorted({n for n in ok.get("model_note", pd.Series(dtype=object)).dropna() if str(n)})
    if notes:
        lines.append("\nThe model's baseline: " + "; ".join(notes) + ".")
    return "\n".join(lines) + "\n"
