"""Every constant of the engine stand-in, with its default and its meaning.

The stand-in rehearses a vLLM campaign on machines without a GPU. Its timings are knobs, not
measurements: each knob below is a ``--standin-<name>`` flag and a ``STANDIN_<NAME>`` environment
variable (the flag wins over the variable, the variable over the default). ``docs/standin.md``
lists them; ``python -m nodetools.standin knobs`` prints the same table from this file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KNOB_ENV_PREFIX",
    "KNOB_FLAG_PREFIX",
    "STANDIN_VERSION",
    "Knobs",
    "OffloadPlan",
    "ServeConfig",
    "convert_knob",
    "knob_env_name",
    "knob_fields",
    "knob_flag",
    "knobs_from_env",
    "knobs_markdown_table",
    "resolve_offload",
]

STANDIN_VERSION = "0.1.0"
KNOB_FLAG_PREFIX = "--standin-"
KNOB_ENV_PREFIX = "STANDIN_"


def _knob(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class Knobs:
    """Stand-in constants. Seconds are wall seconds the stand-in really waits."""

    # Startup: process and weights.
    process_start_s: float = _knob(0.5, "Seconds between `non-default args` and the engine core start "
                                   "(imports, config resolution).")
    weights_file: str = _knob("", "Read only this file as the weights (default: every weight file under "
                              "MODEL, or every file when it holds none).")
    weights_read_mib_s: float = _knob(0.0, "Cap on the weights read rate in MiB/s; 0 reads as fast as the "
                                      "disk or page cache gives.")
    weights_chunk_kib: int = _knob(1024, "Size of each buffered read() of the weights, KiB.")
    model_init_s: float = _knob(0.2, "Seconds of model construction added to the read time in "
                                "`Model loading took`.")
    # Startup: compile cache, kernel JIT, CUDA graphs.
    dynamo_s: float = _knob(0.3, "Seconds of `Dynamo bytecode transform` on a compile-cache miss.")
    compile_miss_s: float = _knob(3.0, "Seconds of graph compilation on a compile-cache miss.")
    compile_hit_s: float = _knob(0.3, "Seconds to load the compiled graph on a compile-cache hit "
                                 "(plus the real read of the artefact).")
    compile_artifact_kib: int = _knob(256, "Size of the compiled-graph artefact written to the cache, KiB.")
    profile_s: float = _knob(0.2, "Seconds of the initial profiling run.")
    jit_dir: str = _knob("", "Kernel-JIT cache directory (default `jit/` in the stand-in's own cache root, "
                         "`$XDG_CACHE_HOME/nodetools-standin`: outside VLLM_CACHE_ROOT, like FlashInfer's "
                         "and Triton's caches, and never a real engine's).")
    jit_miss_s: float = _knob(2.0, "Seconds of kernel JIT warmup when the JIT cache is empty.")
    jit_hit_s: float = _knob(0.1, "Seconds of kernel JIT warmup when the JIT cache is warm.")
    graph_capture_s: float = _knob(1.0, "Seconds of CUDA-graph capture (skipped by --enforce-eager).")
    graph_capture_gib: float = _knob(0.42, "GiB reported by `Graph capturing finished`.")
    # KV cache.
    kv_capacity_tokens: int = _knob(256_000, "GPU KV cache capacity in tokens (16,000 blocks of 16); "
                                    "--num-gpu-blocks-override wins over it.")
    kv_bytes_per_token: int = _knob(65_536, "GPU KV bytes per token, for `Available KV cache memory` "
                                    "(65,536 = 16 layers x 8 KV heads x 128 dims x K,V x bf16).")
    kv_alloc_s: float = _knob(0.2, "Seconds to allocate the GPU KV cache.")
    offload_bytes_per_token: int = _knob(65_536, "Host-RAM tier bytes per token: its capacity is "
                                         "--kv-offloading-size GiB x 2^30 / this.")
    offload_pin_s_per_gib: float = _knob(0.05, "Seconds per GiB to allocate and pin the host-RAM tier at "
                                         "startup (the reference node paid ~0.33 s/GiB).")
    offload_policy: str = _knob("write-through", "How blocks reach the host-RAM tier: `write-through` "
                                "(stored once computed, as vLLM's OffloadingConnector does) or `victim` "
                                "(stored when evicted from the GPU).")
    kv_fs_dir: str = _knob("", "Directory of a file-system KV tier (one small real file per block); also "
                           "set by a TieringOffloadingSpec `fs` tier in --kv-transfer-config.")
    kv_fs_capacity_gib: float = _knob(0.0, "Capacity of the file-system tier in GiB of KV "
                                      "(offload_bytes_per_token per token); 0 = unlimited.")
    kv_fs_file_bytes: int = _knob(256, "Bytes really written per block file in the file-system tier.")
    lmcache_ops: str = _knob("cuda", "With an LMCache connector, the copy path its log shows: `cuda` (LMCache "
                             "bound its CUDA extension and says nothing) or `torch` (it logs LMCache's fallback "
                             "warning, `lmcache.cuda_ops compiled extension not found; ...`). The line only: the "
                             "costs stay the stand-in's.")
    # Serving costs.
    prefill_s_per_token: float = _knob(2e-5, "Seconds of prefill per uncached prompt token (shared by the "
                                       "batch: an engine step costs the sum of its tokens).")
    cpu_load_s_per_token: float = _knob(2e-6, "Seconds per token to load an external hit from the host-RAM "
                                        "tier (async, does not block other requests).")
    fs_load_s_per_token: float = _knob(1e-5, "Seconds per token to load an external hit from the "
                                       "file-system tier (or the real read time, if longer).")
    decode_s_per_token: float = _knob(0.01, "Seconds per decode step, i.e. per output token of every "
                                      "running request.")
    step_overhead_s: float = _knob(0.0, "Fixed seconds added to every engine step.")
    text_min_tokens: int = _knob(16, "Shortest natural answer (tokens, EOS included) without ignore_eos.")
    text_max_tokens: int = _knob(256, "Longest natural answer (tokens, EOS included) without ignore_eos.")
    default_max_model_len: int = _knob(32_768, "Max model length when neither --max-model-len nor the "
                                       "model's config.json gives one.")
    tokenizer: str = _knob("auto", "`auto`: the model folder's tokenizer.json through the tokenizers library "
                           "(trained and written first for a make-model folder that lacks one), else the regex "
                           "word pieces with a warning; `regex`: always the regex word pieces.")
    vocab_size: int = _knob(151_936, "Token ids are in [0, vocab_size) with the regex word pieces (with "
                            "tokenizer.json, the tokenizer's own size).")
    # Sleep mode and API server.
    sleep_s: float = _knob(0.3, "Seconds to fall asleep.")
    wake_s: float = _knob(0.1, "Seconds to wake up.")
    sleep_residual_gib: float = _knob(1.25, "GiB `still in use` after falling asleep.")
    api_start_s: float = _knob(0.1, "Seconds between `init engine` and the API server listening.")
    crash_after_requests: int = _knob(0, "Failure drill: after this many finished requests the engine logs "
                                      "vLLM's `Worker proc VllmWorker-0 died unexpectedly` and exits 1 "
                                      "(0 = never).")
    log_style: str = _knob("0.24", "Log line variants: `0.24` (vLLM 0.24.0, as in the reference logs) or "
                           "`legacy` (older wording: `Starting vLLM API server 0 on`, `GiB memory`, "
                           "`EngineCore_DP0`, `init engine ... took X seconds`).")

    def non_default(self) -> dict[str, Any]:
        """The knobs that differ from their defaults, for the startup log."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }


def knob_fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(Knobs)


def knob_flag(name: str) -> str:
    return KNOB_FLAG_PREFIX + name.replace("_", "-")


def knob_env_name(name: str) -> str:
    return KNOB_ENV_PREFIX + name.upper()


def _convert(kind: Any, raw: str) -> Any:
    # dataclass annotations are strings under `from __future__ import annotations`.
    if kind in (float, "float"):
        return float(raw)
    if kind in (int, "int"):
        return int(float(raw)) if "e" in raw.lower() else int(raw.replace("_", ""))
    return raw


def knobs_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Knob values given as STANDIN_* environment variables (raises ValueError on a bad one)."""
    values: dict[str, Any] = {}
    for f in knob_fields():
        raw = environ.get(knob_env_name(f.name))
        if raw is None:
            continue
        try:
            values[f.name] = _convert(f.type, raw)
        except ValueError as exc:
            raise ValueError(f"{knob_env_name(f.name)}={raw!r}: {exc}") from exc
    return values


def convert_knob(name: str, raw: str) -> Any:
    kind = {f.name: f.type for f in knob_fields()}[name]
    return _convert(kind, raw)


def knobs_markdown_table() -> str:
    rows = ["| flag | env | default | meaning |", "|---|---|---|---|"]
    for f in knob_fields():
        default = f.default if f.default != "" else "(empty)"
        rows.append(
            f"| `{knob_flag(f.name)}` | `{knob_env_name(f.name)}` | `{default}` | {f.metadata['help']} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class OffloadPlan:
    """The external KV tiers a configuration asks for, as vLLM would wire its connector."""

    connector: str = ""  # e.g. OffloadingConnector, LMCacheConnectorV1; empty = no connector
    spec: str = ""  # CPUOffloadingSpec, TieringOffloadingSpec
    cpu_bytes: int = 0
    fs_root: str = ""
    offload_prompt_only: bool = True
    notes: tuple[str, ...] = ()
    fs_gib: float = 0.0  # the file-system tier's capacity when the configuration names one (LMCache's disk)

    @property
    def enabled(self) -> bool:
        return bool(self.cpu_bytes or self.fs_root)


@dataclass(frozen=True)
class ServeConfig:
    """The resolved `serve` arguments: vLLM's flags the stand-in models, plus the knobs."""

    model: str
    served_model_name: str
    host: str | None
    port: int
    max_model_len: int | None
    tensor_parallel_size: int
    enforce_eager: bool
    enable_sleep_mode: bool
    offload: OffloadPlan
    load_format: str
    compilation_config: dict[str, Any]
    enable_prefix_caching: bool
    block_size: int
    disable_log_stats: bool
    seed: int
    dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prompt_tokens_details: bool
    num_gpu_blocks_override: int | None
    api_key: str | None
    disable_uvicorn_access_log: bool
    non_default_args: dict[str, Any]
    unmodelled_flags: tuple[str, ...]
    knobs: Knobs

    @property
    def model_path(self) -> Path:
        return Path(self.model).expanduser()


def resolve_offload(size_gib: float | None, backend: str | None, transfer: dict[str, Any] | None,
                    knobs: Knobs, environ: Mapping[str, str]) -> OffloadPlan:
    """Map --kv-offloading-* / --kv-transfer-config (and the fs-tier knob) to tiers."""
    fs_root = knobs.kv_fs_dir
    fs_gib = 0.0
    notes: list[str] = []
    connector, spec, cpu_bytes, prompt_only = "", "", 0, True
    if transfer:
        name = str(transfer.get("kv_connector", ""))
        extra = transfer.get("kv_connector_extra_config") or {}
        if size_gib:
            notes.append("--kv-offloading-size is ignored: --kv-transfer-config wins")
        if name == "OffloadingConnector":
            connector, spec = name, str(extra.get("spec_name", "CPUOffloadingSpec"))
            cpu_bytes = int(extra.get("cpu_bytes_to_use", 0))
            prompt_only = bool(extra.get("offload_prompt_only", True))
            for tier in extra.get("secondary_tiers") or []:
                if isinstance(tier, dict) and tier.get("type") == "fs" and tier.get("root_dir"):
                    fs_root = str(tier["root_dir"])
        elif name.startswith("LMCache"):
            gb = float(environ.get("LMCACHE_MAX_LOCAL_CPU_SIZE", "5"))
            connector, cpu_bytes = name, int(gb * 2**30)
            notes.append(f"{name} is modelled as a host-RAM tier of LMCACHE_MAX_LOCAL_CPU_SIZE={gb:g} GB")
            disk = environ.get("LMCACHE_LOCAL_DISK", "")
            if disk.startswith("file://"):
                fs_root, fs_gib = disk[len("file://"):], float(environ.get("LMCACHE_MAX_LOCAL_DISK_SIZE", "0"))
                notes.append(f"LMCACHE_LOCAL_DISK is modelled as a file-system tier below it, fed by its evictions "
                             f"(LMCACHE_MAX_LOCAL_DISK_SIZE={fs_gib:g} GB)")
        else:
            notes.append(f"kv_connector {name!r} is not modelled: no external tier")
    elif size_gib:
        cpu_bytes = int(size_gib * 2**30)
        if (backend or "native") == "lmcache":
            connector = "LMCacheConnectorV1"
            notes.append("--kv-offloading-backend lmcache is modelled as the native host-RAM tier")
        else:
            connector, spec = "OffloadingConnector", "CPUOffloadingSpec"
    if fs_root and not connector:
        connector = "OffloadingConnector"
    if fs_root and connector == "OffloadingConnector":
        spec = "TieringOffloadingSpec"
    return OffloadPlan(connector, spec, cpu_bytes, fs_root, prompt_only, tuple(notes), fs_gib)
