"""Where the stand-in keeps its caches, and what it writes into them.

A real vLLM on the same machine reads its compile cache from ``~/.cache/vllm`` and FlashInfer its
kernels from ``~/.cache/flashinfer``: the stand-in's fake artefacts must never land there. Unless
told otherwise it keeps both under a cache root of its own, ``$XDG_CACHE_HOME/nodetools-standin``
(``~/.cache/nodetools-standin`` without XDG_CACHE_HOME): ``vllm/`` for the compile artefacts,
``jit/`` for the kernel-JIT markers. It persists, so a restart finds them, as vLLM's own would.
Told otherwise means ``VLLM_CACHE_ROOT`` (the runner passes the campaign's cache folder there),
``--compilation-config '{"cache_dir": ...}'``, and ``--standin-jit-dir`` / ``STANDIN_JIT_DIR``.

A compile artefact is ``standin_graph.bin`` (bytes derived from the compile hash) and
``standin_manifest.json`` (the hash and the bytes' sha256) per rank folder: a hit reads and
verifies both, as vLLM reads its compiled graphs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from nodetools.standin.config import STANDIN_VERSION, Knobs, ServeConfig

__all__ = ["CACHE_DIR_NAME", "cache_root", "compile_cache_key", "jit_dir", "jit_key", "load_artifact",
           "save_artifact", "vllm_cache_root", "write_atomic"]

CACHE_DIR_NAME = "nodetools-standin"


def cache_root(environ: Mapping[str, str]) -> Path:
    """The stand-in's own cache root: never a folder a real engine reads."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_DIR_NAME


def vllm_cache_root(environ: Mapping[str, str]) -> Path:
    """Where the compile cache goes: ``VLLM_CACHE_ROOT`` when given, else ``vllm/`` in the stand-in's root."""
    root = environ.get("VLLM_CACHE_ROOT")
    return Path(root).expanduser() if root else cache_root(environ) / "vllm"


def jit_dir(knobs: Knobs, environ: Mapping[str, str]) -> Path:
    """Where the kernel-JIT markers go: the ``jit_dir`` knob when set, else ``jit/`` in the stand-in's root
    (outside VLLM_CACHE_ROOT either way, like FlashInfer's and Triton's caches)."""
    return Path(knobs.jit_dir).expanduser() if knobs.jit_dir else cache_root(environ) / "jit"


def jit_key(cfg: ServeConfig) -> str:
    """What the JIT-compiled kernels depend on here (dtype, block size, TP, batch shape)."""
    factors = [cfg.dtype, cfg.block_size, cfg.tensor_parallel_size, cfg.max_num_batched_tokens, STANDIN_VERSION]
    return hashlib.sha256(json.dumps(factors).encode()).hexdigest()[:16]


def compile_cache_key(cfg: ServeConfig, max_model_len: int) -> str:
    """Hash of what changes vLLM's compile hash here (model, shapes, sleep mode, connector, ...)."""
    cc = {k: v for k, v in cfg.compilation_config.items() if k != "cache_dir"}
    factors = {
        "model": str(cfg.model_path.resolve()), "dtype": cfg.dtype, "tp": cfg.tensor_parallel_size,
        "max_model_len": max_model_len, "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "sleep": cfg.enable_sleep_mode, "connector": cfg.offload.connector, "compilation_config": cc,
        "standin": STANDIN_VERSION,
    }
    return hashlib.sha256(json.dumps(factors, sort_keys=True, default=str).encode()).hexdigest()


def _artifact_bytes(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def write_atomic(path: Path, data: bytes) -> None:
    """Write then rename: concurrent starts sharing one cache are safe (the race vLLM hit, vllm#24601)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def load_artifact(rank_dir: Path, key: str, size: int) -> bool:
    """The rank folder holds the artefact of ``key``, whole (read and verified)."""
    manifest, graph = rank_dir / "standin_manifest.json", rank_dir / "standin_graph.bin"
    try:
        meta = json.loads(manifest.read_text())
        data = graph.read_bytes()
    except (OSError, ValueError):
        return False
    return (isinstance(meta, dict) and meta.get("key") == key
            and meta.get("sha256") == hashlib.sha256(data).hexdigest() and len(data) == size)


def save_artifact(rank_dir: Path, key: str, size: int) -> None:
    """Write the artefact of ``key`` (``size`` bytes) and its manifest into the rank folder."""
    data = _artifact_bytes(key, size)
    write_atomic(rank_dir / "standin_graph.bin", data)
    meta = {"key": key, "sha256": hashlib.sha256(data).hexdigest(), "engine": "stand-in",
            "version": STANDIN_VERSION}
    write_atomic(rank_dir / "standin_manifest.json", json.dumps(meta).encode())
