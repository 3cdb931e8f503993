"""The working set against the KV tiers, in tokens and bytes: planned from the campaign, then from the run.

An offload tier can only be measured when the load's live context exceeds what sits above it:
the GPU pool for a RAM tier, GPU + RAM for a file-system tier (the reference campaign's RAID tier
was configured and never reached). The bytes per token come from the model's config (2 x layers
x KV heads x head_dim x dtype bytes): at plan time from a rehearsal preset's shape, after the run
from the ``config.json`` the node read (``run.json``), never from a pool that
``--num-gpu-blocks-override`` sized.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodetools.loadgen.workload import with_chat_template
from nodetools.model_shapes import PRESETS
from runner.experiments.launch import engine_arg
from runner.experiments.offload.params import WorkloadParams

__all__ = ["GIB", "VLLM_BLOCK_TOKENS", "engine_arg", "host_tier_tokens", "plan_sizing", "sizes_note",
           "staging_shortfall", "stated_host_tokens", "store_refusals", "unreached_tier", "working_set"]

GIB = 2**30
_STANDIN_HOST_TIER = re.compile(r"\[stand-in\] host-RAM KV tier: [\d.]+ GiB = ([\d,]+) tokens")
VLLM_BLOCK_TOKENS = 16  # vLLM's KV block on CUDA unless engine.args block-size says otherwise
# vLLM's scheduler when the offload tier has no room for a request's blocks (they are not offloaded).
_STORE_REFUSED = re.compile(r"Request \S+: cannot store blocks")


def _int(value: Any) -> int | None:
    try:
        number = int(float(value))
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _kv_bytes(engine: Mapping[str, Any]) -> tuple[int | None, str]:
    """KV bytes per token known before the run: the stand-in's knob, or a rehearsal preset's shape."""
    if engine.get("kind") == "stand-in":
        value = _int((engine.get("env") or {}).get("STANDIN_OFFLOAD_BYTES_PER_TOKEN"))
        return value, "the stand-in's STANDIN_OFFLOAD_BYTES_PER_TOKEN" if value else ""
    preset = PRESETS.get(str(engine.get("rehearsal_model") or ""))
    if preset is None:
        return None, ""
    dtype = str(engine_arg(engine.get("args") or {}, "kv-cache-dtype") or "auto")
    return preset.kv_bytes_per_token(dtype), f"the {engine['rehearsal_model']} preset's config"


def _pool_tokens(engine: Mapping[str, Any], copies: int) -> tuple[int | None, str]:
    """The GPU KV pool the campaign fixes (every copy's), or None when the engine sizes it itself."""
    if engine.get("kind") == "stand-in":
        per_copy = _int((engine.get("env") or {}).get("STANDIN_KV_CAPACITY_TOKENS"))
        return (per_copy * copies, "STANDIN_KV_CAPACITY_TOKENS") if per_copy else (None, "")
    args = engine.get("args") or {}
    blocks = _int(engine_arg(args, "num-gpu-blocks-override"))
    if not blocks:
        return None, ""
    block = _int(engine_arg(args, "block-size")) or VLLM_BLOCK_TOKENS
    return blocks * block * copies, f"--num-gpu-blocks-override {blocks} x {block}-token blocks"


def _gib(tokens: int, kv_bytes: int | None) -> str:
    return f" ({tokens * kv_bytes / GIB:.1f} GiB)" if kv_bytes else ""


def sizes_note(kv_bytes: int | None, kv_source: str, pool: int | None, ws: int, host_gib: float,
               host_tokens: int, fs_gib: float, fs_tokens: int) -> str:
    """The tiers in words: KV bytes a token, the pool, the working set and each tier's size."""
    parts = []
    if kv_bytes:
        parts.append(f"KV {kv_bytes / 1024:g} KiB a token ({kv_source})")
    if pool:
        parts.append(f"GPU pool {pool:,} tokens{_gib(pool, kv_bytes)}")
    details = [f"{ws * kv_bytes / GIB:.1f} GiB"] if kv_bytes else []
    if pool:
        details.append(f"{ws / pool:.2f}x the pool")
    parts.append(f"working set {ws:,} tokens" + (f" ({', '.join(details)})" if details else ""))
    if host_gib:
        parts.append(f"host RAM tier {host_gib:g} GiB" + (f" ({host_tokens:,} tokens)" if host_tokens else ""))
    if pool and host_tokens:
        parts.append(f"GPU + host RAM {pool + host_tokens:,} tokens ({ws / (pool + host_tokens):.2f}x)")
    if fs_gib:
        parts.append(f"file-system tier {fs_gib:g} GiB" + (f" ({fs_tokens:,} tokens)" if fs_tokens else ""))
    return "; ".join(parts)


def plan_sizing(params: Mapping[str, Any], engine: Mapping[str, Any]) -> dict[str, Any]:
    """What the campaign's numbers say before anything runs (shown in plan.json)."""
    workload = WorkloadParams(**(params.get("workload") or {})).workload()
    recipe = params.get("recipe") or {}
    copies = int(params.get("engine_copies") or 1)
    ws = workload.working_set_tokens()
    kv_bytes, kv_source = _kv_bytes(engine)
    pool, pool_source = _pool_tokens(engine, copies)
    host_gib = float(recipe.get("host_gib_per_copy") or 0) * copies
    fs_gib = float(params.get("fs_gib") or 0) if recipe.get("fs") else 0.0
    host_tokens = int(host_gib * GIB / kv_bytes) if kv_bytes and host_gib else 0
    fs_tokens = int(fs_gib * GIB / kv_bytes) if kv_bytes and fs_gib else 0
    out: dict[str, Any] = {"working_set_tokens": ws, "context_tokens": workload.context_tokens(),
                           "kv_bytes_per_token": kv_bytes, "kv_bytes_source": kv_source, "pool_tokens": pool,
                           "pool_source": pool_source, "host_tier_gib": host_gib, "host_tier_tokens": host_tokens,
                           "fs_tier_gib": fs_gib, "fs_tier_tokens": fs_tokens}
    if pool:
        out["ws_over_pool"] = round(ws / pool, 3)
        if host_tokens:
            out["ws_over_pool_plus_host"] = round(ws / (pool + host_tokens), 3)
    out["note"] = sizes_note(kv_bytes, kv_source, pool, ws, host_gib, host_tokens, fs_gib, fs_tokens)
    return out


def unreached_tier(sizing: Mapping[str, Any], fs_tier: bool) -> str:
    """Why the mode's lowest tier cannot be reached, from ``plan_sizing``'s figures, or "": the
    working set must exceed what sits above the tier (known where the campaign fixes the pool)."""
    ws, pool, host = sizing["working_set_tokens"], sizing["pool_tokens"], sizing["host_tier_tokens"]
    if not pool or not sizing["host_tier_gib"]:
        return ""
    more = "give more sessions or history_tokens"
    if ws <= pool:
        return (f"sizing: the working set ({ws:,} tokens) fits the GPU KV pool ({pool:,} tokens: "
                f"{sizing['pool_source']}), so no offload tier is ever read; {more}, or a smaller pool")
    if fs_tier and host and ws <= pool + host:
        return (f"sizing: the working set ({ws:,} tokens) fits the GPU KV pool and the host RAM tier ({pool:,} + "
                f"{host:,} = {pool + host:,} tokens), so the file-system tier is never reached; {more}, or a "
                "smaller offload_gib")
    return ""


def staging_shortfall(params: Mapping[str, Any], engine: Mapping[str, Any]) -> str:
    """Why a RAM tier cannot stage what it must, or "": vLLM's tiering writes the file-system tier
    through the RAM tier, which must hold the blocks of every request in flight. On the H200 a 2 GiB
    tier (8,192 tokens) under 4 requests of 13.7K tokens logged "cannot store blocks" 934 times and
    the file-system tier stayed empty: a lease spent on a tier that cannot be reached. Known before
    the run only where the KV bytes per token are (the stand-in's knob, a rehearsal preset)."""
    kv_bytes, _ = _kv_bytes(engine)
    recipe = params.get("recipe") or {}
    host_gib = float(recipe.get("host_gib_per_copy") or 0)
    if not kv_bytes or not host_gib:
        return ""
    workload = WorkloadParams(**(params.get("workload") or {})).workload()
    copies = int(params.get("engine_copies") or 1)
    # Sessions are tied to copies round-robin while the load's workers share one queue, so one copy
    # can hold as many requests as it has sessions, up to the load's concurrency.
    in_flight = min(workload.concurrency, -(-workload.sessions // copies))
    block = _int(engine_arg(engine.get("args") or {}, "block-size")) or VLLM_BLOCK_TOKENS
    request = -(-with_chat_template(workload.context_tokens()) // block) * block  # whole blocks, template in
    need_bytes = in_flight * request * kv_bytes
    if host_gib * GIB >= need_bytes:
        return ""
    need_gib = math.ceil(need_bytes / GIB * 10) / 10  # up: the figure given must pass
    return (f"the {host_gib:g} GiB RAM tier ({int(host_gib * GIB / kv_bytes):,} tokens) cannot stage the "
            f"{in_flight} requests in flight on an engine copy ({in_flight} x {request:,} tokens = {need_gib:.1f} "
            "GiB): vLLM writes the file-system tier through it, refuses to store ('cannot store blocks') and the "
            f"file-system tier is never reached; give offload_gib >= {need_gib:.1f}, or fewer requests in flight")


def store_refusals(texts: list[str]) -> int:
    """How often the engine said an offload tier had no room for a request's blocks (in the log
    text already read: the load's window of every copy)."""
    return sum(len(_STORE_REFUSED.findall(text)) for text in texts)


def host_tier_tokens(stated: list[int], host_gib: float, kv_tokens: int | None, kv_gib: float | None,
                     config_bytes: int | None = None, blocks_overridden: bool = False) -> tuple[int, str]:
    """The host tier's capacity in tokens, and where the figure comes from.

    The stand-in states it in its log (``stated``). For vLLM it is the tier's GiB over the KV bytes
    of a token: from the model's config where the node could read it (the same KV layout in RAM),
    else from the log's ``Available KV cache memory`` over ``GPU KV cache size`` -- which means
    nothing once ``--num-gpu-blocks-override`` sizes the pool, so then there is no estimate."""
    if stated:
        return sum(stated), "log"
    if host_gib and config_bytes:
        return int(host_gib * GIB / config_bytes), "estimate from the model's KV bytes per token"
    if host_gib and kv_tokens and kv_gib and not blocks_overridden:
        return int(host_gib * kv_tokens / kv_gib), "estimate from GPU bytes per token"
    return 0, ""


def working_set(context_tokens: int, sessions: int, kv_tokens: int | None, host_tokens: int,
                fs_tier: bool | None = None) -> dict[str, Any]:
    """Sessions x context against the GPU KV capacity and the host tier, in words too.

    ``fs_tier`` says whether the mode has a tier below host RAM (None: not known, and the last case
    says what a file-system tier could do)."""
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
    elif fs_tier is False:
        note = (f"working set {ws:,} tokens exceeds GPU ({kv_tokens:,}) + host tier (~{host_tokens:,}): this mode "
                "has no tier below host RAM, so the overflow is recomputed")
    else:
        note = (f"working set {ws:,} tokens exceeds GPU ({kv_tokens:,}) + host tier (~{host_tokens:,}): "
                "a file-system tier can be reached")
    out["tier_note"] = note
    return out


def stated_host_tokens(logs: list[Path]) -> list[int]:
    """The host tier's tokens the stand-in states in its log, one per copy that states it."""
    return [int(m.group(1).replace(",", "")) for p in logs if p.is_file()
            for m in _STANDIN_HOST_TIER.finditer(p.read_text(errors="replace"))]
