"""The rehearsal model maker: a random-weight model vLLM can serve where no weights can be downloaded.

    python -m nodetools.model_maker OUT_DIR [--preset qwen3-0.8b] [--layers N] [--hidden-size N]
        [--intermediate-size N] [--heads N] [--kv-heads N] [--head-dim N] [--vocab-size N]
        [--max-position-embeddings N] [--max-shard-mib N] [--seed N] [--force] [--json]

OUT_DIR receives a Qwen3 model (``Qwen3ForCausalLM``, tensors named as transformers and vLLM name
them) with bf16 random weights in safetensors files (one file, or shards of at most
``--max-shard-mib`` with ``model.safetensors.index.json``), ``config.json``,
``generation_config.json``, a byte-level BPE tokenizer trained on generated text (``tokenizer.json``,
``tokenizer_config.json`` with a ChatML chat template, ``special_tokens_map.json``) and the marker
``rehearsal.json`` that says the weights are random. Its answers are gibberish; what a server does
with it (load, compile, KV cache, caches, timings) is real.

Weights are normal(0, 0.02) values (RMSNorm weights are ones) read cyclically from one random
block of a prime number of values at a random offset per tensor, so a 0.84 B model is written in a
few seconds with bounded memory, and the same seed gives the same bytes.

The model is built in a temporary folder beside OUT_DIR and renamed into place, so an interrupted
make never leaves a half model. A folder already holding a model made with the same parameters is
left untouched (``changed: false``); a model made with other parameters is replaced; any other
non-empty folder is refused unless ``--force`` (which also remakes an identical model).

``--json`` prints one JSON object: the marker plus ``path`` and ``changed``. Exit codes: 0 made or
already there; 1 the make failed (e.g. disk full); 2 bad option or a folder it will not replace.
Needs numpy and tokenizers (both on any vLLM node), no torch or transformers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PRESETS", "MakeError", "Qwen3Shape", "main", "make_model", "write_tokenizer"]

MAKER = "nodetools.model_maker"
ARCHITECTURE = "Qwen3ForCausalLM"
# Bump when the files written for the same options change, so existing models are remade.
FORMAT_VERSION = 1
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
MARKER = "rehearsal.json"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
BOS_ID, EOS_ID = 0, 2  # as Qwen: bos <|endoftext|>, a chat turn ends with <|im_end|>
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_STD = 0.02
_BLOCK_VALUES = 4_194_301  # prime: a tensor's rows never repeat the block in step with a power-of-two width
_BF16_ONE = 0x3F80
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet and the special tokens


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


PRESETS: dict[str, Qwen3Shape] = {
    # Unit tests and quick smoke starts (head_dim 64 is one vLLM's attention backends serve): 0.6 M parameters.
    "qwen3-tiny": Qwen3Shape(128, 2, 2, 1, 64, 384, 1024, 4096),
    # The reference H200 runs (docs: shared reference gpu-vllm.md): 0.84 B parameters, 1.68 GB.
    "qwen3-0.8b": Qwen3Shape(2048, 16, 16, 8, 128, 6144, 8192, 32768),
    # Qwen3-4B's layer shapes with the small vocabulary: 3.7 B parameters, 7.3 GB.
    "qwen3-4b": Qwen3Shape(2560, 36, 32, 8, 128, 9728, 8192, 32768),
}
_OVERRIDES = {  # flag -> Qwen3Shape field
    "--hidden-size": "hidden_size",
    "--layers": "num_hidden_layers",
    "--heads": "num_attention_heads",
    "--kv-heads": "num_key_value_heads",
    "--head-dim": "head_dim",
    "--intermediate-size": "intermediate_size",
    "--vocab-size": "vocab_size",
    "--max-position-embeddings": "max_position_embeddings",
}


def _tensors(s: Qwen3Shape) -> list[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, is_norm) in module order, named as transformers' and vLLM's Qwen3 name them."""
    h, q, kv = s.hidden_size, s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    out: list[tuple[str, tuple[int, ...], bool]] = [("model.embed_tokens.weight", (s.vocab_size, h), False)]
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,), True),
            (p + "self_attn.q_proj.weight", (q, h), False),
            (p + "self_attn.k_proj.weight", (kv, h), False),
            (p + "self_attn.v_proj.weight", (kv, h), False),
            (p + "self_attn.o_proj.weight", (h, q), False),
            (p + "self_attn.q_norm.weight", (s.head_dim,), True),
            (p + "self_attn.k_norm.weight", (s.head_dim,), True),
            (p + "post_attention_layernorm.weight", (h,), True),
            (p + "mlp.gate_proj.weight", (s.intermediate_size, h), False),
            (p + "mlp.up_proj.weight", (s.intermediate_size, h), False),
            (p + "mlp.down_proj.weight", (h, s.intermediate_size), False),
        ]
    return [*out, ("model.norm.weight", (h,), True), ("lm_head.weight", (s.vocab_size, h), False)]


def _parameters(s: Qwen3Shape) -> int:
    return sum(int(np.prod(shape)) for _, shape, _ in _tensors(s))


def _config(s: Qwen3Shape) -> dict[str, Any]:
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        **asdict(s),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},  # transformers 5's spelling
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": _STD,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": s.num_hidden_layers,
        "layer_types": ["full_attention"] * s.num_hidden_layers,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def _bf16_block(seed: int, values: int) -> memoryview:
    """The random block twice over as bf16 bytes, so any run of up to a block starts anywhere in it."""
    f32 = np.random.default_rng(seed).standard_normal(values, dtype=np.float32) * np.float32(_STD)
    u32 = f32.view(np.uint32)
    bf16 = ((u32 + (np.uint32(0x7FFF) + ((u32 >> 16) & 1))) >> 16).astype("<u2")  # round to nearest even
    return memoryview(np.concatenate([bf16, bf16]).view(np.uint8))


def _shards(s: Qwen3Shape, max_shard_bytes: int) -> list[list[tuple[str, tuple[int, ...], bool]]]:
    shards: list[list[tuple[str, tuple[int, ...], bool]]] = [[]]
    size = 0
    for tensor in _tensors(s):
        nbytes = int(np.prod(tensor[1])) * 2
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    return shards


def _write_weights(folder: Path, s: Qwen3Shape, seed: int, max_shard_bytes: int) -> dict[str, int]:
    """Write the safetensors file(s) (and the index when sharded); returns {file name: bytes}."""
    # No bigger than the largest tensor: a small model then repeats no value within a tensor.
    period = min(_BLOCK_VALUES, max(int(np.prod(shape)) for _, shape, _ in _tensors(s)))
    block = _bf16_block(seed, period)
    shards = _shards(s, max_shard_bytes)
    offsets = iter(np.random.default_rng([seed, 1]).integers(0, period, size=len(_tensors(s))).tolist())
    ones = np.full(max(s.hidden_size, s.head_dim), _BF16_ONE, dtype="<u2").tobytes()
    files: dict[str, int] = {}
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, 1):
        name = "model.safetensors" if len(shards) == 1 else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        start = 0
        for tensor_name, shape, _ in shard:
            end = start + int(np.prod(shape)) * 2
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
            "metadata": {"total_size": _parameters(s) * 2, "total_parameters": _parameters(s)},
            "weight_map": weight_map,
        }
        _write_json(folder / "model.safetensors.index.json", index)
    return files


_ENGLISH = (  # common English words, so English prompts get merges too
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter "
    "mother answer found study still learn should world model server cache token memory start"
)


def _corpus(seed: int, vocab_size: int) -> list[str]:
    """Deterministic English-like text: a Zipf mix of made-up words and common English, with digits."""
    rng = np.random.default_rng([seed, 2])
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"]
    onsets += ["br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "str", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oo", "ou", "y"]
    codas = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "rd"]
    syllables = [a + b + c for a in onsets for b in vowels for c in codas]
    count = 30_000
    lengths = rng.integers(1, 4, size=count).tolist()
    picks = rng.integers(0, len(syllables), size=(count, 3)).tolist()
    made_up = ["".join(syllables[j] for j in picks[i][: lengths[i]]) for i in range(count)]
    lexicon = list(dict.fromkeys(_ENGLISH.split() + made_up))
    weights = 1.0 / (np.arange(len(lexicon)) + 2.7)
    n_words = int(min(300_000, max(30_000, vocab_size * 30)))
    words = [lexicon[i] for i in rng.choice(len(lexicon), size=n_words, p=weights / weights.sum()).tolist()]
    numbers = rng.integers(0, 100_000, size=n_words // 12 + 1).tolist()
    punctuation = [". ", ", ", "? ", "! ", ".\n", ": ", "; "]
    ends = rng.integers(0, len(punctuation), size=n_words // 12 + 1).tolist()
    chunks, sentences = [], []
    for k, i in enumerate(range(0, n_words, 12)):
        sentence = words[i : i + 12]
        sentences.append(f"{sentence[0].capitalize()} {' '.join(sentence[1:])} {numbers[k]}{punctuation[ends[k]]}")
        if len(sentences) == 64:
            chunks.append("".join(sentences))
            sentences = []
    return [*chunks, "".join(sentences)]


def _write_tokenizer(folder: Path, s: Qwen3Shape, seed: int) -> int:
    """Train a byte-level BPE of at most vocab_size tokens (special tokens included); returns its size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=s.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed, s.vocab_size), trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    _write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": {str(i): {"content": t, **special} for i, t in enumerate(SPECIAL_TOKENS)},
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "bos_token": None,
            "eos_token": SPECIAL_TOKENS[EOS_ID],
            "pad_token": SPECIAL_TOKENS[BOS_ID],
            "unk_token": None,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "model_max_length": s.max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        folder / "special_tokens_map.json",
        {
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "eos_token": SPECIAL_TOKENS[EOS_ID],
            "pad_token": SPECIAL_TOKENS[BOS_ID],
        },
    )
    return int(tokenizer.get_vocab_size())


def write_tokenizer(folder: Path, vocab_size: int, max_position_embeddings: int, seed: int = 0) -> int:
    """Write only the tokenizer files (``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
    ``special_tokens_map.json``) into ``folder``, as ``make_model`` does; returns the vocabulary size.

    The engine stand-in's ``make-model`` uses it, so its folders tokenize like a rehearsal model's.
    """
    if vocab_size < _MIN_VOCAB:
        raise MakeError(f"vocab_size ({vocab_size}) must be at least {_MIN_VOCAB}")
    _require_tokenizers()
    shape = replace(PRESETS["qwen3-tiny"], vocab_size=vocab_size, max_position_embeddings=max_position_embeddings)
    return _write_tokenizer(folder, shape, seed)


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _existing(out: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The marker of a complete model made with this spec already in ``out``, else None."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("spec") != spec:
        return None
    files = marker.get("files") or {}
    for name, size in files.items():
        try:
            if (out / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return marker if files else None


def _is_ours(out: Path) -> bool:
    try:
        return json.loads((out / MARKER).read_text()).get("maker") == MAKER
    except (OSError, ValueError, AttributeError):
        return False


def _remove_stale(out: Path) -> None:
    """Temporary folders of makes that were killed (their process is gone)."""
    for stale in out.parent.glob(f".{out.name}.*-*"):
        try:
            os.kill(int(stale.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


class MakeError(Exception):
    """A request the maker refuses (exit 2)."""


def make_model(
    out: Path,
    preset: str = "qwen3-0.8b",
    *,
    seed: int = 0,
    force: bool = False,
    max_shard_mib: int = 2048,
    **overrides: int,
) -> dict[str, Any]:
    """Make the model in ``out`` unless it is already there; returns the marker plus ``path`` and ``changed``."""
    if preset not in PRESETS:
        raise MakeError(f"--preset {preset!r} is not one of {', '.join(PRESETS)}")
    shape = replace(PRESETS[preset], **overrides)
    _check(shape, max_shard_mib)
    spec = {
        "format": FORMAT_VERSION,
        "architecture": ARCHITECTURE,
        "preset": preset,
        **asdict(shape),
        "seed": seed,
        "max_shard_mib": max_shard_mib,
    }
    out = out.absolute()
    if not force and (found := _existing(out, spec)) is not None:
        return {**found, "path": str(out), "changed": False}
    if out.exists() and not out.is_dir():
        raise MakeError(f"OUT_DIR {out} exists and is not a folder")
    if not force and out.is_dir() and any(out.iterdir()) and not _is_ours(out):
        raise MakeError(
            f"OUT_DIR {out} is not empty and holds no model made by {MAKER}; "
            "refusing to replace it (--force replaces it)"
        )
    _require_tokenizers()
    parameters = _parameters(shape)
    out.parent.mkdir(parents=True, exist_ok=True)
    need = parameters * 2 + (64 << 20)
    if (free := shutil.disk_usage(out.parent).free) < need:
        raise MakeError(f"{out.parent} has {free / 1e9:.2f} GB free; the model needs {need / 1e9:.2f} GB")
    _remove_stale(out)
    started = time.monotonic()
    tmp = out.with_name(f".{out.name}.making-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        files = _write_weights(tmp, shape, seed, max_shard_mib << 20)
        _write_json(tmp / "config.json", _config(shape))
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, BOS_ID], "pad_token_id": BOS_ID},
        )
        vocab = _write_tokenizer(tmp, shape, seed)
        marker = {
            "random_weights": True,
            "architecture": ARCHITECTURE,
            "preset": preset,
            "parameters": parameters,
            "bytes": sum(files.values()),
            "seed": seed,
            "maker": MAKER,
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "make_s": round(time.monotonic() - started, 3),
            "tokenizer_vocab_size": vocab,
            "spec": spec,
            "files": files,
        }
        _write_json(tmp / MARKER, marker)
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**marker, "path": str(out), "changed": True}


def _require_tokenizers() -> None:
    """Fail before writing gigabytes of weights, not after."""
    try:
        import tokenizers  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the Python package tokenizers is needed to train the tokenizer (vLLM brings it; or pip install tokenizers)"
        ) from exc


def _check(s: Qwen3Shape, max_shard_mib: int) -> None:
    flags = {field: flag for flag, field in _OVERRIDES.items()}
    for field, value in asdict(s).items():
        if not isinstance(value, int) or value <= 0:
            raise MakeError(f"{flags[field]} must be a positive integer, got {value!r}")
    if s.num_attention_heads % s.num_key_value_heads:
        raise MakeError(f"--heads ({s.num_attention_heads}) must be a multiple of --kv-heads ({s.num_key_value_heads})")
    if s.head_dim % 2:
        raise MakeError(f"--head-dim ({s.head_dim}) must be even (rotary embedding)")
    if s.vocab_size < _MIN_VOCAB:
        raise MakeError(
            f"--vocab-size ({s.vocab_size}) must be at least {_MIN_VOCAB} (256 byte tokens and the special tokens)"
        )
    if max_shard_mib <= 0:
        raise MakeError(f"--max-shard-mib must be a positive integer, got {max_shard_mib!r}")


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the finished model into place; an old one is moved aside first and deleted after."""
    if not out.exists():
        tmp.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    try:
        tmp.rename(out)
    except OSError:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodetools.model_maker",
        description="Write a random-weight Qwen3 model with a trained tokenizer and a chat template.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path)
    parser.add_argument("--preset", choices=list(PRESETS), default="qwen3-0.8b")
    for flag, field in _OVERRIDES.items():
        parser.add_argument(flag, dest=field, type=_positive, metavar="N", help=f"overrides the preset's {field}")
    parser.add_argument(
        "--max-shard-mib",
        type=_positive,
        default=2048,
        metavar="N",
        help="largest safetensors file (default 2048); bigger models are sharded",
    )
    parser.add_argument("--seed", type=_seed, default=0)
    parser.add_argument("--force", action="store_true", help="remake even an identical model; replace any folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the marker, path, changed)")
    ns = parser.parse_args(argv)
    overrides = {field: getattr(ns, field) for field in _OVERRIDES.values() if getattr(ns, field) is not None}
    try:
        result = make_model(
            ns.out_dir, ns.preset, seed=ns.seed, force=ns.force, max_shard_mib=ns.max_shard_mib, **overrides
        )
    except MakeError as exc:
        parser.error(str(exc))
    except (OSError, ImportError) as exc:
        sys.stderr.write(f"model_maker: making {ns.out_dir} failed: {exc}\n")
        return EXIT_FAILED
    if ns.json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    else:
        what = "made" if result["changed"] else "unchanged (already made with these parameters):"
        took = f" in {result['make_s']:.1f} s" if result["changed"] else ""
        sys.stdout.write(
            f"{what} {result['path']}: {result['architecture']} {result['preset']}, "
            f"{result['parameters']:,} parameters ({_count(result['parameters'])}), "
            f"{result['bytes']:,} bytes of random bf16 weights in {len(result['files'])} file(s){took}\n"
        )
    return EXIT_OK


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f} B" if parameters >= 100_000_000 else f"{parameters / 1e6:.1f} M"


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _term_as_interrupt)  # a stopped make removes its temporary folder too
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
