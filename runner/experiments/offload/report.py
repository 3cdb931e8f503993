"""The offload kind's tables: ``offload.csv`` (one row per trial), ``offload_turns.csv`` (per trial
and turn) and the report section with its charts, per-turn medians, transfers (beside the node's
measured copy and disk read rates, where the results folder has ``storage`` trials) and sizing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from runner.errors import ParseError
from runner.experiments.limits import NodeLimits, node_limits, transfer_limit
from runner.experiments.offload.collect import ENGINE_FILE_IO
from runner.experiments.offload.ladder import LADDER_COLUMNS
from runner.experiments.offload.ladder_report import ladder_section
from runner.files import atomic_write_text
from runner.markdown import markdown_table
from runner.records import TrialRecord

__all__ = ["REPORT_COLUMNS", "rows", "section"]

REPORT_COLUMNS = (
    "ttft_median_turn0_s", "ttft_median_revisit_s", "ttft_p90_revisit_s", "turn_wall_median_revisit_s",
    "prefix_hit_pct_log_last", "external_hit_pct_log_last", "prefix_hit_pct_metrics_run",
    "external_hit_pct_metrics_run", "cached_pct_usage", "external_hit_tokens_cpu", "external_hit_tokens_fs",
    "requests_ok", "requests_failed", "requests_not_sent", "turns_completed", "quality", "quality_correct",
    "quality_total", "quality_looping", "working_set_tokens", "working_set_planned_tokens", "kv_cache_tokens",
    "ws_over_hbm", "host_tier_tokens", "host_tier_source", "ws_over_hbm_plus_host", "fs_tier_tokens",
    "kv_bytes_per_token", "working_set_gib", "offload_store_refused", "tier_note", "sizing_note", "weights", "ready_s",
    "load_wall_s", "barrier_ok", "gen_loop_lag_p99_ms", "gen_cpu_s", "log_errors",
    *ENGINE_FILE_IO, *LADDER_COLUMNS,
)
_TRANSFER_PREFIX = "kv_"  # kv_<src>_to_<dst>_gb / _s / _gb_s and kv_transfer_source (collect.kv_transfers)


def rows(record: TrialRecord) -> list[dict[str, Any]]:
    metrics = record.get("metrics") or {}
    row = {k: metrics.get(k) for k in REPORT_COLUMNS}
    # The transfer types are the engine's (GPU_to_CPU, CPU_to_GPU, ...): whichever it counted.
    row.update({k: v for k, v in metrics.items()
                if (k.startswith(_TRANSFER_PREFIX) and "_to_" in k) or k == "kv_transfer_source"})
    return [row]


def _turn_rows(frame: Any, root: Path) -> list[dict[str, Any]]:
    """Per trial and turn, from each trial's requests.jsonl: ok trials, and the finished turns of a
    trial that stopped early (its status says so). TTFT median and p90, each request's wall time
    (latency) median and p90, and the turn's wall time (first request sent to last finished)."""
    from runner.parse.loadgen import read_requests, turn_table  # noqa: PLC0415 - pulls in pandas

    out: list[dict[str, Any]] = []
    for trial in frame.itertuples():
        path = root / "trials" / str(trial.trial_id) / "raw" / str(trial.host) / "requests.jsonl"
        if trial.status not in ("ok", "failed") or not path.is_file():
            continue
        try:
            requests = read_requests(path)
            turns = turn_table(requests)
        except ParseError:
            continue
        ok = requests[requests["final"] & (requests["status"] == "ok")]
        latency_p90 = ok.groupby("turn")["latency_s"].quantile(0.9).round(4).to_dict()
        for turn in turns.to_dict("records"):
            out.append({"trial_id": trial.trial_id, "mode": trial.mode, "repeat": trial.repeat,
                        "status": trial.status, **turn, "latency_p90_s": latency_p90.get(turn["turn"])})
    return out


def _per_turn_medians(turns: Any) -> str:
    """Per mode and turn, the median over repeats of TTFT (median and p90) and the turn's wall time."""
    ok = turns[turns["status"] == "ok"]
    if ok.empty:
        return ""
    table = (ok.groupby(["mode", "turn"], sort=False)[["ttft_median_s", "ttft_p90_s", "turn_wall_s"]]
             .median().round(3).reset_index())
    table.insert(2, "repeats", ok.groupby(["mode", "turn"], sort=False).size().to_numpy())
    return ("\nPer turn, median over the ok repeats (TTFT median and p90 within each turn, the turn's wall time):\n\n"
            + markdown_table(table))


def _transfers(shown: Any) -> str:
    cols = [c for c in shown.columns if c.startswith(_TRANSFER_PREFIX) and "_to_" in c]
    text = ""
    if cols:
        table = shown[["mode", "repeat", *sorted(cols), *(["kv_transfer_source"] if "kv_transfer_source" in shown
                                                            else [])]]
        text = ("\nKV bytes moved per transfer type during the load (GB, seconds the engine spent, GB/s), as the "
                "engine counted them (`kv_transfer_source`: its `/metrics` counters, else its connector's log lines, "
                "else LMCache's own lines):\n\n" + markdown_table(table))
    io = [c for c in ENGINE_FILE_IO if c in shown.columns and shown[c].notna().any()]
    if io:
        text += ("\n\nFiles the engines' processes read and wrote during the load (GB, from `/proc/<pid>/io` of "
                 "the processes alive before and after it: `file` through read()/write(), page cache included, so "
                 "a file-system tier read back from RAM counts, and pipes and sockets too, the engine's own "
                 "traffic of megabytes; `disk` what the storage itself moved). A tier on disk shows here whether "
                 "or not the engine's metrics count it:\n\n" + markdown_table(shown[["mode", "repeat", *io]]))
    return text


_TRANSFER_RATE = re.compile(r"^kv_(\w+?)_to_(\w+)_gb_s$")


def _limits_line(limits: NodeLimits) -> str:
    parts = []
    shown = ((("h2d", "pinned"), "host → GPU pinned"), (("d2h", "pinned"), "GPU → host pinned"),
             (("h2d", "pageable"), "host → GPU pageable"))
    for (direction, memory), words in shown:
        rate = limits.copy(direction, memory)
        parts.append(f"{words} {rate.gb_s:.2f} GB/s" if rate else f"{words} not measured")
    disk = limits.disk_read()
    parts.append(f"disk read {disk.gb_s:.2f} GB/s ({disk.source})" if disk else "disk read not measured")
    why = "; ".join(f"{mode} {reason}" for mode, reason in sorted(limits.not_measured.items()))
    return f"- {limits.host}: {', '.join(parts)}" + (f" (not measured: {why})" if why else "")


def _against_limits(shown: Any, root: Path) -> str:
    """Each mode's achieved KV transfer rate (median over its repeats) beside the node's measured
    limit for that kind of transfer, per host that has storage trials in this results folder."""
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    limits = node_limits(root)
    hosts = [h for h in dict.fromkeys(shown["host"]) if h in limits]
    if not hosts:
        return ""
    lines = ["\nThe node's measured limits (the `storage` trials of this results folder: `h2d_copy` for copies, "
             "fio for the disk; decimal GB/s, medians over the ok trials):\n",
             *(_limits_line(limits[h]) for h in hosts), ""]
    rows = []
    cols = [c for c in shown.columns if _TRANSFER_RATE.match(c)]
    for host in hosts:
        for mode, group in shown[shown["host"] == host].groupby("mode", sort=False):
            for col in sorted(cols):
                achieved = pd.to_numeric(group[col], errors="coerce").dropna()
                if not len(achieved):
                    continue
                m = _TRANSFER_RATE.match(col)
                assert m is not None
                rate, bound = transfer_limit(limits[host], m[1], m[2])
                value = round(float(achieved.median()), 2)
                rows.append({"host": host, "mode": mode, "transfer": f"{m[1]} → {m[2]}", "achieved_gb_s": value,
                             "limit_gb_s": rate.gb_s if rate else None, "limit": bound,
                             "achieved_pct_of_limit": round(100 * value / rate.gb_s, 1) if rate else None})
    if rows:
        lines.append("Each tier's achieved KV transfer rate (median over the repeats) against that limit:\n")
        lines.append(markdown_table(pd.DataFrame(rows)))
    else:
        lines.append("The engine counted no KV transfer bytes (the stand-in counts tokens): nothing to compare.\n")
    return "\n".join(lines)


def section(frame: Any, root: Path) -> str:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    from runner.report_charts import offload_ttft_chart, offload_turn_wall_chart  # noqa: PLC0415 - pandas and matplotlib: only when a report is built

    turns = pd.DataFrame(_turn_rows(frame, root))
    if not turns.empty:
        atomic_write_text(root / "offload_turns.csv", turns.to_csv(index=False))
    lines = ["\n## Offload: a multi-turn load whose working set exceeds the GPU KV pool\n",
             "Turn 0 is every session's first visit (a cold prefill in every mode); turns 1 on are the revisits "
             "an offload tier can serve. Hit rates: `*_log_last` is the server log's last stats line (vLLM's "
             "rolling window over the most recent 1000 requests), `*_metrics_run` the per-run rate from the "
             "`/metrics` counter deltas, `cached_pct_usage` the share of prompt tokens the responses reported as "
             "cached. Per-turn figures are in `offload_turns.csv`.\n"]
    for chart in (offload_ttft_chart(turns, root / "offload_ttft.png"),
                  offload_turn_wall_chart(turns, root / "offload_turn_wall.png")):
        if chart is not None:
            lines.append(f"![{chart.stem}]({chart.name})\n")
    shown = frame[frame["status"].isin(["ok", "failed"])]
    if len(shown):
        cols = ["mode", "repeat", "status", "ttft_median_turn0_s", "ttft_median_revisit_s",
                "turn_wall_median_revisit_s", "prefix_hit_pct_log_last", "external_hit_pct_log_last",
                "prefix_hit_pct_metrics_run", "external_hit_pct_metrics_run", "quality", "ws_over_hbm"]
        lines.append(markdown_table(shown[[c for c in cols if c in shown.columns]]))
        if not turns.empty:
            lines.append(_per_turn_medians(turns))
        if transfers := _transfers(shown):
            lines.append(transfers)
        if against := _against_limits(shown, root):
            lines.append(against)
        if ladder := ladder_section(shown):
            lines.append(ladder)
        notes = shown.dropna(subset=["tier_note"]) if "tier_note" in shown else shown.iloc[0:0]
        if len(notes):
            lines.append("\nWorking set per trial:\n")
            for r in notes.itertuples():
                sizes = getattr(r, "sizing_note", None)
                extra = f"; sizes: {sizes}" if isinstance(sizes, str) and sizes else ""
                lines.append(f"- {r.mode} r{r.repeat}: {r.tier_note}{extra}")
            lines.append("")
        weights = shown.dropna(subset=["weights"]) if "weights" in shown else shown.iloc[0:0]
        if len(weights):
            lines.append(f"Weights: {'; '.join(sorted(set(weights['weights'])))}.\n")
    return "\n".join(lines)
