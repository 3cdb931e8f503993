"""Command line of the stand-in: ``serve`` (vLLM's serve flags), ``make-model`` and ``knobs``.

``serve`` accepts the vLLM serve flags campaigns use. Those it models change its behaviour;
those it does not are accepted and logged as a WARNING; anything else is refused with exit 2
and an argparse error, as vLLM refuses it. ``--standin-*`` flags (or ``STANDIN_*`` variables) set
the stand-in's own constants (see ``config.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nodetools.standin.config import (
    Knobs,
    ServeConfig,
    convert_knob,
    knob_fields,
    knob_flag,
    knobs_from_env,
    knobs_markdown_table,
    resolve_offload,
)
from nodetools.standin.server import serve
from nodetools.standin.tokenizer import DEFAULT_TOKENIZER_VOCAB, TOKENIZER_FILES, make_tokenizer_files
from nodetools.standin.vllm_log import setup_logging

__all__ = ["build_serve_parser", "main", "make_model", "parse_serve_args"]

PROG = "python -m nodetools.standin"

# vLLM flags the stand-in accepts without modelling them: (flags, kind). "value", "int", "float"
# and "json" take one argument (typed, so `non-default args` shows 0.5, not '0.5'); "bool" is a
# BooleanOptionalAction (--x / --no-x), as vLLM generates for its boolean fields.
UNMODELLED: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--tokenizer",), "value"), (("--revision",), "value"), (("--code-revision",), "value"),
    (("--tokenizer-revision",), "value"), (("--tokenizer-mode",), "value"), (("--download-dir",), "value"),
    (("--config-format",), "value"), (("--quantization", "-q"), "value"), (("--kv-cache-dtype",), "value"),
    (("--swap-space",), "float"), (("--cpu-offload-gb",), "float"),
    (("--pipeline-parallel-size", "-pp"), "int"), (("--data-parallel-size", "-dp"), "int"),
    (("--max-logprobs",), "int"), (("--generation-config",), "value"), (("--chat-template",), "value"),
    (("--chat-template-content-format",), "value"), (("--tool-call-parser",), "value"),
    (("--reasoning-parser",), "value"), (("--model-loader-extra-config",), "json"),
    (("--safetensors-load-strategy",), "value"), (("--speculative-config",), "json"),
    (("--limit-mm-per-prompt",), "json"), (("--hf-overrides",), "json"),
    (("--override-generation-config",), "json"), (("--allowed-local-media-path",), "value"),
    (("--max-seq-len-to-capture",), "int"), (("--kv-cache-memory-bytes",), "int"),
    (("--distributed-executor-backend",), "value"), (("--worker-cls",), "value"),
    (("--uvicorn-log-level",), "value"), (("--root-path",), "value"), (("--hf-token",), "value"),
    (("--scheduling-policy",), "value"), (("--prefix-caching-hash-algo",), "value"),
    (("--kv-events-config",), "json"), (("--otlp-traces-endpoint",), "value"),
    (("--collect-detailed-traces",), "value"), (("--show-hidden-metrics-for-version",), "value"),
    (("--max-num-partial-prefills",), "int"), (("--long-prefill-token-threshold",), "int"),
    (("--mm-processor-cache-gb",), "float"), (("--ssl-keyfile",), "value"), (("--ssl-certfile",), "value"),
    (("--middleware",), "value"), (("--lora-modules",), "value"), (("--max-lora-rank",), "int"),
    (("--max-loras",), "int"), (("--api-server-count",), "int"), (("--performance-mode",), "value"),
    (("--optimization-level",), "value"), (("--attention-backend",), "value"),
    (("--mamba-ssm-cache-dtype",), "value"), (("--gpu-memory-utilization",), "float"),
    (("--trust-remote-code",), "bool"), (("--disable-hybrid-kv-cache-manager",), "bool"),
    (("--enable-chunked-prefill",), "bool"), (("--disable-custom-all-reduce",), "bool"),
    (("--enable-auto-tool-choice",), "bool"), (("--async-scheduling",), "bool"),
    (("--enable-expert-parallel",), "bool"), (("--disable-log-requests",), "bool"),
    (("--enable-log-requests",), "bool"), (("--disable-frontend-multiprocessing",), "bool"),
    (("--enable-server-load-tracking",), "bool"), (("--return-tokens-as-token-ids",), "bool"),
    (("--disable-sliding-window",), "bool"), (("--disable-cascade-attn",), "bool"),
    (("--enable-lora",), "bool"), (("--enable-log-outputs",), "bool"),
    (("--enable-force-include-usage",), "bool"), (("--disable-fastapi-docs",), "bool"),
    (("--skip-tokenizer-init",), "bool"), (("--enable-request-id-headers",), "bool"),
)
_SECRET_DESTS = {"api_key", "hf_token"}
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")


def _human_int(raw: str) -> int:
    """vLLM accepts 32768, 32k or 32K for --max-model-len."""
    match = _HUMAN_INT.match(raw.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid int value: {raw!r}")
    value, suffix = match.groups()
    scale = {"": 1, "k": 1000, "m": 10**6, "g": 10**9}[suffix.lower()]
    if suffix.isupper():
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}[suffix]
    return int(float(value) * scale)


def _json_arg(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def build_serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} serve", usage=f"{PROG} serve [model_tag] [options]",
        description="Serve an OpenAI-compatible API like `vllm serve`, with modelled timings "
                    "(engine stand-in).",
        allow_abbrev=False)
    add = parser.add_argument
    bool_opt = argparse.BooleanOptionalAction
    # Order follows vLLM's EngineArgs groups, so `non-default args` reads like vLLM's.
    add("model_tag", nargs="?", default=None, help="model directory or weights file")
    add("--host", default=None)
    add("--port", type=int, default=8000)
    add("--api-key", default=None)
    add("--disable-uvicorn-access-log", action=bool_opt, default=False)
    add("--enable-prompt-tokens-details", action=bool_opt, default=False)
    add("--model", default=None)
    add("--dtype", default="auto")
    add("--seed", type=int, default=0)
    add("--max-model-len", type=_human_int, default=None)
    add("--served-model-name", nargs="+", default=None)
    add("--enforce-eager", action=bool_opt, default=False)
    add("--enable-sleep-mode", action=bool_opt, default=False)
    add("--load-format", default="auto")
    add("--tensor-parallel-size", "-tp", type=int, default=1)
    add("--block-size", type=int, default=16)
    add("--enable-prefix-caching", action=bool_opt, default=None)
    add("--num-gpu-blocks-override", type=int, default=None)
    add("--kv-offloading-size", type=float, default=None)
    add("--kv-offloading-backend", choices=("native", "lmcache"), default=None)
    add("--max-num-batched-tokens", type=_human_int, default=None)
    add("--max-num-seqs", type=int, default=None)
    add("--compilation-config", "-cc", type=_json_arg, default=None)
    add("--kv-transfer-config", type=_json_arg, default=None)
    add("--disable-log-stats", action=bool_opt, default=False)
    unmodelled = parser.add_argument_group("accepted, not modelled by the stand-in")
    types: dict[str, Any] = {"value": str, "int": int, "float": float, "json": _json_arg}
    for flags, kind in UNMODELLED:
        if kind == "bool":
            unmodelled.add_argument(*flags, action=bool_opt, default=None)
        else:
            unmodelled.add_argument(*flags, type=types[kind], default=None)
    knobs = parser.add_argument_group("stand-in knobs (also STANDIN_* environment variables)")
    for f in knob_fields():
        knobs.add_argument(knob_flag(f.name), dest=f"standin_{f.name}", default=None, metavar="V",
                           help=f"{f.metadata['help']} (default {f.default!r})")
    return parser


def _normalise(argv: Sequence[str]) -> list[str]:
    """vLLM accepts --max_model_len as well as --max-model-len."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            key, sep, value = arg.partition("=")
            out.append(key.replace("_", "-") + sep + value)
        else:
            out.append(arg)
    return out


def parse_serve_args(argv: Sequence[str], environ: dict[str, str]) -> ServeConfig:
    parser = build_serve_parser()
    ns = parser.parse_args(_normalise(argv))
    model = ns.model_tag or ns.model
    if not model:
        parser.error("the following arguments are required: model_tag")
    try:
        values = knobs_from_env(environ)
        for f in knob_fields():
            raw = getattr(ns, f"standin_{f.name}")
            if raw is not None:
                values[f.name] = convert_knob(f.name, raw)
        knobs = Knobs(**values)
    except ValueError as exc:
        parser.error(str(exc))
    if knobs.log_style not in ("0.24", "legacy"):
        parser.error(f"{knob_flag('log_style')} must be 0.24 or legacy, not {knobs.log_style!r}")
    if knobs.tokenizer not in ("auto", "regex"):
        parser.error(f"{knob_flag('tokenizer')} must be auto or regex, not {knobs.tokenizer!r}")
    if knobs.lmcache_ops not in ("cuda", "torch"):
        parser.error(f"{knob_flag('lmcache_ops')} must be cuda or torch, not {knobs.lmcache_ops!r}")
    if knobs.offload_policy not in ("write-through", "victim"):
        parser.error(f"{knob_flag('offload_policy')} must be write-through or victim")
    if ns.block_size <= 0 or ns.tensor_parallel_size <= 0:
        parser.error("--block-size and --tensor-parallel-size must be positive")

    defaults = {a.dest: a.default for a in parser._actions}
    non_default: dict[str, Any] = {"model_tag": model, "model": model}
    unmodelled_dests = {parser._option_string_actions[flags[0]].dest: flags[0] for flags, _ in UNMODELLED}
    unmodelled: list[str] = []
    for action in parser._actions:
        dest = action.dest
        if dest in ("help", "model_tag", "model") or dest.startswith("standin_"):
            continue
        value = getattr(ns, dest)
        if value == defaults.get(dest):
            continue
        non_default[dest] = "***" if dest in _SECRET_DESTS and value else value
        if dest in unmodelled_dests:
            unmodelled.append(unmodelled_dests[dest])
    compilation = dict(ns.compilation_config or {})
    if ns.load_format not in ("auto", "safetensors", "pt", "npcache", "fastsafetensors", "dummy",
                              "runai_streamer", "runai_streamer_sharded", "gguf"):
        unmodelled.append(f"--load-format {ns.load_format}")
    offload = resolve_offload(ns.kv_offloading_size, ns.kv_offloading_backend, ns.kv_transfer_config, knobs,
                              environ)
    return ServeConfig(
        model=model, served_model_name=(ns.served_model_name or [model])[0], host=ns.host, port=ns.port,
        max_model_len=ns.max_model_len, tensor_parallel_size=ns.tensor_parallel_size,
        enforce_eager=ns.enforce_eager, enable_sleep_mode=ns.enable_sleep_mode, offload=offload,
        load_format=ns.load_format, compilation_config=compilation,
        enable_prefix_caching=ns.enable_prefix_caching is not False, block_size=ns.block_size,
        disable_log_stats=ns.disable_log_stats, seed=ns.seed, dtype=ns.dtype,
        max_num_seqs=ns.max_num_seqs or 256, max_num_batched_tokens=ns.max_num_batched_tokens or 8192,
        enable_prompt_tokens_details=ns.enable_prompt_tokens_details,
        num_gpu_blocks_override=ns.num_gpu_blocks_override, api_key=ns.api_key,
        disable_uvicorn_access_log=ns.disable_uvicorn_access_log, non_default_args=non_default,
        unmodelled_flags=tuple(unmodelled), knobs=knobs,
    )


def make_model(directory: Path, size_mib: int, shards: int, max_position_embeddings: int,
               vocab_size: int = DEFAULT_TOKENIZER_VOCAB) -> list[Path]:
    """Write a model the stand-in can load: safetensors shards, a tokenizer and a config.json.

    The tokenizer is the model maker's (``tokenizer.json``, ``tokenizer_config.json`` with a ChatML chat
    template, ``special_tokens_map.json``), so clients that count with the model's tokenizer agree with
    the stand-in; a ``tokenizer.json`` already in ``directory`` is kept. Without the ``tokenizers``
    package it is skipped with a warning on stderr (the stand-in then counts with regex word pieces).
    Returns the files written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(2**20)
    per_shard = max(1, size_mib * 2**20 // shards)
    written: list[Path] = []
    for i in range(1, shards + 1):
        header = json.dumps({"__metadata__": {"format": "pt", "engine": "stand-in"},
                             f"standin.weight_{i}": {"dtype": "U8", "shape": [per_shard],
                                                     "data_offsets": [0, per_shard]}}).encode()
        header += b" " * (-len(header) % 8)
        path = directory / f"model-{i:05d}-of-{shards:05d}.safetensors"
        with path.open("wb") as out:
            out.write(len(header).to_bytes(8, "little") + header)
            left = per_shard
            while left > 0:
                out.write(block[: min(left, len(block))])
                left -= len(block)
        written.append(path)
    config: dict[str, Any] = {"architectures": ["StandinForCausalLM"], "model_type": "standin",
                              "max_position_embeddings": max_position_embeddings}
    if (directory / "tokenizer.json").is_file():
        sys.stderr.write(f"{PROG} make-model: keeping the tokenizer.json already in {directory}\n")
    else:
        try:
            config["vocab_size"] = make_tokenizer_files(directory, vocab_size, max_position_embeddings)
            written += [directory / name for name in TOKENIZER_FILES]
        except ImportError as exc:
            sys.stderr.write(f"{PROG} make-model: no tokenizer written ({exc}); the stand-in will count tokens "
                             "with regex word pieces, not a real tokenizer\n")
    # config.json last: playbooks make the model when it is missing.
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return [*written, directory / "config.json"]


def _main_make_model(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"{PROG} make-model",
                                     description="Write a random-weights model directory for the stand-in, with a "
                                                 "trained byte-level BPE tokenizer and a chat template.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--max-position-embeddings", type=int, default=32768)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_TOKENIZER_VOCAB,
                        help=f"tokenizer vocabulary, special tokens included (default {DEFAULT_TOKENIZER_VOCAB})")
    ns = parser.parse_args(argv)
    if ns.size_mib <= 0 or ns.shards <= 0:
        parser.error("--size-mib and --shards must be positive")
    if ns.vocab_size < 259:
        parser.error("--vocab-size must be at least 259 (256 byte tokens and the special tokens)")
    for path in make_model(ns.directory, ns.size_mib, ns.shards, ns.max_position_embeddings, ns.vocab_size):
        sys.stdout.write(f"{path}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command == "serve":
        environ = dict(os.environ)
        cfg = parse_serve_args(rest, environ)
        setup_logging(environ.get("VLLM_LOGGING_LEVEL", "INFO"))
        return asyncio.run(serve(cfg, environ))
    if command == "make-model":
        return _main_make_model(rest)
    if command == "knobs":
        sys.stdout.write(knobs_markdown_table() + "\n")
        return 0
    sys.stderr.write(f"usage: {PROG} {{serve,make-model,knobs}} ...\n"
                     f"{PROG}: error: expected a command: serve MODEL [vLLM serve flags], "
                     "make-model DIR, knobs\n")
    return 2

