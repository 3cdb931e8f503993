"""Command line of the node-side load generator and quality check.

    python -m nodetools.loadgen run --url http://127.0.0.1:8000 [--url ...] --model NAME
        --out requests.jsonl [--summary summary.json] [--sessions 32 --history-tokens 100000
        --concurrency 8 --turns 6 --turn-tokens 2400 --output-tokens 400 --seed 0
        --request-timeout-s 600 --max-wall-s 2400 --retries 0]
    python -m nodetools.loadgen quality --url URL --model NAME --out quality.jsonl
        [--summary quality.json] [--conversations 8 --turns 3 --doc-tokens 6000 --seed 0
        --max-tokens 256 --engine-kind vllm|stand-in]

Exit codes: 0 every request answered; 1 some request failed, was not sent, or the load stopped
early (the records say which and why); 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from nodetools.loadgen.multiturn import MultiTurnLoad, Workload
from nodetools.loadgen.quality import QualityCheck, QualitySpec

EXIT_OK, EXIT_INCOMPLETE, EXIT_BAD_INPUT = 0, 1, 2


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    for f in dataclasses.fields(cls):
        default = f.default
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(default), default=default)


def _write(path: Path | None, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if path is None:
        sys.stdout.write(text)
    else:
        path.write_text(text)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", action="append", required=True, help="server base URL; repeat for engine copies")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--out", type=Path, required=True, help="JSONL, one record per request")
    p.add_argument("--summary", type=Path, help="summary JSON (default: stdout)")


def _run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.loadgen run")
    _common(p)
    _add_dataclass_flags(p, Workload)
    args = vars(p.parse_args(argv))
    workload = Workload(**{f.name: args[f.name] for f in dataclasses.fields(Workload)})
    try:
        load = MultiTurnLoad(workload, args["url"], args["model"], args["out"])
    except ValueError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)  # noqa: T201
        return EXIT_BAD_INPUT
    summary = asyncio.run(load.run())
    _write(args["summary"], summary)
    complete = summary["counts"]["failed"] == 0 and summary["counts"]["not_sent"] == 0
    return EXIT_OK if complete else EXIT_INCOMPLETE


def _quality(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.loadgen quality")
    _common(p)
    _add_dataclass_flags(p, QualitySpec)
    p.add_argument("--engine-kind", default="", help="stand-in: the check is reported as not applicable")
    args = vars(p.parse_args(argv))
    spec = QualitySpec(**{f.name: args[f.name] for f in dataclasses.fields(QualitySpec)})
    check = QualityCheck(spec, args["url"][0], args["model"], args["out"], engine_kind=args["engine_kind"])
    summary = asyncio.run(check.run())
    _write(args["summary"], summary)
    return EXIT_OK if summary["failed_requests"] == 0 else EXIT_INCOMPLETE


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"]:
        return _run(args[1:])
    if args[:1] == ["quality"]:
        return _quality(args[1:])
    print("usage: python -m nodetools.loadgen {run|quality} ... (see --help of each)", file=sys.stderr)  # noqa: T201
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
