"""An offload trial's figures, from the raw files its collect phase fetched.

Hit rates two ways, labelled: the last periodic stats line of the server log written during the
load (vLLM's rolling window over the most recent 1000 requests) and the per-run rate from the
``/metrics`` counter deltas; the ``cached_tokens`` share from the responses' ``usage``; the bytes
each tier moved and at what rate, where the engine counts them; the working set against the KV
capacity the log states and the tiers; TTFT and turn wall times; the quality check. A failed
trial's reason gets what the run, the engine log and the kernel said (``diagnose``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.errors import ParseError
from runner.experiments.base import TrialContext
from runner.experiments.offload.ladder import ladder_columns
from runner.experiments.offload.params import WorkloadParams
from runner.experiments.offload.setup import weights_label
from runner.experiments.offload.sizing import (
    GIB,
    host_tier_tokens,
    sizes_note,
    stated_host_tokens,
    store_refusals,
    working_set,
)

__all__ = ["collect", "diagnose", "kv_transfers"]


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


def copy_logs(raw: Path) -> list[Path]:
    """Copy 0's server.log, then the other copies' ``server.c<i>.log``, in order."""
    extra = sorted(raw.glob("server.c*.log"), key=lambda p: int(p.name.split(".")[1][1:]))
    return [raw / "server.log", *extra]


def _load_window(path: Path, offsets: Mapping[str, Any]) -> str:
    """The server log from where the load started to the stats line that covers its end."""
    if not path.is_file():
        return ""
    data = path.read_bytes()
    end = offsets.get("load_end") or len(data)
    return data[int(offsets.get("load_start") or 0):end].decode(errors="replace")


def _log_hit_rates(path: Path, load_end: int | None) -> dict[str, float]:
    """The hit rates of the server log's last stats line written during the load (copy 0).

    vLLM's rates are token-weighted over its most recent 1000 requests, so a line written after
    the load would also count the quality check's requests: the log is cut where the load ended."""
    if not path.is_file():
        return {}
    data = path.read_bytes()
    text = data[:load_end].decode(errors="replace") if load_end else data.decode(errors="replace")
    from runner.parse.vllm_log import parse_log_text  # noqa: PLC0415 - the log parser's patterns: when collecting, not at the runner's start
    try:
        log = parse_log_text(text, source=str(path))
    except ParseError:
        return {}
    out = {}
    for key, label in (("last_prefix_cache_hit_pct", "prefix_hit_pct_log_last"),
                       ("last_external_prefix_cache_hit_pct", "external_hit_pct_log_last")):
        if key in log:
            out[label] = log[key]
    return out


_TIER_COUNTER = re.compile(r'^[\w:]*external_hits_by_tier_total\{.*\btier="(\w+)"')
# vLLM's offloading connector: bytes and seconds per transfer type (GPU_to_CPU, CPU_to_GPU, ...).
_TRANSFER_COUNTER = re.compile(r'^vllm:kv_offload_total_(bytes|time)(?:_total)?\{.*\btransfer_type="(\w+)"')
# ... and the same in its periodic log line: "KV Transfer metrics: GPU_to_CPU_total_bytes=..., ..._total_time=..."
_TRANSFER_LOG = re.compile(r"KV Transfer metrics: (.*)$", re.MULTILINE)
_TRANSFER_FIELD = re.compile(r"\b(\w+?)_total_(bytes|time)=([0-9.eE+-]+)")
# LMCache counts its own copies, one line per request (cache_engine.py; "GB" there is GiB: 8,192
# tokens of 256 KiB log "size: 2.0000 GB"): "Stored 8192 out of total 8192 tokens. size: 2.0000 GB,
# cost 447.7697 ms" (GPU -> its CPU tier) and "Retrieved 12288 out of 12288 required tokens (...).
# size: 3.0000 gb, cost 1292.7225 ms" (its tier -> GPU).
_LMCACHE_COPY = re.compile(r"\b(Stored|Retrieved) \d+ out of [^.]*\.[^\n]*?size: ([0-9.]+) gb, cost ([0-9.]+) ms",
                           re.IGNORECASE)
_LMCACHE_DIRECTION = {"stored": "gpu_to_cpu", "retrieved": "cpu_to_gpu"}


def _metric_pairs(raw: Path) -> list[tuple[dict[str, float], dict[str, float]]]:
    from runner.parse.metrics import parse_metrics_text  # noqa: PLC0415 - prometheus_client (0.1 s): when collecting, not at the runner's start
    pairs = []
    for before in sorted(raw.glob("metrics_before*.txt")):
        after = raw / before.name.replace("before", "after")
        if after.is_file():
            pairs.append((parse_metrics_text(before.read_text(), source=str(before)),
                          parse_metrics_text(after.read_text(), source=str(after))))
    return pairs


def _metric_rates(pairs: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, float]:
    """Per-run hit rates from the /metrics deltas, hits and queries summed over engine copies; and
    external hit tokens per tier where the engine counts them (the stand-in does), which says
    whether a tier below host RAM was reached, measured rather than inferred."""
    from runner.parse.metrics import prefix_cache_run_rates  # noqa: PLC0415 - prometheus_client (0.1 s): when collecting, not at the runner's start
    totals: dict[str, float] = {}
    for first, last in pairs:
        for key, value in prefix_cache_run_rates(first, last).items():
            if not key.endswith("_pct"):
                totals[key] = totals.get(key, 0.0) + value
        for key, value in last.items():
            if m := _TIER_COUNTER.match(key):
                name = f"tier_{m.group(1)}"
                totals[name] = totals.get(name, 0.0) + value - first.get(key, 0.0)
    out = {k: v for k, v in totals.items() if k.startswith("tier_")}
    for prefix in ("prefix_cache", "external_prefix_cache"):
        queries = totals.get(f"{prefix}_queries")
        if queries:
            out[prefix] = round(100.0 * totals[f"{prefix}_hits"] / queries, 2)
    return out


def kv_transfers(pairs: list[tuple[dict[str, float], dict[str, float]]], windows: list[str]) -> dict[str, Any]:
    """Bytes each KV transfer type moved during the load, the seconds it took and the rate (GB/s),
    summed over engine copies: from the ``/metrics`` counter deltas, else from the connector's log
    lines of the load (one per stats interval), else from LMCache's own lines (one per request).
    Empty when the engine counts no transfers."""
    moved: dict[str, dict[str, float]] = {}
    source = "metrics"
    for first, last in pairs:
        for key, value in last.items():
            if m := _TRANSFER_COUNTER.match(key):
                what, kind = m.group(2).lower(), m.group(1)
                moved.setdefault(what, {}).setdefault(kind, 0.0)
                moved[what][kind] += value - first.get(key, 0.0)
    if not moved:
        source = "log"
        for text in windows:
            for line in _TRANSFER_LOG.finditer(text):
                for what, kind, value in _TRANSFER_FIELD.findall(line.group(1)):
                    moved.setdefault(what.lower(), {}).setdefault(kind, 0.0)
                    moved[what.lower()][kind] += float(value)
    if not moved:
        source = "lmcache log"
        for text in windows:
            for verb, gib, ms in _LMCACHE_COPY.findall(text):
                figures = moved.setdefault(_LMCACHE_DIRECTION[verb.lower()], {"bytes": 0.0, "time": 0.0})
                figures["bytes"] += float(gib) * 2**30
                figures["time"] += float(ms) / 1000
    out: dict[str, Any] = {}
    for what, figures in sorted(moved.items()):
        size, seconds = figures.get("bytes", 0.0), figures.get("time", 0.0)
        out[f"kv_{what}_gb"] = round(size / 1e9, 3)
        if seconds > 0:
            out[f"kv_{what}_s"] = round(seconds, 3)
            out[f"kv_{what}_gb_s"] = round(size / 1e9 / seconds, 2)
    if out:
        out["kv_transfer_source"] = source
    return out


# /proc/<pid>/io counter -> the row's column (engine_file_io).
_IO_COLUMNS = {"rchar": "engine_file_read_gb", "read_bytes": "engine_disk_read_gb",
               "wchar": "engine_file_write_gb", "write_bytes": "engine_disk_write_gb"}
ENGINE_FILE_IO = tuple(_IO_COLUMNS.values())


def engine_file_io(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the engines' processes read and wrote during the load (GB, decimal), summed over the
    copies and over the processes alive both before and after it, from their ``/proc/<pid>/io``:
    ``engine_file_read_gb`` through read() (page cache hits included, so a file-system KV tier read
    back from RAM counts; pipes and sockets too, the engines' own traffic: megabytes),
    ``engine_disk_read_gb`` what the storage itself moved, and the same for writes. Empty when
    nothing was counted (a container's engine, a copy that died)."""
    totals = dict.fromkeys(_IO_COLUMNS, 0)
    counted = False
    for copy in run.get("file_io") or ():
        before = (copy.get("before") or {}).get("processes") or {}
        after = (copy.get("after") or {}).get("processes") or {}
        for key in before.keys() & after.keys():
            counted = True
            for field in _IO_COLUMNS:
                totals[field] += max(0, int(after[key].get(field, 0)) - int(before[key].get(field, 0)))
    if not counted:
        return {}
    return {name: round(totals[field] / 1e9, 3) for field, name in _IO_COLUMNS.items()}


def _quality(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    if not summary:
        return {"quality": "not run"}
    if not summary.get("applicable"):
        why = summary.get("why_not") or f"not applicable to engine {summary.get('engine')}"
        return {"quality": f"n/a ({why})"}
    total, correct, looping = summary["total"], summary["correct"], summary["looping"]
    return {"quality": f"{correct}/{total} correct, {looping}/{total} looping", "quality_correct": correct,
            "quality_total": total, "quality_looping": looping, "quality_failed_requests": summary["failed_requests"]}


def _load_figures(raw: Path) -> dict[str, Any]:
    from runner.parse.loadgen import (  # noqa: PLC0415 - pulls in pandas (~1 s): only when collecting
        barrier_violations,
        read_requests,
        session_context_tokens,
        turn_table,
    )

    frame = read_requests(raw / "requests.jsonl")
    turns = turn_table(frame)
    final = frame[frame["final"]]
    ok = final[final["status"] == "ok"]
    revisits = ok[ok["turn"] >= 1]
    out: dict[str, Any] = {
        "requests_ok": len(ok), "requests_failed": int((final["status"] == "failed").sum()),
        "requests_not_sent": int((final["status"] == "not_sent").sum()),
        "ttft_median_turn0_s": _round(ok[ok["turn"] == 0]["ttft_s"].median()),
        "ttft_median_revisit_s": _round(revisits["ttft_s"].median()),
        "ttft_p90_revisit_s": _round(revisits["ttft_s"].quantile(0.9)) if len(revisits) else None,
        "turn_wall_median_revisit_s": _round(turns[turns["turn"] >= 1]["turn_wall_s"].median()),
        "barrier_ok": not barrier_violations(frame),
        "live_context_tokens": session_context_tokens(frame),
    }
    cached = ok.dropna(subset=["cached_tokens"])
    if len(cached) and cached["prompt_tokens"].sum():
        out["cached_pct_usage"] = round(100.0 * cached["cached_tokens"].sum() / cached["prompt_tokens"].sum(), 2)
    return out


def _round(value: Any, digits: int = 4) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else round(number, digits)  # NaN is no figure


def _tiers(ctx: TrialContext, raw: Path, run: Mapping[str, Any], logs: list[dict[str, Any]],
           live: int, refused: int) -> dict[str, Any]:
    """The working set against the GPU pool the log states and the tiers, in numbers and words."""
    params = ctx.params
    recipe = params.get("recipe") or {}
    kv_tokens = sum(int(log["kv_cache_tokens"]) for log in logs if log.get("kv_cache_tokens")) or None
    kv_gib = sum(float(log["available_kv_cache_gib"]) for log in logs if log.get("available_kv_cache_gib")) or None
    copies = int(params.get("engine_copies") or 1)
    host_gib = float(recipe.get("host_gib_per_copy") or 0) * copies
    sessions = int((params.get("workload") or {}).get("sessions") or 0)
    planned = WorkloadParams(**(params.get("workload") or {})).workload().working_set_tokens()
    overridden = "num-gpu-blocks-override" in (ctx.engine.get("args") or {})
    kv_bytes = run.get("kv_bytes_per_token")
    host_tokens, source = host_tier_tokens(stated_host_tokens(copy_logs(raw)), host_gib, kv_tokens, kv_gib,
                                           kv_bytes, overridden)
    fs_gib = float(params.get("fs_gib") or 0) if recipe.get("fs") else 0.0
    fs_tokens = int(fs_gib * GIB / kv_bytes) if kv_bytes and fs_gib else 0
    out: dict[str, Any] = {"working_set_planned_tokens": planned, "kv_bytes_per_token": kv_bytes}
    if source:
        out["host_tier_source"] = source
    if fs_tokens:
        out["fs_tier_tokens"] = fs_tokens
    ws = live or planned
    out.update(working_set(ws, sessions, kv_tokens, host_tokens, bool(recipe.get("fs"))))
    if refused and host_gib:
        out["offload_store_refused"] = refused
        out["tier_note"] = (out.get("tier_note", "") + f"; the engine refused to store blocks {refused:,} times "
                            "('cannot store blocks'): the RAM tier had no room for the requests in flight, so "
                            "what it refused was never offloaded").lstrip("; ")
    if host_gib and not host_tokens and kv_tokens:
        out["tier_note"] += (f"; the {host_gib:g} GiB host tier's size in tokens is unknown (no model config read "
                             "on the node, and --num-gpu-blocks-override hides the GPU's bytes per token)")
    if kv_bytes:
        out["working_set_gib"] = round(ws * kv_bytes / GIB, 2)
    out["sizing_note"] = sizes_note(kv_bytes, "the model's config on the node" if kv_bytes else "", kv_tokens, ws,
                                    host_gib, host_tokens, fs_gib, fs_tokens)
    return out


def collect(ctx: TrialContext) -> dict[str, Any]:
    from runner.parse.vllm_log import parse_log_if_any  # noqa: PLC0415 - the log parser's patterns: when collecting, not at the runner's start
    raw = _raw(ctx)
    run = json.loads((raw / "run.json").read_text())
    metrics = _load_figures(raw)
    logs = [parse_log_if_any(p) for p in copy_logs(raw)]
    offsets = run.get("log_offsets") or [{}]
    metrics.update(_log_hit_rates(raw / "server.log", offsets[0].get("load_end")))
    pairs = _metric_pairs(raw)
    rates = _metric_rates(pairs)
    if "prefix_cache" in rates:
        metrics["prefix_hit_pct_metrics_run"] = rates["prefix_cache"]
    if "external_prefix_cache" in rates:
        metrics["external_hit_pct_metrics_run"] = rates["external_prefix_cache"]
    for key, value in rates.items():
        if key.startswith("tier_"):
            metrics[f"external_hit_tokens_{key[5:]}"] = int(value)
    windows = [_load_window(path, offsets[i] if i < len(offsets) else {}) for i, path in enumerate(copy_logs(raw))]
    metrics.update(kv_transfers(pairs, windows))
    metrics.update(engine_file_io(run))
    metrics.update(_tiers(ctx, raw, run, logs, metrics.pop("live_context_tokens"), store_refusals(windows)))
    load = run.get("load") or {}
    metrics["weights"] = weights_label(ctx.engine) or None
    metrics["ready_s"] = run.get("ready_s")
    metrics["load_wall_s"] = load.get("load_wall_s")
    metrics["turns_completed"] = load.get("turns_completed")
    lag = load.get("loop_lag_ms") or {}
    metrics["gen_loop_lag_p99_ms"] = lag.get("p99_ms")
    metrics["gen_cpu_s"] = load.get("client_cpu_s")
    metrics.update(_quality(run.get("quality")))
    errors = sorted({e for log in logs for e in log.get("errors") or ()})
    if errors:
        metrics["log_errors"] = ",".join(errors)
    metrics.update(ladder_columns(ctx, raw, run, metrics, pairs, copy_logs(raw)))
    return {k: v for k, v in metrics.items() if v is not None}


_OOM_KILL = re.compile(r"Out of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")


def diagnose(ctx: TrialContext) -> str:
    """For a failed trial: what the run said, the engine's parsed errors, the kernel's, the log tail."""
    from runner.parse.vllm_log import parse_log_if_any  # noqa: PLC0415 - the log parser's patterns: when collecting, not at the runner's start
    raw = _raw(ctx)
    parts = []
    run_file = raw / "run.json"
    if run_file.is_file():
        run = json.loads(run_file.read_text())
        counts = (run.get("load") or {}).get("counts")
        if counts:
            parts.append(f"requests: {counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed, "
                         f"{counts.get('not_sent', 0)} not sent")
        errors = _first_request_error(raw / "requests.jsonl")
        if errors:
            parts.append(f"first request error: {errors}")
    labels = sorted({e for p in copy_logs(raw) for e in parse_log_if_any(p).get("errors") or ()})
    if labels:
        parts.append(f"engine errors: {', '.join(labels)}")
    dmesg = raw / "dmesg.txt"
    if dmesg.is_file():
        killed = _OOM_KILL.findall(dmesg.read_text(errors="replace"))
        if killed:
            parts.append("kernel OOM killer killed: " + ", ".join(f"{name} (pid {pid})" for pid, name in killed))
    path = raw / "server.log"
    if path.is_file():
        tail = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()][-3:]
        if tail:
            parts.append("log tail: " + " | ".join(tail))
    return "; ".join(parts)


def _first_request_error(path: Path) -> str:
    if not path.is_file():
        return ""
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("status") == "failed" and record.get("error"):
            return f"session {record.get('session')} turn {record.get('turn')}: {record['error']}"
    return ""
