"""The rehearsal model maker: a random-weight model vLLM can serve where no weights can be downloaded.

    python -m nodetools.model_maker OUT_DIR [--preset qwen3-0.8b] [--layers N] [--hidden-size N]
        [--intermediate-size N] [--heads N] [--kv-heads N] [--head-dim N] [--vocab-size N]
        [--max-position-embeddings N] [--max-shard-mib N] [--config-only] [--seed N] [--force] [--json]

OUT_DIR receives a Qwen3 model (``Qwen3ForCausalLM``, tensors named as transformers and vLLM name
them) with bf16 random weights in safetensors files (``nodetools.model_weights``), ``config.json``,
``generation_config.json``, a byte-level BPE tokenizer trained on generated text with a ChatML
chat template (``nodetools.model_tokenizer``) and the marker ``rehearsal.json`` that says the
weights are random. Its answers are gibberish; what a server does with it (load, compile, KV
cache, caches, timings) is real.

``--config-only`` (implied by the presets too big to write, ``qwen3-14b`` and ``qwen3-32b``) writes
no weights: vLLM serves such a folder with ``--load-format dummy``, initialising random weights on
the GPU from the config, so a 31 B model needs a few MB of disk (for experiments that do not
measure weight loading).

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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from nodetools.model_shapes import (
    ARCHITECTURE,
    BOS_ID,
    CONFIG_ONLY_PRESETS,
    EOS_ID,
    OVERRIDES,
    PRESETS,
    WEIGHT_BYTES,
    MakeError,
    Qwen3Shape,
    check_shape,
)
from nodetools.model_tokenizer import _ENGLISH, require_tokenizers, train_tokenizer, write_tokenizer
from nodetools.model_weights import write_weights

# _ENGLISH: the tokenizer's English words, read by the stand-in's tokenizer tests.
__all__ = ["PRESETS", "_ENGLISH", "MakeError", "Qwen3Shape", "main", "make_model", "write_tokenizer"]

MAKER = "nodetools.model_maker"
# Bump when the files written for the same options change, so existing models are remade.
FORMAT_VERSION = 1
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
MARKER = "rehearsal.json"
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json")


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


def _spec(preset: str, shape: Qwen3Shape, seed: int, max_shard_mib: int, config_only: bool) -> dict[str, Any]:
    spec = {"format": FORMAT_VERSION, "architecture": ARCHITECTURE, "preset": preset, **asdict(shape), "seed": seed,
            "max_shard_mib": max_shard_mib}
    # Only when set, so a model made before the option existed keeps its spec (and is not remade).
    return {**spec, "config_only": True} if config_only else spec


def make_model(
    out: Path,
    preset: str = "qwen3-0.8b",
    *,
    seed: int = 0,
    force: bool = False,
    max_shard_mib: int = 2048,
    config_only: bool = False,
    **overrides: int,
) -> dict[str, Any]:
    """Make the model in ``out`` unless it is already there; returns the marker plus ``path`` and ``changed``."""
    if preset not in PRESETS:
        raise MakeError(f"--preset {preset!r} is not one of {', '.join(PRESETS)}")
    shape = replace(PRESETS[preset], **overrides)
    check_shape(shape)
    if max_shard_mib <= 0:
        raise MakeError(f"--max-shard-mib must be a positive integer, got {max_shard_mib!r}")
    config_only = config_only or preset in CONFIG_ONLY_PRESETS
    spec = _spec(preset, shape, seed, max_shard_mib, config_only)
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
    require_tokenizers()
    parameters = shape.parameters()
    out.parent.mkdir(parents=True, exist_ok=True)
    need = (0 if config_only else parameters * WEIGHT_BYTES) + (64 << 20)
    if (free := shutil.disk_usage(out.parent).free) < need:
        raise MakeError(f"{out.parent} has {free / 1e9:.2f} GB free; the model needs {need / 1e9:.2f} GB")
    _remove_stale(out)
    started = time.monotonic()
    tmp = out.with_name(f".{out.name}.making-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        weights = {} if config_only else write_weights(tmp, shape, seed, max_shard_mib << 20)
        _write_json(tmp / "config.json", shape.config())
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, BOS_ID], "pad_token_id": BOS_ID},
        )
        vocab = train_tokenizer(tmp, shape.vocab_size, shape.max_position_embeddings, seed)
        # A config-only model is complete when its config and tokenizer files are: those are recorded.
        files = weights or {name: (tmp / name).stat().st_size for name in CONFIG_FILES}
        marker = {
            "random_weights": True,
            "architecture": ARCHITECTURE,
            "preset": preset,
            "parameters": parameters,
            "bytes": sum(weights.values()),
            "kv_bytes_per_token": shape.kv_bytes_per_token(),
            "seed": seed,
            "maker": MAKER,
            "made_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "make_s": round(time.monotonic() - started, 3),
            "tokenizer_vocab_size": vocab,
            "spec": spec,
            "files": files,
        }
        if config_only:
            marker["load_format"] = "dummy"  # no weights on disk: vLLM must make them (--load-format dummy)
        _write_json(tmp / MARKER, marker)
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**marker, "path": str(out), "changed": True}


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nodetools.model_maker",
        description="Write a random-weight Qwen3 model with a trained tokenizer and a chat template.",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", type=Path)
    parser.add_argument("--preset", choices=list(PRESETS), default="qwen3-0.8b")
    for flag, field in OVERRIDES.items():
        parser.add_argument(flag, dest=field, type=_positive, metavar="N", help=f"overrides the preset's {field}")
    parser.add_argument(
        "--max-shard-mib",
        type=_positive,
        default=2048,
        metavar="N",
        help="largest safetensors file (default 2048); bigger models are sharded",
    )
    parser.add_argument(
        "--config-only",
        action="store_true",
        help=f"write no weights (serve with --load-format dummy); implied by {', '.join(sorted(CONFIG_ONLY_PRESETS))}",
    )
    parser.add_argument("--seed", type=_seed, default=0)
    parser.add_argument("--force", action="store_true", help="remake even an identical model; replace any folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object (the marker, path, changed)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(argv)
    overrides = {field: getattr(ns, field) for field in OVERRIDES.values() if getattr(ns, field) is not None}
    try:
        result = make_model(ns.out_dir, ns.preset, seed=ns.seed, force=ns.force, max_shard_mib=ns.max_shard_mib,
                            config_only=ns.config_only, **overrides)
    except MakeError as exc:
        parser.error(str(exc))
    except (OSError, ImportError) as exc:
        sys.stderr.write(f"model_maker: making {ns.out_dir} failed: {exc}\n")
        return EXIT_FAILED
    if ns.json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    else:
        sys.stdout.write(_summary(result) + "\n")
    return EXIT_OK


def _summary(result: dict[str, Any]) -> str:
    what = "made" if result["changed"] else "unchanged (already made with these parameters):"
    took = f" in {result['make_s']:.1f} s" if result["changed"] else ""
    if result.get("load_format") == "dummy":
        weights = "no weights: config and tokenizer only, serve it with --load-format dummy"
    else:
        weights = f"{result['bytes']:,} bytes of random bf16 weights in {len(result['files'])} file(s)"
    return (f"{what} {result['path']}: {result['architecture']} {result['preset']}, {result['parameters']:,} "
            f"parameters ({_count(result['parameters'])}), {weights}{took}")


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f} B" if parameters >= 100_000_000 else f"{parameters / 1e6:.1f} M"


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _term_as_interrupt)  # a stopped make removes its temporary folder too
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
