"""``offload``: a multi-turn chat load whose working set exceeds the GPU KV pool, per offload mode.

Each mode is an engine configuration rendered from data (``recipe`` in the trial's params, so
plan.json shows the exact flags and environment): no offload, vLLM's native CPU tier, LMCache
(CPU or disk), or the OffloadingConnector's ``TieringOffloadingSpec`` (a RAM tier, then a
file-system tier). Phases: ``prepare`` (the mode's preconditions, then the preflight that protects
the node, then the launch file), ``measure`` (``nodetools.offload_run``: engines up, ``/metrics``,
the load, ``/metrics`` again, the quality check, stop) and ``collect`` (always: stop leftovers,
remove the trial's offload files, fetch everything).

``collect`` reports hit rates two ways and labels them: the last periodic stats line of the
server log (vLLM's rolling window over the most recent 1000 requests) and the per-run rate from
the ``/metrics`` counter deltas; plus the ``cached_tokens`` share from the responses' ``usage``,
the working-set arithmetic (sessions x context against the KV capacity the log states, and the
host tier), TTFT and turn wall times per turn, and the quality check.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from runner.errors import ParseError
from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.files import atomic_write_text
from runner.markdown import markdown_table
from runner.parse.metrics import parse_metrics_text, prefix_cache_run_rates
from runner.parse.vllm_log import parse_log_file, parse_log_text

__all__ = ["KIND", "RECIPES", "working_set"]

PLAYBOOKS = "playbooks/experiments/offload"
TRIAL_FS_DIR = "{trial_fs_dir}"  # replaced by the playbook with this trial's own folder of the fs tier

# The mode table. ``args`` are vllm serve flags (values may be computed from the mode's
# parameters, see _recipe), ``env`` its environment. ``min_version``: the vLLM release that
# first accepts the configuration (older engines skip the mode with that reason). ``shm``: vLLM's
# native backend maps its buffer under /dev/shm. ``standin``: why the stand-in cannot rehearse it.
RECIPES: dict[str, dict[str, Any]] = {
    "hbm_only": {"summary": "no offload: the GPU prefix cache only"},
    "native_cpu": {"summary": "--kv-offloading-backend native --kv-offloading-size <GiB>",
                   # cpu_bytes_to_use behind --kv-offloading-size: vLLM PR #24498 (Sep 2025). Verify
                   # against the pinned engine.
                   "min_version": "0.11.0", "shm": True},
    "lmcache_cpu": {"summary": "LMCacheConnectorV1, LMCACHE_LOCAL_CPU with LMCACHE_MAX_LOCAL_CPU_SIZE GB"},
    "lmcache_disk": {"summary": "LMCacheConnectorV1 with a CPU buffer and LMCACHE_LOCAL_DISK",
                     "standin": "the stand-in does not model LMCache's local disk backend"},
    "tiered": {"summary": "OffloadingConnector + TieringOffloadingSpec: a RAM tier, then a file-system tier",
               # vllm.v1.kv_offload.tiering ships since v0.22.0.
               "min_version": "0.22.0", "shm": True},
}
_COMMON_ARGS = {"enable-prompt-tokens-details": True}  # usage.prompt_tokens_details.cached_tokens, per request


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WorkloadParams(_Strict):
    """The load (defaults: the reference campaign's 32 sessions x ~100K tokens, 8 in flight, 6 turns)."""

    sessions: int = Field(default=32, ge=1)
    history_tokens: int = Field(default=100_000, ge=0, description="each session's history before turn 0")
    concurrency: int = Field(default=8, ge=1, description="requests in flight")
    turns: int = Field(default=6, ge=1)
    turn_tokens: int = Field(default=2_400, ge=0, description="new user tokens per turn")
    output_tokens: int = Field(default=400, ge=1, description="forced with min_tokens + ignore_eos")
    seed: int = 0
    request_timeout_s: float = Field(default=600, gt=0)
    max_wall_s: float = Field(default=2400, gt=0,
                              description="cap on the whole load (the reference campaign's LMCache run: 40 min)")
    retries: int = Field(default=0, ge=0, description="off by default: a failed request is a recorded failure")
    max_failed_requests: int = Field(default=0, ge=0, description="more failed or unsent requests fail the trial")

    def context_tokens(self) -> int:
        return self.history_tokens + self.turns * (self.turn_tokens + self.output_tokens)


class QualityParams(_Strict):
    """Multi-turn arithmetic over a shared document (the reference campaign: 24 questions), plus a loop check."""

    enabled: bool = True
    conversations: int = Field(default=8, ge=1)
    turns: int = Field(default=3, ge=1)
    doc_tokens: int = Field(default=6000, ge=100)
    max_tokens: int = Field(default=256, ge=16)
    seed: int = 0
    request_timeout_s: float = Field(default=300, gt=0)
    concurrency: int = Field(default=4, ge=1, description="conversations in flight")


class OffloadParams(ModeParams):
    workload: WorkloadParams = WorkloadParams()
    quality: QualityParams = QualityParams()
    engine_copies: int = Field(default=1, ge=1, description="engines started side by side on the node, "
                               "each on an equal share of engine.gpus (the reference campaign's gpt-oss run: 4)")
    cleanup: bool = Field(default=False, description="remove stale /dev/shm/vllm_offload_* files and leftover "
                          "engine containers instead of refusing to run")
    ready_timeout_s: float = Field(default=1800, gt=0, description="per engine copy, from start to first answer")
    RECIPE: ClassVar[dict[str, Any]] = {}
    MODE: ClassVar[str] = ""

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        return {}, {}, 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recipe(self) -> dict[str, Any]:
        args, env, host_gib = self._offload()
        return {"mode": self.MODE, "summary": self.RECIPE["summary"], "args": {**_COMMON_ARGS, **args}, "env": env,
                "host_gib_per_copy": host_gib, "shm": bool(self.RECIPE.get("shm")),
                "fs": isinstance(self, _FsTier), "min_version": self.RECIPE.get("min_version", ""),
                "standin": self.RECIPE.get("standin", ""), "image": getattr(self, "image", "")}


class HbmOnlyParams(OffloadParams):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["hbm_only"]
    MODE: ClassVar[str] = "hbm_only"


class _HostTier(OffloadParams):
    offload_gib: float = Field(default=200, gt=0,
                               description="host RAM per engine copy (the reference campaign: 200 GiB)")
    ram_safety_factor: float = Field(
        default=2.0, ge=1.0, description="host RAM the preflight reserves per requested GiB: vLLM issue 53042 "
        "measured 1.92x the requested size as unreclaimable shared memory")


class _FsTier(_HostTier):
    fs_dir: str = Field(default="", description="folder of the file-system tier on the node (the RAID); the "
                        "trial uses its own subfolder and removes it afterwards; empty: the trial's work folder")
    fs_gib: float = Field(default=100, gt=0, description="free space the file-system tier must find there")


class NativeCpuParams(_HostTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["native_cpu"]
    MODE: ClassVar[str] = "native_cpu"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        return {"kv-offloading-backend": "native", "kv-offloading-size": self.offload_gib}, {}, self.offload_gib


def _lmcache_env(cpu_gib: float, chunk_size: int) -> dict[str, str]:
    return {"LMCACHE_CHUNK_SIZE": str(chunk_size), "LMCACHE_LOCAL_CPU": "True",
            "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{cpu_gib:g}"}


_LMCACHE_ARGS = {"kv-transfer-config": {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}}


class _LmcacheImage(_Strict):
    image: str = Field(default="", description="docker image with LMCache inside (the reference campaign: "
                       "lmcache/vllm-openai:v0.5.6rc3); empty: the campaign's engine image")
    chunk_size: int = Field(default=256, ge=16, description="LMCACHE_CHUNK_SIZE: a multiple of the model's block")


class LmcacheCpuParams(_LmcacheImage, _HostTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["lmcache_cpu"]
    MODE: ClassVar[str] = "lmcache_cpu"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        return dict(_LMCACHE_ARGS), _lmcache_env(self.offload_gib, self.chunk_size), self.offload_gib


class LmcacheDiskParams(_LmcacheImage, _FsTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["lmcache_disk"]
    MODE: ClassVar[str] = "lmcache_disk"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        env = {**_lmcache_env(self.offload_gib, self.chunk_size), "LMCACHE_LOCAL_DISK": f"file://{TRIAL_FS_DIR}/",
               "LMCACHE_MAX_LOCAL_DISK_SIZE": f"{self.fs_gib:g}"}
        return dict(_LMCACHE_ARGS), env, self.offload_gib


class TieredParams(_FsTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["tiered"]
    MODE: ClassVar[str] = "tiered"
    eviction_policy: Literal["lru", "arc"] = "lru"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": int(self.offload_gib * 2**30),
                 "eviction_policy": self.eviction_policy,
                 "secondary_tiers": [{"type": "fs", "root_dir": TRIAL_FS_DIR, "n_read_threads": 32,
                                      "n_write_threads": 16}]}
        config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
        return {"kv-transfer-config": config}, {}, self.offload_gib


MODES: dict[str, type[OffloadParams]] = {
    "hbm_only": HbmOnlyParams, "native_cpu": NativeCpuParams, "lmcache_cpu": LmcacheCpuParams,
    "lmcache_disk": LmcacheDiskParams, "tiered": TieredParams,
}


def _resources(ctx: TrialContext) -> Resources:
    # The trial pins host RAM and drives the GPUs at full load: the node is the trial's.
    recipe = ctx.params.get("recipe") or {}
    ram = float(recipe.get("host_gib_per_copy") or 0) * int(ctx.params.get("engine_copies") or 1)
    ram *= float(ctx.params.get("ram_safety_factor") or 1.0)
    return Resources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True, host_ram_gib=round(ram, 2))


# --- collect -------------------------------------------------------------------------------------


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


def _copy_logs(raw: Path) -> list[Path]:
    """Copy 0's server.log, then the other copies' ``server.c<i>.log``, in order."""
    extra = sorted(raw.glob("server.c*.log"), key=lambda p: int(p.name.split(".")[1][1:]))
    return [raw / "server.log", *extra]


def _parsed_log(path: Path) -> dict[str, Any]:

    if not path.is_file():
        return {}
    try:
        return parse_log_file(path)
    except ParseError:
        return {}


def _log_hit_rates(path: Path, load_end: int | None) -> dict[str, float]:
    """The hit rates of the server log's last stats line written during the load (copy 0).

    vLLM's rates are token-weighted over its most recent 1000 requests, so a line written after
    the load would also count the quality check's requests: the log is cut where the load ended."""

    if not path.is_file():
        return {}
    data = path.read_bytes()
    text = data[:load_end].decode(errors="replace") if load_end else data.decode(errors="replace")
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


def _metric_rates(raw: Path) -> dict[str, float]:
    """Per-run hit rates from the /metrics deltas, hits and queries summed over engine copies; and
    external hit tokens per tier where the engine counts them (the stand-in does), which says
    whether a tier below host RAM was reached, measured rather than inferred."""

    totals: dict[str, float] = {}
    for before in sorted(raw.glob("metrics_before*.txt")):
        after = raw / before.name.replace("before", "after")
        if not after.is_file():
            continue
        first = parse_metrics_text(before.read_text(), source=str(before))
        last = parse_metrics_text(after.read_text(), source=str(after))
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


_STANDIN_HOST_TIER = re.compile(r"\[stand-in\] host-RAM KV tier: [\d.]+ GiB = ([\d,]+) tokens")


def _host_tier_tokens(logs: list[Path], host_gib: float, kv_tokens: int | None, kv_gib: float | None,
                      config_bytes: int | None = None, blocks_overridden: bool = False) -> tuple[int, str]:
    """The host tier's capacity in tokens, and where the figure comes from.

    The stand-in states it in its log. For vLLM it is the tier's GiB over the KV bytes of a token:
    from the model's config where the node could read it (the same KV layout in RAM), else from the
    log's ``Available KV cache memory`` over ``GPU KV cache size`` -- which means nothing once
    ``--num-gpu-blocks-override`` sizes the pool, so then there is no estimate."""
    stated = [int(m.group(1).replace(",", "")) for p in logs if p.is_file()
              for m in _STANDIN_HOST_TIER.finditer(p.read_text(errors="replace"))]
    if stated:
        return sum(stated), "log"
    if host_gib and config_bytes:
        return int(host_gib * 2**30 / config_bytes), "estimate from the model's KV bytes per token"
    if host_gib and kv_tokens and kv_gib and not blocks_overridden:
        return int(host_gib * kv_tokens / kv_gib), "estimate from GPU bytes per token"
    return 0, ""


def working_set(context_tokens: int, sessions: int, kv_tokens: int | None, host_tokens: int) -> dict[str, Any]:
    """Sessions x context against the GPU KV capacity and the host tier, in words too."""
    ws = context_tokens
    out: dict[str, Any] = {"working_set_tokens": ws, "sessions": sessions}
    if not kv_tokens:
        out["tier_note"] = "KV capacity unknown (no 'GPU KV cache size' line in the log)"
        return out
    out["kv_cache_tokens"] = kv_tokens
    out["ws_over_hbm"] = round(ws / kv_tokens, 3)
    if host_tokens:
        out["host_tier_tokens"] = host_tokens
        out["ws_over_hbm_plus_host"] = round(ws / (kv_tokens + host_tokens), 3)
    if ws <= kv_tokens:
        note = (f"working set {ws:,} tokens fits the GPU KV pool ({kv_tokens:,}): no offload tier can be reached, "
                "the GPU prefix cache serves the revisits")
    elif not host_tokens:
        note = (f"working set {ws:,} tokens is {ws / kv_tokens:.2f}x the GPU KV pool ({kv_tokens:,}): an LRU "
                "prefix cache visited round-robin evicts each session before it returns")
    elif ws <= kv_tokens + host_tokens:
        note = (f"working set {ws:,} tokens exceeds the GPU KV pool ({kv_tokens:,}, {ws / kv_tokens:.2f}x) but fits "
                f"GPU + host tier (~{host_tokens:,}): a tier below host RAM cannot be reached")
    else:
        note = (f"working set {ws:,} tokens exceeds GPU ({kv_tokens:,}) + host tier (~{host_tokens:,}): "
                "a file-system tier can be reached")
    out["tier_note"] = note
    return out


def _quality(summary: Mapping[str, Any] | None) -> dict[str, Any]:
    if not summary:
        return {"quality": "not run"}
    if not summary.get("applicable"):
        why = summary.get("why_not") or f"not applicable to engine {summary.get('engine')}"
        return {"quality": f"n/a ({why})"}
    total, correct, looping = summary["total"], summary["correct"], summary["looping"]
    return {"quality": f"{correct}/{total} correct, {looping}/{total} looping", "quality_correct": correct,
            "quality_total": total, "quality_looping": looping, "quality_failed_requests": summary["failed_requests"]}


def _load_figures(raw: Path) -> tuple[dict[str, Any], Any]:
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
    return out, turns


def _round(value: Any, digits: int = 4) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else round(number, digits)  # NaN is no figure


def _collect(ctx: TrialContext) -> dict[str, Any]:
    raw = _raw(ctx)
    run = json.loads((raw / "run.json").read_text())
    metrics, _ = _load_figures(raw)
    logs = [_parsed_log(p) for p in _copy_logs(raw)]
    metrics.update(_log_hit_rates(raw / "server.log", (run.get("log_offsets") or [{}])[0].get("load_end")))
    rates = _metric_rates(raw)
    if "prefix_cache" in rates:
        metrics["prefix_hit_pct_metrics_run"] = rates["prefix_cache"]
    if "external_prefix_cache" in rates:
        metrics["external_hit_pct_metrics_run"] = rates["external_prefix_cache"]
    for key, value in rates.items():
        if key.startswith("tier_"):
            metrics[f"external_hit_tokens_{key[5:]}"] = int(value)
    load = run.get("load") or {}
    params = ctx.params
    kv_tokens = sum(int(log["kv_cache_tokens"]) for log in logs if log.get("kv_cache_tokens")) or None
    kv_gib = sum(float(log["available_kv_cache_gib"]) for log in logs if log.get("available_kv_cache_gib")) or None
    copies = int(params.get("engine_copies") or 1)
    host_gib = float((params.get("recipe") or {}).get("host_gib_per_copy") or 0) * copies
    sessions = int((params.get("workload") or {}).get("sessions") or 0)
    # The live context the responses' usage counted (the planned one if the server reported none).
    live = metrics.pop("live_context_tokens")
    planned = WorkloadParams(**(params.get("workload") or {})).context_tokens() * sessions
    metrics["working_set_planned_tokens"] = planned
    overridden = "num-gpu-blocks-override" in (ctx.engine.get("args") or {})
    host_tokens, source = _host_tier_tokens(_copy_logs(raw), host_gib, kv_tokens, kv_gib,
                                            run.get("kv_bytes_per_token"), overridden)
    if source:
        metrics["host_tier_source"] = source
    metrics.update(working_set(live or planned, sessions, kv_tokens, host_tokens))
    if host_gib and not host_tokens and kv_tokens:
        metrics["tier_note"] += (f"; the {host_gib:g} GiB host tier's size in tokens is unknown (no model config read "
                                 "on the node, and --num-gpu-blocks-override hides the GPU's bytes per token)")
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
    return {k: v for k, v in metrics.items() if v is not None}


_OOM_KILL = re.compile(r"Out of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")


def _diagnose(ctx: TrialContext) -> str:
    """For a failed trial: what the run said, the engine's parsed errors, the kernel's, the log tail."""
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
    labels = sorted({e for p in _copy_logs(raw) for e in _parsed_log(p).get("errors") or ()})
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


# --- report --------------------------------------------------------------------------------------

_REPORT_COLUMNS = (
    "ttft_median_turn0_s", "ttft_median_revisit_s", "ttft_p90_revisit_s", "turn_wall_median_revisit_s",
    "prefix_hit_pct_log_last", "external_hit_pct_log_last", "prefix_hit_pct_metrics_run",
    "external_hit_pct_metrics_run", "cached_pct_usage", "external_hit_tokens_cpu", "external_hit_tokens_fs",
    "requests_ok", "requests_failed", "requests_not_sent", "turns_completed", "quality", "quality_correct",
    "quality_total", "quality_looping", "working_set_tokens", "working_set_planned_tokens", "kv_cache_tokens",
    "ws_over_hbm", "host_tier_tokens", "host_tier_source", "ws_over_hbm_plus_host", "tier_note", "ready_s",
    "load_wall_s", "barrier_ok", "gen_loop_lag_p99_ms", "gen_cpu_s", "log_errors",
)


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    metrics = record.get("metrics") or {}
    return [{k: metrics.get(k) for k in _REPORT_COLUMNS}]


def _turn_rows(frame: Any, root: Path) -> list[dict[str, Any]]:
    """Per trial and turn, from each trial's requests.jsonl: ok trials, and the finished turns of a
    trial that stopped early (its status says so)."""
    from runner.parse.loadgen import read_requests, turn_table  # noqa: PLC0415 - pulls in pandas

    rows: list[dict[str, Any]] = []
    for trial in frame.itertuples():
        path = root / "trials" / str(trial.trial_id) / "raw" / str(trial.host) / "requests.jsonl"
        if trial.status not in ("ok", "failed") or not path.is_file():
            continue
        try:
            turns = turn_table(read_requests(path))
        except ParseError:
            continue
        for turn in turns.to_dict("records"):
            rows.append({"trial_id": trial.trial_id, "mode": trial.mode, "repeat": trial.repeat,
                         "status": trial.status, **turn})
    return rows


def _section(frame: Any, root: Path) -> str:
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
        notes = shown.dropna(subset=["tier_note"]) if "tier_note" in shown else shown.iloc[0:0]
        if len(notes):
            lines.append("\nWorking set per trial:\n")
            lines.extend(f"- {r.mode} r{r.repeat}: {r.tier_note}" for r in notes.itertuples())
            lines.append("")
    return "\n".join(lines)


KIND = ExperimentKind(
    name="offload",
    summary="a multi-turn chat load over a working set larger than the GPU KV pool, per KV offload mode",
    phases=(
        Phase("prepare", f"{PLAYBOOKS}/prepare.yml"),
        Phase("measure", f"{PLAYBOOKS}/measure.yml", follow="server.log"),
        Phase("collect", f"{PLAYBOOKS}/collect.yml", always=True),
    ),
    modes=MODES,
    default_modes=("hbm_only", "native_cpu"),
    resources=_resources,
    collect=_collect,
    diagnose=_diagnose,
    needs_engine=True,
    report=KindReport("offload.csv", _rows, _section),
)
