"""The rehearsal model's random bf16 weights, written as safetensors (one file, or shards and an index).

Values are normal(0, 0.02) (RMSNorm weights are ones) read cyclically from one random block of a
prime number of values at a random offset per tensor, so a 0.84 B model is written in a few
seconds with bounded memory (~100 MB), and the same seed gives the same bytes. Files are fsynced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from nodetools.model_shapes import INIT_STD, WEIGHT_BYTES, Qwen3Shape

__all__ = ["write_weights"]

_BLOCK_VALUES = 4_194_301  # prime: a tensor's rows never repeat the block in step with a power-of-two width
_BF16_ONE = 0x3F80
Tensor = tuple[str, tuple[int, ...], bool]  # name, shape, is_norm


def _bf16_block(seed: int, values: int) -> memoryview:
    """The random block twice over as bf16 bytes, so any run of up to a block starts anywhere in it."""
    f32 = np.random.default_rng(seed).standard_normal(values, dtype=np.float32) * np.float32(INIT_STD)
    u32 = f32.view(np.uint32)
    bf16 = ((u32 + (np.uint32(0x7FFF) + ((u32 >> 16) & 1))) >> 16).astype("<u2")  # round to nearest even
    return memoryview(np.concatenate([bf16, bf16]).view(np.uint8))


def _shards(tensors: list[Tensor], max_shard_bytes: int) -> list[list[Tensor]]:
    shards: list[list[Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = int(np.prod(tensor[1])) * WEIGHT_BYTES
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    return shards


def write_weights(folder: Path, s: Qwen3Shape, seed: int, max_shard_bytes: int) -> dict[str, int]:
    """Write the safetensors file(s) (and the index when sharded); returns {file name: bytes}."""
    tensors = s.tensors()
    # No bigger than the largest tensor: a small model then repeats no value within a tensor.
    period = min(_BLOCK_VALUES, max(int(np.prod(shape)) for _, shape, _ in tensors))
    block = _bf16_block(seed, period)
    shards = _shards(tensors, max_shard_bytes)
    offsets = iter(np.random.default_rng([seed, 1]).integers(0, period, size=len(tensors)).tolist())
    ones = np.full(max(s.hidden_size, s.head_dim), _BF16_ONE, dtype="<u2").tobytes()
    files: dict[str, int] = {}
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, 1):
        name = "model.safetensors" if len(shards) == 1 else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        start = 0
        for tensor_name, shape, _ in shard:
            end = start + int(np.prod(shape)) * WEIGHT_BYTES
            header[tensor_name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [start, end]}
            start = end
            weight_map[tensor_name] = name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(8 + len(raw)) % 8)  # the data starts 8-byte aligned
        with (folder / name).open("wb") as out:
            out.write(len(raw).to_bytes(8, "little") + raw)
            for _, shape, is_norm in shard:
                values = int(np.prod(shape))
                offset = next(offsets)
                if is_norm:
                    out.write(ones[: values * 2])
                    continue
                while values:
                    run = min(values, period)
                    out.write(block[offset * 2 : (offset + run) * 2])
                    offset = (offset + run) % period
                    values -= run
            out.flush()
            os.fsync(out.fileno())
        files[name] = (folder / name).stat().st_size
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": s.parameters() * WEIGHT_BYTES, "total_parameters": s.parameters()},
            "weight_map": weight_map,
        }
        _write_json(folder / "model.safetensors.index.json", index)
    return files


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
