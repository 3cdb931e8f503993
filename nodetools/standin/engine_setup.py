"""The engine core's start-up sequence, and the serving engine built from its result."""

from __future__ import annotations

from pathlib import Path

from nodetools.standin.caches import compile_cache_key
from nodetools.standin.config import STANDIN_VERSION, ServeConfig
from nodetools.standin.engine import Engine, EngineParams, MemoryFigures
from nodetools.standin.kvcache import FsTier, HostTier, KvCacheManager
from nodetools.standin.sleep_memory import SleepMemory
from nodetools.standin.startup import StartupResult, run_engine_startup, spawn_engine_core, weight_files
from nodetools.standin.stats import EngineStats
from nodetools.standin.tokenizer import TokenizerChoice
from nodetools.standin.vllm_log import ProcLogger

__all__ = ["build_engine", "start_engine_core"]


async def start_engine_core(cfg: ServeConfig, eng: ProcLogger, max_model_len: int, environ: dict[str, str]
                            ) -> StartupResult:
    """vLLM's engine-core start: a ``VLLM::EngineCore`` child process appears in the server's group (what
    the startup timer sees on a real node), then its config line, load, compile, profile and capture."""
    await spawn_engine_core(cfg)
    eng.info("Initializing a V1 LLM engine (v%s+standin) with config: model=%r, served_model_name=%s, "
             "max_seq_len=%d, load_format=%s, tensor_parallel_size=%d, dtype=%s, enforce_eager=%s, seed=%d, "
             "enable_prefix_caching=%s, block_size=%d", STANDIN_VERSION, cfg.model, cfg.served_model_name,
             max_model_len, cfg.load_format, cfg.tensor_parallel_size, cfg.dtype, cfg.enforce_eager, cfg.seed,
             cfg.enable_prefix_caching, cfg.block_size)
    tp = cfg.tensor_parallel_size
    workers = [eng] if tp == 1 else [ProcLogger(eng.logger, f"Worker_TP{r}") for r in range(tp)]
    return await run_engine_startup(cfg, eng, workers, max_model_len, environ)


def build_engine(cfg: ServeConfig, result: StartupResult, max_model_len: int, api: ProcLogger,
                 eng: ProcLogger, tok: TokenizerChoice) -> Engine:
    """The serving engine: a KV cache of the blocks start-up left room for, its offload tiers, its knobs."""
    k = cfg.knobs
    tiers: list[HostTier] = []
    if cfg.offload.cpu_bytes:
        tiers.append(HostTier(cfg.offload.cpu_bytes // k.offload_bytes_per_token // cfg.block_size))
    if cfg.offload.fs_root:
        cap = int((cfg.offload.fs_gib or k.kv_fs_capacity_gib) * 2**30 // k.offload_bytes_per_token // cfg.block_size)
        digest = compile_cache_key(cfg, max_model_len)[:16]
        tag = cfg.model_path.name or "model"
        tiers.append(FsTier(Path(cfg.offload.fs_root).expanduser(), tag, digest, capacity_blocks=cap or None,
                            file_bytes=k.kv_fs_file_bytes))
    gpu_blocks = result.kv_tokens // cfg.block_size
    kv = KvCacheManager(cfg.block_size, gpu_blocks, prefix_caching=cfg.enable_prefix_caching, tiers=tiers,
                        policy=k.offload_policy, offload_prompt_only=cfg.offload.offload_prompt_only)
    cache_info = {"block_size": str(cfg.block_size), "num_gpu_blocks": str(gpu_blocks),
                  "enable_prefix_caching": str(cfg.enable_prefix_caching),
                  "cpu_offload_tokens": str(sum(t.capacity_blocks for t in tiers[:1]) * cfg.block_size
                                            if cfg.offload.cpu_bytes else 0)}
    stats = EngineStats(cfg.served_model_name, kv.has_connector, cache_info, tok.info.kind,
                        connector_name=cfg.offload.connector, bytes_per_token=k.offload_bytes_per_token)
    params = EngineParams(
        block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        prefill_s_per_token=k.prefill_s_per_token, cpu_load_s_per_token=k.cpu_load_s_per_token,
        fs_load_s_per_token=k.fs_load_s_per_token, decode_s_per_token=k.decode_s_per_token,
        step_overhead_s=k.step_overhead_s, text_min_tokens=k.text_min_tokens,
        text_max_tokens=k.text_max_tokens,
        seed=cfg.seed, sleep_s=k.sleep_s, wake_s=k.wake_s, log_style=k.log_style,
        crash_after_requests=k.crash_after_requests)
    memory = MemoryFigures(result.model_gib, result.kv_gib, result.graphs_gib, k.sleep_residual_gib)
    # What a sleep backs up (level 1) or a reload reads again (after level 2): the files the start read.
    files = [] if cfg.load_format == "dummy" else weight_files(cfg.model_path, k.weights_file)
    return Engine(params, kv, tokenizer=tok.tokenizer, stats=stats, memory=memory, log_engine=eng, log_api=api,
                  weights=SleepMemory(files, cfg.load_format))
