"""Which tier served each hit, the bytes each tier moved and its read rate: pure over a trial's figures.

Tokens: the GPU's are the engine's prefix-cache hits (``/metrics``). The hits below it (the
engine's external hits) go to a tier by the engine's own per-tier counter where it has one (the
stand-in's); else all to host RAM when the mode has no file-system tier; else the file-system
tier's share is what the engines read from files during the load (``engine_file_read_gb``, page
cache included, over the KV bytes a token, at most the external hits), the rest RAM's.

Rates (decimal GB/s) are what each tier delivered towards the GPU:

- host RAM: the engine's timed CPU->GPU copies (vLLM's connector counters or log lines), or
  LMCache's own retrieval lines (which time its whole retrieval, whichever tier served it);
- file system: a transfer the engine times out of it (``kv_fs_to_*``: the stand-in's
  ``FS_to_GPU``); LMCache's retrieval lines; else (vLLM 0.24's tiering times only CPU<->GPU
  copies) the bytes the disk itself moved (``engine_disk_read_gb``) at the node's measured disk
  read rate (its ``storage`` trials), then every file-system byte's copy to the GPU: page-cache
  hits cost only the copy. ``tier_read_source`` says which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.experiments.offload.breakeven import TierRead, path_gb_s

__all__ = ["TierInputs", "tier_columns", "tier_reads"]

_FS_TRANSFER = re.compile(r"^kv_(fs|disk|file|local_disk)_to_(gpu|cpu)_gb_s$")


@dataclass(frozen=True)
class TierInputs:
    gpu_hits: float | None  # tokens, the /metrics prefix-cache hits delta
    external_hits: float | None  # tokens, the external prefix-cache hits delta
    host_tier: bool  # the mode has a host-RAM tier
    fs_tier: bool  # ... and a file-system tier
    lmcache: bool = False
    by_tier: Mapping[str, int] = field(default_factory=dict)  # the engine's own per-tier counts
    kv_bytes_per_token: int | None = None
    transfers: Mapping[str, Any] = field(default_factory=dict)  # kv_<src>_to_<dst>_* (collect.kv_transfers)
    file_read_gb: float | None = None  # engine_file_read_gb
    disk_read_gb: float | None = None  # engine_disk_read_gb
    disk_limit_gb_s: float | None = None  # the node's measured disk read
    disk_limit_source: str = ""


def _tokens(inp: TierInputs) -> tuple[dict[str, int | None], str]:
    gpu = int(inp.gpu_hits) if inp.gpu_hits is not None else None
    if not inp.host_tier and not inp.fs_tier:
        return {"gpu": gpu, "cpu": None, "fs": None}, "the engine's prefix-cache hits (no tier below the GPU)"
    external = int(inp.external_hits) if inp.external_hits is not None else None
    if inp.by_tier:
        return ({"gpu": gpu, "cpu": int(inp.by_tier.get("cpu", 0)),
                 "fs": int(inp.by_tier.get("fs", 0)) if inp.fs_tier else None}, "the engine's per-tier counters")
    if not inp.fs_tier:
        return {"gpu": gpu, "cpu": external, "fs": None}, "external hits, all from host RAM (the mode's only tier)"
    if external is None or inp.file_read_gb is None or not inp.kv_bytes_per_token:
        return {"gpu": gpu, "cpu": None, "fs": None}, ("no split between RAM and the file system: the engines' file "
                                                       "reads or the KV bytes a token were not counted")
    fs = min(external, int(inp.file_read_gb * 1e9 / inp.kv_bytes_per_token))
    return ({"gpu": gpu, "cpu": external - fs, "fs": fs},
            "external hits; the file system's share from the engines' file reads over the KV bytes a token")


def _fs_rate(inp: TierInputs, fs_gb: float, copy: float | None) -> tuple[float | None, str]:
    for key, value in sorted(inp.transfers.items()):
        if (m := _FS_TRANSFER.match(key)) and isinstance(value, int | float) and value > 0:
            if m[2] == "gpu":
                return float(value), f"the engine's timed {m[1]}->GPU transfers"
            return path_gb_s(float(value), copy), f"the engine's timed {m[1]}->CPU reads, then its CPU->GPU copies"
    if inp.lmcache:
        return copy, "LMCache's retrieval lines (its disk and RAM together)"
    if inp.disk_limit_gb_s is None or copy is None:
        return None, "the engine times no file reads, and no storage trial measured the node's disk"
    disk_gb = fs_gb if inp.disk_read_gb is None else min(inp.disk_read_gb, fs_gb)
    seconds = disk_gb / inp.disk_limit_gb_s + fs_gb / copy
    return (fs_gb / seconds if seconds > 0 else None,
            f"{disk_gb:g} GB from the disk at its measured {inp.disk_limit_gb_s:g} GB/s ({inp.disk_limit_source}), "
            f"the rest from the page cache; then the CPU->GPU copies at {copy:g} GB/s")


def tier_columns(inp: TierInputs) -> dict[str, Any]:
    """The row's per-tier columns: tokens, GB read out of each tier, its rate, and where they came from."""
    tokens, source = _tokens(inp)
    out: dict[str, Any] = {f"tier_hit_tokens_{t}": n for t, n in tokens.items() if n is not None}
    out["tier_hit_source"] = source
    b = inp.kv_bytes_per_token
    copy = inp.transfers.get("kv_cpu_to_gpu_gb_s")
    copy = float(copy) if isinstance(copy, int | float) and copy > 0 else None
    sources = []
    if tokens["cpu"] and b:
        out["tier_read_gb_cpu"] = round(tokens["cpu"] * b / 1e9, 3)
        if copy is not None:
            out["tier_read_gb_s_cpu"] = round(copy, 2)
            sources.append("RAM: " + ("LMCache's retrieval lines" if inp.lmcache else "the engine's CPU->GPU copies"))
    if tokens["fs"] and b:
        fs_gb = tokens["fs"] * b / 1e9
        out["tier_read_gb_fs"] = round(fs_gb, 3)
        rate, why = _fs_rate(inp, fs_gb, copy)
        if rate is not None:
            out["tier_read_gb_s_fs"] = round(rate, 2)
        sources.append(f"file system: {why}")
    deepest = "fs" if tokens["fs"] else "cpu" if tokens["cpu"] else ""
    if deepest and f"tier_read_gb_s_{deepest}" in out:
        out["tier_read_gb_s"] = out[f"tier_read_gb_s_{deepest}"]
        out["tier_read_tier"] = deepest
    if sources:
        out["tier_read_source"] = "; ".join(sources)
    return out


def tier_reads(columns: Mapping[str, Any]) -> list[TierRead]:
    """What the model charges for each tier that served tokens (from ``tier_columns``)."""
    return [TierRead(t, int(columns.get(f"tier_hit_tokens_{t}") or 0), columns.get(f"tier_read_gb_s_{t}"))
            for t in ("cpu", "fs") if columns.get(f"tier_hit_tokens_{t}")]
