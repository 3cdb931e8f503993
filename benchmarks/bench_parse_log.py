"""Time the vLLM log parser and measure its peak memory on a large generated log.

Not a test: run ``.venv/bin/python benchmarks/bench_parse_log.py [--mb 300]``. The log is
written to a temporary directory (removed afterwards); each timed run parses it in a fresh
child process, which reports its wall time and peak resident memory (``ru_maxrss``). The
baseline is the peak of a child that only imports the parser, so ``peak - baseline`` is what
parsing itself holds.

Corpora (``--corpus``):

* ``real`` (default): the real vLLM 0.24.0 logs under ``tests/fixtures/vllm_logs/real/``
  repeated; startup-heavy, a quarter of its lines are lines the parser must read.
* ``serving``: one real startup, then a serving mix that is heavy on short lines: uvicorn
  access lines, request-log lines (with keywords in them that the parser must reject),
  periodic ``Engine 000:`` stats lines (INFO, and DEBUG when idle), ``\\r``-joined progress
  bars, and a sleep/wake cycle at the end.

``--wrap kubernetes-cri`` / ``--wrap gcp-logging-json`` puts each line in that collector
format first; ``--gzip`` compresses the log; ``--impl FILE`` times another copy of
``vllm_log.py`` (e.g. ``git show HEAD~1:runner/parse/vllm_log.py > /tmp/old.py``) for a
before/after comparison.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "tests/fixtures/vllm_logs/real"
STARTUP = REAL / "vllm-0.24.0-h200-first_start.log"
# Request-log text with keywords in it ("took", "memory"): candidate lines the parser must reject.
_REQUEST_TAIL = (
    "prompt: 'the model took a while; GPU memory looks fine', "
    "params: SamplingParams(n=1, temperature=0.7, max_tokens=128), lora_request: None."
)


def _serving_block(rng: random.Random, i: int) -> str:
    sec = f"{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
    lines = []
    for j in range(rng.randint(4, 12)):
        lines.append(
            f'(APIServer pid=1055) INFO:     127.0.0.1:{40000 + (i + j) % 20000} - "POST /v1/completions '
            'HTTP/1.1" 200 OK'
        )
        if rng.random() < 0.3:
            lines.append(
                f"(APIServer pid=1055) INFO 11-29 {sec}.{j:03d} [logger.py:43] "
                f"Received request cmpl-{i:08x}-{j}: {_REQUEST_TAIL}"
            )
    idle = rng.random() < 0.2
    level = "DEBUG" if idle else "INFO"
    tput = "0.0" if idle else f"{rng.uniform(100, 5000):.1f}"
    lines.append(
        f"(APIServer pid=1055) {level} 11-29 {sec}.500 [loggers.py:273] Engine 000: Avg prompt throughput: "
        f"{tput} tokens/s, Avg generation throughput: {tput} tokens/s, Running: {rng.randint(0, 64)} reqs, "
        f"Waiting: {rng.randint(0, 8)} reqs, GPU KV cache usage: {rng.uniform(0, 100):.1f}%, "
        f"Prefix cache hit rate: {rng.uniform(0, 100):.1f}%, External prefix cache hit rate: "
        f"{rng.uniform(0, 100):.1f}%"
    )
    if rng.random() < 0.01:
        lines.append(
            "(EngineCore pid=5627) Capturing CUDA graphs (PIECEWISE):   0%|          | 0/51 [00:00<?, ?it/s]"
            "\rCapturing CUDA graphs (PIECEWISE):  50%|#####     | 25/51 [00:00<00:01, 25.21it/s]"
        )
    return "\n".join(lines) + "\n"


def _real_blocks() -> Callable[[int], str]:
    logs = [p.read_text(encoding="utf-8") for p in sorted(REAL.glob("*.log"))]
    block = "".join(text if text.endswith("\n") else text + "\n" for text in logs)
    return lambda _i: block


def _serving_blocks() -> Callable[[int], str]:
    rng = random.Random(42)
    return lambda i: (STARTUP.read_text(encoding="utf-8") if i == 0 else "") + _serving_block(rng, i)


def _lines(text: str) -> list[str]:
    return text.removesuffix("\n").split("\n")  # not splitlines(): a "\r" stays inside its line


def _wrap_cri(text: str) -> str:
    return "".join(f"2026-11-29T10:00:00.{i:09d}Z stdout F {line}\n" for i, line in enumerate(_lines(text)))


def _wrap_gcp(text: str) -> str:
    return "".join(
        json.dumps({"textPayload": line + "\n", "timestamp": "2026-11-29T10:00:00.123456789Z", "severity": "INFO",
                    "resource": {"type": "k8s_container", "labels": {"container_name": "vllm"}}}) + "\n"
        for line in _lines(text)
    )  # fmt: skip


WRAPS: dict[str, Callable[[str], str]] = {"none": lambda text: text, "kubernetes-cri": _wrap_cri,
                                          "gcp-logging-json": _wrap_gcp}  # fmt: skip


def write_log(path: Path, target_mb: float, corpus: str = "real", wrap: str = "none") -> int:
    """Write a log of about ``target_mb`` MB; return its size in bytes (before any gzip)."""
    blocks = _real_blocks() if corpus == "real" else _serving_blocks()
    wrapper = WRAPS[wrap]
    target = int(target_mb * 1_000_000)
    with path.open("w", encoding="utf-8") as fh:
        size = i = 0
        while size < target:
            size += fh.write(wrapper(blocks(i)))
            i += 1
        if corpus == "serving":
            size += fh.write(wrapper(
                "(EngineCore pid=5627) INFO 11-29 23:59:58 [abstract.py:327] It took 1.551646 seconds to fall asleep.\n"
                "(EngineCore pid=5627) INFO 11-29 23:59:59 [abstract.py:345] It took 0.112183 seconds to wake up "
                "tags {'weights', 'kv_cache'}.\n"
            ))  # fmt: skip
    return path.stat().st_size


def _load_parser(impl: str | None) -> Callable[[Path], dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    if impl is None:
        from runner.parse.vllm_log import parse_log_file

        return parse_log_file
    spec = importlib.util.spec_from_file_location("vllm_log_impl", impl)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_log_file


def _child(path: str, impl: str | None) -> None:
    parse = _load_parser(impl)
    out: dict[str, Any] = {}
    if path:
        t0 = time.perf_counter()
        record = parse(Path(path))
        out = {"seconds": time.perf_counter() - t0, "stats_count": record["stats_count"],
               "wrapper": record.get("wrapper", "-"), "errors": record["errors"]}  # fmt: skip
    out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


def _run_child(path: Path | None, impl: str | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(path or "")]
    if impl:
        cmd += ["--impl", impl]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=300.0, help="size of the generated log in MB")
    parser.add_argument("--corpus", choices=("real", "serving"), default="real")
    parser.add_argument("--wrap", choices=sorted(WRAPS), default="none")
    parser.add_argument("--gzip", action="store_true", help="parse a gzip-compressed copy")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs, each in a fresh process (best is reported)")
    parser.add_argument("--impl", type=lambda p: str(Path(p).resolve()), help="time this copy of vllm_log.py instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.impl)
        return
    with tempfile.TemporaryDirectory(prefix="bench_parse_log_") as tmp:
        path = Path(tmp) / "vllm.log"
        size = write_log(path, args.mb, args.corpus, args.wrap)
        if args.gzip:
            with path.open("rb") as src, gzip.open(path.with_suffix(".log.gz"), "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            path.unlink()
            path = path.with_suffix(".log.gz")
        baseline = _run_child(None, args.impl)["maxrss_kib"]
        runs = [_run_child(path, args.impl) for _ in range(args.repeat)]
    best = min(run["seconds"] for run in runs)
    peak = max(run["maxrss_kib"] for run in runs)
    mb = size / 1_000_000
    first = runs[0]
    print(f"log: {mb:.1f} MB ({args.corpus}, wrapper {args.wrap}{', gzip' if args.gzip else ''}), "
          f"parser: {args.impl or 'runner.parse.vllm_log'}")  # fmt: skip
    print(f"record: wrapper={first['wrapper']} stats_count={first['stats_count']} errors={first['errors']}")
    print(f"speed: best of {args.repeat}: {best:.2f} s = {mb / best:.1f} MB/s")
    print(f"peak RSS: {peak / 1024:.0f} MiB (baseline after import {baseline / 1024:.0f} MiB, "
          f"parsing adds {(peak - baseline) / 1024:.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
