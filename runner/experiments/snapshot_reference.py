"""What the snapshot report puts each CRIU restore beside: its physical limit (``snapshot_limits``,
computed per trial by the collect), the campaign's warm start of the same engine, the reference
figures, and the stages of the chart's bars.

The reference figures are NVIDIA Dynamo Snapshot's (the public ``ai-dynamo/snapshot`` repository,
``docs/development/benchmarks.md``: vLLM 0.20 on a B200, images on NFS). They are cited beside the
engine of this project nearest to each (the rehearsal presets ``qwen3-0.8b`` and ``qwen3-8b``),
never mixed into the rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.markdown import markdown_table

__all__ = ["REFERENCE", "REFERENCE_SOURCE", "limits_table", "reference_lines", "restore_bars", "warm_start"]

# (the reference's model, its restore to first token in seconds, this project's nearest engine)
REFERENCE = (("Qwen3 0.6B", 3.5, "qwen3-0.8b"), ("Qwen3 8B", 8.1, "qwen3-8b"))
REFERENCE_SOURCE = ("NVIDIA Dynamo Snapshot (the public `ai-dynamo/snapshot` repository, "
                    "`docs/development/benchmarks.md`; vLLM 0.20 on a B200, images on NFS)")
_WARM_STARTS = ("page_cache_warm", "disk_cold")  # the warmest start the startup kind measures first


def _num(frame: Any, col: str) -> Any:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    return pd.to_numeric(frame[col], errors="coerce") if col in frame.columns else pd.Series(dtype=float)


def _median(frame: Any, col: str) -> float | None:
    values = _num(frame, col).dropna()
    return round(float(values.median()), 3) if len(values) else None


def _first(frame: Any, col: str) -> Any:
    values = frame[col].dropna() if col in frame.columns else []
    return values.iloc[0] if len(values) else None


def warm_start(root: Path) -> tuple[float, str] | None:
    """This campaign's warm start of its engine (``startup.csv``): median seconds and the mode."""
    import pandas as pd  # noqa: PLC0415

    path = root / "startup.csv"
    if not path.is_file():
        return None
    starts = pd.read_csv(path)
    starts = starts[starts["status"] == "ok"]
    for mode in _WARM_STARTS:
        seconds = _median(starts[starts["mode"] == mode], "first_token_s")
        if seconds is not None:
            return seconds, mode
    return None


def _groups(ok: Any) -> Any:
    criu = ok[(ok["mode"] == "criu") & _num(ok, "restore_s").notna()]
    keys = [criu["quiesce"].fillna("none"), criu["image_source"].fillna("disk")]
    return criu.groupby(["experiment", *keys], sort=False)


def limits_table(ok: Any, warm: tuple[float, str] | None) -> list[dict[str, Any]]:
    """Per experiment, quiesce and image source: the limit's terms, the measured restore and its stages."""
    out = []
    for (experiment, quiesce, source), group in _groups(ok):
        limit, token = _median(group, "limit_s"), _median(group, "restore_to_first_token_s")
        pages, gpu = _median(group, "restore_pages_s"), _median(group, "restore_gpu_s")
        memfd = _median(group, "restore_memfd_s")
        cache = _first(group, "restore_cache") or "dropped"
        out.append({
            "experiment": experiment, "model": _first(group, "model"), "quiesce": quiesce, "image_source": source,
            "image_gib": _median(group, "image_gib"), "gpu_gib": _median(group, "limit_gpu_gib"),
            "read_gb_s": _median(group, "limit_read_gb_s"), "read_from": _first(group, "limit_read_from"),
            "h2d_gb_s": _median(group, "limit_h2d_gb_s"), "h2d_from": _first(group, "limit_h2d_from"),
            "limit_s": limit, "stage_s": _median(group, "stage_s"), "restore_s": _median(group, "restore_s"),
            "wake_s": _median(group, "wake_s"), "restore_to_first_token_s": token,
            "over_limit": round(token / limit, 2) if token and limit else None,
            "warm_start_s": warm[0] if warm else None,
            "speedup_vs_warm_start": round(warm[0] / token, 1) if warm and token else None,
            "gpu_part_from_log_s": gpu, "memfd_part_from_log_s": memfd,
            "criu_memfd_gb_s": _median(group, "restore_memfd_gb_s"), "pages_part_from_log_s": pages,
            "criu_page_read_gb_s": _median(group, f"restore_{cache}_pages_gb_s"),
            "log_explains_s": round(pages + gpu + (memfd or 0.0), 3) if pages is not None and gpu is not None
            else None})
    return out


def reference_lines(ok: Any) -> list[str]:
    """The reference figures, cited, beside this campaign's fastest restore of the nearest engine."""
    import pandas as pd  # noqa: PLC0415

    table = []
    for model, seconds, ours in REFERENCE:
        best: tuple[float, str, float | None] | None = None
        mine = ok[(ok["model"] == ours).fillna(False)] if "model" in ok.columns else ok[:0]
        for (_, quiesce, source), group in _groups(mine):
            token = _median(group, "restore_to_first_token_s")
            if token is not None and (best is None or token < best[0]):
                best = (token, f"quiesce {quiesce}, images from {source}", _median(group, "stage_s"))
        if best:
            table.append({"reference": model, "reference_s": seconds, "ours": ours, "ours_s": best[0],
                          "how": best[1], "staging_s": best[2], "ours_over_reference": round(best[0] / seconds, 2)})
    text = (f"\nReference figures, not measured here and never mixed into the rows above: {REFERENCE_SOURCE} "
            "restores " + " and ".join(f"{m} to its first token in {s} s" for m, s, _ in REFERENCE) + ".")
    if not table:
        return [f"{text} This campaign restored neither of the nearest engines (qwen3-0.8b, qwen3-8b).\n"]
    return [f"{text} Beside each, this campaign's fastest CRIU restore of the nearest engine (median over its "
            "repeats, restore to first token; the staging copy, before the restore, apart):\n",
            markdown_table(pd.DataFrame(table))]


def restore_bars(ok: Any) -> list[dict[str, Any]]:
    """One bar per restore of every ok criu trial: its stages (the collect's ``restore_stages``), and the
    trial's limit beside its first restore."""
    bars = []
    for row in ok[ok["mode"] == "criu"].to_dict("records"):
        restores = row.get("_restores")
        if not isinstance(restores, list):
            continue
        for index, restore in enumerate(restores):
            where = " tmpfs" if restore.get("image_source") == "tmpfs" else ""
            quiesce = row.get("quiesce")
            asleep = f" {quiesce}" if isinstance(quiesce, str) and quiesce != "none" else ""
            limit = row.get("limit_s") if index == 0 else None
            bars.append({"label": f"{row['experiment']} r{row['repeat']} {restore.get('cache')}{where}{asleep}",
                         "stages": restore.get("stages") or {},
                         "limit_s": float(limit) if isinstance(limit, int | float) else None})
    return bars
