"""Qwen3 model shapes: the rehearsal presets, their tensors and config, and KV bytes per token.

Stdlib only: the model maker writes these shapes, the node reads a model's ``config.json`` with
:func:`config_kv_bytes_per_token`, and the runner sizes an offload trial from a preset at plan
time with the same arithmetic (nodetools never import the runner; the runner may import this).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ARCHITECTURE", "CONFIG_ONLY_PRESETS", "PRESETS", "MakeError", "Qwen3Shape", "config_kv_bytes_per_token",
           "engine_model_dir", "kv_cache_dtype_bytes", "read_kv_bytes_per_token"]

ARCHITECTURE = "Qwen3ForCausalLM"
BOS_ID, EOS_ID = 0, 2  # as Qwen: bos <|endoftext|>, a chat turn ends with <|im_end|>
INIT_STD = 0.02
MIN_VOCAB = 256 + 3  # the byte alphabet and the three special tokens
WEIGHT_BYTES = 2  # bf16


class MakeError(Exception):
    """A request the maker refuses (exit 2)."""


@dataclass(frozen=True)
class Qwen3Shape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int

    def tensors(self) -> list[tuple[str, tuple[int, ...], bool]]:
        """(name, shape, is_norm) in module order, named as transformers' and vLLM's Qwen3 name them."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        out: list[tuple[str, tuple[int, ...], bool]] = [("model.embed_tokens.weight", (self.vocab_size, h), False)]
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,), True),
                (p + "self_attn.q_proj.weight", (q, h), False),
                (p + "self_attn.k_proj.weight", (kv, h), False),
                (p + "self_attn.v_proj.weight", (kv, h), False),
                (p + "self_attn.o_proj.weight", (h, q), False),
                (p + "self_attn.q_norm.weight", (self.head_dim,), True),
                (p + "self_attn.k_norm.weight", (self.head_dim,), True),
                (p + "post_attention_layernorm.weight", (h,), True),
                (p + "mlp.gate_proj.weight", (self.intermediate_size, h), False),
                (p + "mlp.up_proj.weight", (self.intermediate_size, h), False),
                (p + "mlp.down_proj.weight", (h, self.intermediate_size), False),
            ]
        return [*out, ("model.norm.weight", (h,), True), ("lm_head.weight", (self.vocab_size, h), False)]

    def parameters(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.tensors())

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> int:
        """K and V of every layer's KV heads: 2 x layers x kv_heads x head_dim x the cache's dtype bytes."""
        size = kv_cache_dtype_bytes(kv_cache_dtype, "bfloat16")
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * size

    def config(self) -> dict[str, Any]:
        """config.json as transformers' and vLLM's Qwen3 read it (bf16, untied, no sliding window)."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            **asdict(self),
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},  # transformers 5's spelling
            "attention_bias": False,
            "attention_dropout": 0.0,
            "initializer_range": INIT_STD,
            "use_cache": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
        }


# The vocabulary stays at 8,192 (a real Qwen3 has 151,936): the BPE trains on generated text in
# about a second, and the vocabulary only sizes the embedding and the LM head, not the KV cache
# nor a layer's compute (at 8,192 they are 0.08 B of qwen3-32b's 31.3 B parameters).
PRESETS: dict[str, Qwen3Shape] = {
    # Unit tests and quick smoke starts (head_dim 64 is one vLLM's attention backends serve): 0.66 M parameters.
    "qwen3-tiny": Qwen3Shape(128, 2, 2, 1, 64, 384, 1024, 4096),
    # The first H200 runs (docs/measurements.md): 0.84 B parameters, 1.68 GB, 64 KiB of KV a token.
    "qwen3-0.8b": Qwen3Shape(2048, 16, 16, 8, 128, 6144, 8192, 32768),
    # Qwen3-4B's layer shapes: 3.7 B parameters, 7.3 GB, 144 KiB of KV a token.
    "qwen3-4b": Qwen3Shape(2560, 36, 32, 8, 128, 9728, 8192, 32768),
    # Qwen3-8B's layer shapes (the restore of an 8B-class engine beside the reference figures'
    # Qwen3 8B): 7.0 B parameters, 14.0 GB in bf16 (Qwen3-8B itself, with its 151,936-token
    # vocabulary, 8.2 B and 16.4 GB), 144 KiB of KV a token. Served with dummy weights.
    "qwen3-8b": Qwen3Shape(4096, 36, 32, 8, 128, 12288, 8192, 40960),
    # Qwen3-14B's layer shapes: 13.3 B parameters, 26.6 GB in bf16, 160 KiB of KV a token.
    "qwen3-14b": Qwen3Shape(5120, 40, 40, 8, 128, 17408, 8192, 40960),
    # Qwen3-32B's layer shapes: 31.3 B parameters, 62.6 GB (58.3 GiB) in bf16, 256 KiB of KV a
    # token; on one H200 (140 GiB) at gpu-memory-utilization 0.9 that leaves ~60 GiB for KV.
    "qwen3-32b": Qwen3Shape(5120, 64, 64, 8, 128, 25600, 8192, 40960),
}
# Presets whose weights are never written: the folder holds the config and the tokenizer only, and
# vLLM serves it with --load-format dummy (random weights made on the GPU, nothing read from disk).
# Their safetensors would be 14-63 GB that only a weight-loading measurement needs.
CONFIG_ONLY_PRESETS = frozenset({"qwen3-8b", "qwen3-14b", "qwen3-32b"})

# Override flags of the model maker -> Qwen3Shape field.
OVERRIDES = {
    "--hidden-size": "hidden_size",
    "--layers": "num_hidden_layers",
    "--heads": "num_attention_heads",
    "--kv-heads": "num_key_value_heads",
    "--head-dim": "head_dim",
    "--intermediate-size": "intermediate_size",
    "--vocab-size": "vocab_size",
    "--max-position-embeddings": "max_position_embeddings",
}


def check_shape(s: Qwen3Shape) -> None:
    """Refuse a shape vLLM's Qwen3 cannot build, naming the flag."""
    flags = {field: flag for flag, field in OVERRIDES.items()}
    for field, value in asdict(s).items():
        if not isinstance(value, int) or value <= 0:
            raise MakeError(f"{flags[field]} must be a positive integer, got {value!r}")
    if s.num_attention_heads % s.num_key_value_heads:
        raise MakeError(f"--heads ({s.num_attention_heads}) must be a multiple of --kv-heads ({s.num_key_value_heads})")
    if s.head_dim % 2:
        raise MakeError(f"--head-dim ({s.head_dim}) must be even (rotary embedding)")
    if s.vocab_size < MIN_VOCAB:
        raise MakeError(
            f"--vocab-size ({s.vocab_size}) must be at least {MIN_VOCAB} (256 byte tokens and the special tokens)"
        )


def kv_cache_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes of one KV element: an fp8 cache 1, else the model's dtype (float32 4, bf16/fp16 2)."""
    if "fp8" in kv_cache_dtype:
        return 1
    return 4 if "32" in model_dtype else 2


def config_kv_bytes_per_token(config: Mapping[str, Any], kv_cache_dtype: str = "auto") -> int | None:
    """KV-cache bytes per token of a config.json (K and V of every layer's KV heads), or None for a
    model this formula does not describe (MLA, missing fields)."""
    config = config.get("text_config") or config
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if not (layers and kv_heads and head_dim) or config.get("kv_lora_rank"):
        return None
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * kv_cache_dtype_bytes(kv_cache_dtype, dtype)


def engine_model_dir(engine_argv: Sequence[str]) -> Path | None:
    """The model folder an engine command serves: ``serve MODEL`` (vLLM's CLI and the stand-in's) or
    ``--model MODEL``. Not the served model name, which is what requests carry."""
    argv = list(engine_argv)
    if "--model" in argv[:-1]:
        return Path(argv[argv.index("--model") + 1])
    # The subcommand, not a flag's value that happens to read "serve": it comes within the first four words.
    at = argv.index("serve") + 1 if "serve" in argv[:4] else len(argv)
    if at < len(argv) and not argv[at].startswith("-"):
        return Path(argv[at])
    return None


def read_kv_bytes_per_token(model_dir: Path, engine_argv: Sequence[str]) -> int | None:
    """KV bytes per token from ``model_dir/config.json`` and the engine's ``--kv-cache-dtype``;
    None where there is no local config (a model id) or the formula does not apply.

    vLLM's log gives GPU bytes per token only as 'Available KV cache memory' over 'GPU KV cache
    size', which --num-gpu-blocks-override breaks: the first H200 offload run priced a token at
    1.2 MB instead of 64 KiB that way."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    argv = list(engine_argv)
    dtype = argv[argv.index("--kv-cache-dtype") + 1] if "--kv-cache-dtype" in argv[:-1] else "auto"
    return config_kv_bytes_per_token(config, dtype) if isinstance(config, dict) else None
