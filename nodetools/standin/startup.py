"""Startup phases of the stand-in engine, logged in vLLM's formats.

Weights load really reads the model's files with plain buffered reads (``O_DIRECT`` for
``--load-format fastsafetensors``, which bypasses the page cache like the real loader), so a
dropped page cache makes it slower for real. The compile phase really looks for, reads and
writes an artefact under ``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_0/backbone``,
keyed by a hash of the model and the arguments that change vLLM's compile hash; a kernel-JIT
phase does the same in a cache outside ``VLLM_CACHE_ROOT``. Both caches are the stand-in's own
unless told otherwise (:mod:`nodetools.standin.caches`), never a real engine's. The other phases
wait for their knob's seconds.

vLLM starts as two processes: the API server, whose lines come first, spawns the EngineCore,
whose first line comes after its own imports. :func:`spawn_engine_core` gives the stand-in the
same structure as a timer sees it on the node: a real child process named ``VLLM::EngineCore``
(:mod:`nodetools.standin.engine_core`) appears, then ``process_start_s`` passes (the EngineCore's
imports) before the caller logs the EngineCore's first line.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodetools.node_state import read_meminfo
from nodetools.standin.caches import (
    compile_cache_key,
    jit_dir,
    jit_key,
    load_artifact,
    save_artifact,
    vllm_cache_root,
    write_atomic,
)
from nodetools.standin.config import ServeConfig
from nodetools.standin.engine_core import EngineCoreProcess, start_engine_core_process
from nodetools.standin.vllm_log import STYLES, ProcLogger

__all__ = [
    "StartupError",
    "StartupResult",
    "resolve_max_model_len",
    "run_engine_startup",
    "spawn_engine_core",
    "weight_files",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
GIB = float(2**30)


class StartupError(Exception):
    """A startup failure vLLM would also stop on; the message is vLLM-like."""


@dataclass(frozen=True)
class StartupResult:
    weights_bytes: int
    weights_files: int
    model_gib: float
    compile_hit: bool | None
    kv_tokens: int
    kv_gib: float
    graphs_gib: float


async def spawn_engine_core(cfg: ServeConfig) -> EngineCoreProcess:
    """The EngineCore's spawn and imports: its process appears now, its first line may follow
    ``process_start_s`` later (the caller logs it)."""
    core = start_engine_core_process()
    await asyncio.sleep(cfg.knobs.process_start_s)
    return core


def weight_files(model: Path, weights_file: str) -> list[Path]:
    """The files the weights load reads: the named file, the weight files, or every file."""
    if weights_file:
        return [Path(weights_file).expanduser()]
    if model.is_file():
        return [model]
    files = sorted(p for p in model.rglob("*") if p.is_file())
    weights = [p for p in files if p.name.endswith(WEIGHT_SUFFIXES)]
    return weights or files


def model_config(model: Path) -> dict[str, Any]:
    path = model / "config.json"
    if model.is_dir() and path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
    return {}


def resolve_max_model_len(cfg: ServeConfig) -> int:
    if cfg.max_model_len:
        return cfg.max_model_len
    found = model_config(cfg.model_path).get("max_position_embeddings")
    return int(found) if isinstance(found, int) and found > 0 else cfg.knobs.default_max_model_len


def _read_files(paths: list[Path], chunk: int, rate_bytes_s: float, direct: bool) -> tuple[int, float, bool]:
    """Read every byte of ``paths``; returns (bytes, seconds, whether O_DIRECT was used)."""
    start = time.monotonic()
    total = 0
    used_direct = direct
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    try:
        for path in paths:
            fd = -1
            if used_direct:
                try:
                    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
                except OSError:
                    used_direct = False  # tmpfs and some overlays refuse O_DIRECT
            if fd < 0:
                fd = os.open(path, os.O_RDONLY)
            try:
                while True:
                    n = os.readv(fd, [buf])
                    if n <= 0:
                        break
                    total += n
                    if rate_bytes_s > 0:
                        ahead = total / rate_bytes_s - (time.monotonic() - start)
                        if ahead > 0:
                            time.sleep(ahead)
            finally:
                os.close(fd)
    finally:
        buf.close()
    return total, time.monotonic() - start, used_direct


def _fs_type(path: Path) -> str:
    best, kind = "", "UNKNOWN"
    try:
        target = str(path.resolve())
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and target.startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], fields[2].upper()
    except OSError:
        pass
    return kind


def _available_ram_gib() -> float:
    return read_meminfo().get("mem_available_bytes", 0) / GIB


class _Phases:
    """Runs the engine-core phases of one start; logs per worker when TP > 1, like vLLM."""

    def __init__(self, cfg: ServeConfig, engine_log: ProcLogger, workers: list[ProcLogger],
                 environ: dict[str, str]) -> None:
        self.cfg = cfg
        self.k = cfg.knobs
        self.log = engine_log
        self.workers = workers
        self.environ = environ
        self.style = STYLES[self.k.log_style]

    def each(self, level: str, msg: str, *args: Any) -> None:
        for w in self.workers:
            getattr(w, level)(msg, *args, stacklevel=2)

    async def load_weights(self) -> tuple[int, int, float]:
        cfg, k = self.cfg, self.k
        model = cfg.model_path
        fmt = self.style["load_start"]
        self.each("info", fmt, *(cfg.model,)[: fmt.count("%s")])
        if cfg.load_format == "dummy":
            self.each("info", "Loading weights took %.2f seconds", 0.0)
            self.log.info("[stand-in] --load-format dummy: no weights read (vLLM initialises random weights)")
            return 0, 0, 0.0
        files = weight_files(model, k.weights_file)
        missing = [p for p in files if not p.is_file()]
        if not files or missing:
            raise StartupError(f"No weight files found in {model}" if not files else
                               f"Weight file not found: {missing[0]}")
        size = sum(p.stat().st_size for p in files)
        self.each("info", "Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. "
                  "Available RAM: %.2f GiB.",
                  _fs_type(files[0]), size / GIB, _available_ram_gib())
        safetensors = [p for p in files if p.suffix == ".safetensors"]
        if safetensors:
            self.each("raw", "Loading safetensors checkpoint shards:   0%% Completed | 0/%d [00:00<?, ?it/s]",
                      len(safetensors))
        direct = cfg.load_format == "fastsafetensors"
        chunk = max(4096, k.weights_chunk_kib * 1024 // 4096 * 4096)
        total, seconds, used_direct = await asyncio.to_thread(
            _read_files, files, chunk, k.weights_read_mib_s * 2**20, direct)
        if safetensors:
            n = len(safetensors)
            rate = n / seconds if seconds > 0 else float(n)
            self.each("raw", "Loading safetensors checkpoint shards: 100%% Completed | %d/%d "
                      "[00:%02d<00:00, %6.2fit/s]",
                      n, n, min(int(seconds), 59), rate)
            self.each("raw", "")
        self.each("info", "Loading weights took %.2f seconds", seconds)
        mib_s = total / 2**20 / seconds if seconds > 0 else 0.0
        cap = f"{k.weights_read_mib_s:g} MiB/s" if k.weights_read_mib_s > 0 else "none"
        self.log.info("[stand-in] weights read: %d bytes from %d files in %.3f s (%.1f MiB/s, cap %s, %s)",
                      total, len(files), seconds, mib_s, cap, "O_DIRECT" if used_direct else "buffered")
        if direct and not used_direct:
            self.log.warning("[stand-in] O_DIRECT was refused by the file system; weights were read buffered")
        return total, len(files), seconds

    async def compile(self, max_model_len: int) -> tuple[bool | None, float]:
        """Returns (cache hit, or None when nothing was compiled; compile seconds)."""
        cfg, k = self.cfg, self.k
        mode = str(cfg.compilation_config.get("mode", cfg.compilation_config.get("level", 3))).upper()
        if cfg.enforce_eager or mode in ("0", "NONE"):
            return None, 0.0
        full_key = compile_cache_key(cfg, max_model_len)
        root = vllm_cache_root(self.environ)
        base = Path(cfg.compilation_config["cache_dir"]) if cfg.compilation_config.get("cache_dir") else (
            root / "torch_compile_cache" / full_key[:10])
        aot = root / "torch_compile_cache" / "torch_aot_compile" / full_key
        ranks = range(cfg.tensor_parallel_size)
        rank_dirs = [base / f"rank_{r}_0" / "backbone" for r in ranks]
        size = k.compile_artifact_kib * 1024
        compile_range = f"(1, {cfg.max_num_batched_tokens})"
        disabled = self.environ.get("VLLM_DISABLE_COMPILE_CACHE", "0") not in ("", "0")
        start = time.monotonic()
        if disabled:
            self.each("info", "vLLM's torch.compile cache is disabled.")
        else:
            for w, d in zip(self.workers, rank_dirs, strict=True):
                w.info("Using cache directory: %s for vLLM's torch.compile", d)
            hits = await asyncio.to_thread(lambda: [load_artifact(d, full_key, size) for d in rank_dirs])
            if all(hits):
                await asyncio.sleep(k.compile_hit_s)
                took = time.monotonic() - start
                if k.log_style == "0.24":
                    for w, r in zip(self.workers, ranks, strict=True):
                        w.info("Directly load AOT compilation from path %s", aot / f"rank_{r}_0" / "model")
                self.each("info", "Directly load the compiled graph(s) for compile range %s from the cache, "
                          "took %.3f s", compile_range, took)
                self.each("info", "torch.compile took %.2f s in total", took)
                return True, took
            if any(hits):
                self.log.warning("[stand-in] compile cache incomplete for some ranks: recompiling")
        await asyncio.sleep(k.dynamo_s)
        self.each("info", "Dynamo bytecode transform time: %.2f s", time.monotonic() - start)
        compile_start = time.monotonic()
        await asyncio.sleep(k.compile_miss_s * 2 / 3)
        self.each("info", "Cache the graph of compile range %s for later use", compile_range)
        await asyncio.sleep(k.compile_miss_s / 3)
        if not disabled:
            try:
                await asyncio.to_thread(lambda: [save_artifact(d, full_key, size) for d in rank_dirs])
            except OSError as exc:
                self.log.warning("[stand-in] could not write the compile cache under %s: %s", base, exc)
        self.each("info", "Compiling a graph for compile range %s takes %.2f s", compile_range,
                  time.monotonic() - compile_start)
        if not disabled and k.log_style == "0.24":
            for w, r in zip(self.workers, ranks, strict=True):
                w.info("saved AOT compiled function to %s", aot / f"rank_{r}_0" / "model")
        took = time.monotonic() - start
        self.each("info", "torch.compile took %.2f s in total", took)
        return False, took

    async def jit_warmup(self) -> None:
        k = self.k
        key = jit_key(self.cfg)
        marker = jit_dir(k, self.environ) / f"{key}.json"
        hit = marker.is_file()
        start = time.monotonic()
        await asyncio.sleep(k.jit_hit_s if hit else k.jit_miss_s)
        if not hit:
            try:
                write_atomic(marker, json.dumps({"engine": "stand-in", "key": key}).encode())
            except OSError as exc:
                self.log.warning("[stand-in] could not write the kernel-JIT cache %s: %s", marker, exc)
        self.log.info("[stand-in] kernel JIT warmup: cache %s in %s, took %.2f s",
                      "hit" if hit else "miss", marker.parent, time.monotonic() - start)
        if k.log_style == "0.24":
            self.log.info("Kernel JIT monitor activated — Triton JIT compilations during inference will be "
                          "logged as warnings.")


async def run_engine_startup(cfg: ServeConfig, engine_log: ProcLogger, workers: list[ProcLogger],
                             max_model_len: int, environ: dict[str, str]) -> StartupResult:
    """Weights, compile, profiling, KV allocation, offload tiers, CUDA graphs, kernel JIT."""
    k = cfg.knobs
    phases = _Phases(cfg, engine_log, workers, environ)
    style = phases.style
    load_start = time.monotonic()
    total, nfiles, _ = await phases.load_weights()
    await asyncio.sleep(k.model_init_s)
    model_gib = total / GIB / cfg.tensor_parallel_size
    phases.each("info", style["model_loading"], model_gib, time.monotonic() - load_start)

    init_start = time.monotonic()
    hit, compile_s = await phases.compile(max_model_len)
    if hit is not None:
        await asyncio.sleep(k.profile_s)
        phases.each("info", "Initial profiling/warmup run took %.2f s", k.profile_s)

    blocks = (cfg.num_gpu_blocks_override if cfg.num_gpu_blocks_override
              else k.kv_capacity_tokens // cfg.block_size)
    kv_tokens = blocks * cfg.block_size
    kv_gib = kv_tokens * k.kv_bytes_per_token / GIB
    await asyncio.sleep(k.kv_alloc_s)
    phases.each("info", "Available KV cache memory: %.2f GiB", kv_gib)
    if kv_tokens < max_model_len:
        needed = max_model_len * k.kv_bytes_per_token / GIB
        raise StartupError(
            f"To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({needed:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({kv_gib:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{kv_tokens}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.")
    engine_log.info("GPU KV cache size: %s tokens", f"{kv_tokens:,}")
    engine_log.info("Maximum concurrency for %s tokens per request: %.2fx", f"{max_model_len:,}",
                    kv_tokens / max_model_len)
    await _start_offload(cfg, engine_log)

    graphs_gib = 0.0
    cudagraphs = str(cfg.compilation_config.get("cudagraph_mode", "FULL_AND_PIECEWISE")).upper()
    if not cfg.enforce_eager and cudagraphs != "NONE":
        start = time.monotonic()
        await asyncio.sleep(k.graph_capture_s)
        graphs_gib = k.graph_capture_gib
        phases.each("info", "Graph capturing finished in %.0f secs, took %.2f GiB", time.monotonic() - start,
                    graphs_gib)
    await phases.jit_warmup()
    init_s = time.monotonic() - init_start
    fmt = style["init_engine"] if hit is None else style["init_engine_compiled"]
    engine_log.info(fmt, *(init_s, compile_s)[: fmt.count("%.2f")])
    return StartupResult(total, nfiles, model_gib, hit, kv_tokens, kv_gib, graphs_gib)


async def _start_offload(cfg: ServeConfig, log: ProcLogger) -> None:
    plan, k = cfg.offload, cfg.knobs
    if not plan.connector:
        return
    log.info("Creating v1 connector with name: %s and engine_id: %s", plan.connector, uuid.uuid4())
    log.warning("Initializing KVConnectorBase_V1. This API is experimental and subject to change in the "
                "future as we iterate the design.")
    if plan.connector.startswith("LMCache"):
        # LMCache's own start: silent when its CUDA extension binds, one warning when it falls back.
        log.info("[stand-in] LMCache INFO: Creating LMCacheEngine instance vllm-instance")
        if k.lmcache_ops == "torch":
            log.warning("LMCache WARNING: lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays on "
                        "the torch baseline for all ops.")
    if plan.spec:
        log.info("Creating offloading spec with name: %s", plan.spec)
        log.warning("Initializing OffloadingSpec. This API is experimental and subject to change in the "
                    "future as we iterate the design.")
    gib = plan.cpu_bytes / GIB
    if plan.cpu_bytes:
        start = time.monotonic()
        await asyncio.sleep(gib * k.offload_pin_s_per_gib)
        tokens = plan.cpu_bytes // k.offload_bytes_per_token
        log.info("[stand-in] host-RAM KV tier: %.2f GiB = %s tokens (%s blocks), policy %s, pinned in %.2f s",
                 gib, f"{tokens:,}", f"{tokens // cfg.block_size:,}", k.offload_policy,
                 time.monotonic() - start)
    if plan.fs_root:
        fs_gib = plan.fs_gib or k.kv_fs_capacity_gib
        cap = (f"{fs_gib:g} GiB" if fs_gib > 0 else "unlimited")
        log.info("[stand-in] file-system KV tier: %s (%s, %d bytes per block file)", plan.fs_root, cap,
                 k.kv_fs_file_bytes)
    for note in plan.notes:
        log.warning("[stand-in] %s", note)
