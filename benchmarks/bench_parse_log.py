"""Time the vLLM log parser and measure its peak memory on large logs, one per collector format.

Not a test: run ``.venv/bin/python benchmarks/bench_parse_log.py [--mb 300]``. Each log is
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

Formats (``--format``, comma-separated; default: the seven of :data:`DEFAULT_FORMATS`): each line
of the corpus wrapped as a log collector hands it over (see docs/parse-log.md): ``bare``,
``kubectl`` (``kubectl logs --prefix --timestamps``), ``cri`` (the node's container log file),
``journald`` (``journalctl -o short-iso``), ``cloud-export`` (a logging console's text export,
``LEVEL TIMESTAMP [resource.labels.containerName: vllm] <line>``), ``cloud-json`` (Cloud
Logging JSON entries), ``custom-timestamps`` (a line shipper's ``2026-11-29 14:44:17,123``
stamp), ``dmesg`` (the kernel log's ``[ 1234.567890]`` stamp, kernel lines between, the OOM
killer's lines at the end) and ``mixed`` (the six of ``bare`` to ``dmesg`` line by line in
turn). One line per format: MB/s (best of ``--repeat``) by wall time and by the child's CPU time
(steadier on a machine that other jobs share) and peak memory.

``--gzip`` compresses each log; ``--impl FILE`` times another copy of ``vllm_log.py`` (e.g.
``git show HEAD~1:runner/parse/vllm_log.py > /tmp/old.py``) for a before/after comparison; it
imports the rest of ``runner`` from this checkout. ``--impl DIR`` imports all of ``runner`` from a
folder that holds an older one (``mkdir /tmp/old && git archive HEAD~3 runner | tar -x -C /tmp/old``),
for a change that spans the parser's modules. The header and the last line give the load average:
other jobs on the machine lower the wall-clock figures, less so those by CPU time.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
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


def _rfc3339(i: int) -> str:
    return f"2026-11-29T14:{i // 60 % 60:02d}:{i % 60:02d}.{i * 7919 % 10**9:09d}Z"


def _stderr(line: str) -> bool:
    return line.startswith("(EngineCore")  # the engine core's lines go to stderr


def _kubectl(i: int, line: str) -> str:
    return f"[pod/vllm-7d9f8b6c5-x2x4k/vllm] {_rfc3339(i)} {line}"


def _cri(i: int, line: str) -> str:
    return f"{_rfc3339(i)} {'stderr' if _stderr(line) else 'stdout'} F {line}"


def _journald(i: int, line: str) -> str:
    return f"2026-11-29T14:{i // 60 % 60:02d}:{i % 60:02d}+0000 gpu-node-01 vllm[1234]: {line}"


def _cloud_export(i: int, line: str) -> str:
    level = "ERROR" if _stderr(line) else "INFO"  # the console marks all of stderr ERROR
    return f"{level} {_rfc3339(i)[:-4]}Z [resource.labels.containerName: vllm] {line}"


def _cloud_json(i: int, line: str) -> str:
    return json.dumps({"textPayload": line + "\n", "timestamp": _rfc3339(i), "severity": "INFO",
                       "resource": {"type": "k8s_container", "labels": {"container_name": "vllm"}}})  # fmt: skip


def _custom_timestamps(i: int, line: str) -> str:
    return f"2026-11-29 14:{i // 60 % 60:02d}:{i % 60:02d},{i % 1000:03d} {line}"


def _dmesg(i: int, line: str) -> str:
    stamp = f"[{10_000 + i // 1000:5d}.{i % 1000 * 997:06d}] "
    kernel = f"{stamp}nvidia-nvlink: Unregistered Nvlink Core, major device number 234\n" if i % 97 == 0 else ""
    return kernel + stamp + line


def _mixed(i: int, line: str) -> str:
    """Each line as another collector hands it over, in turn (logs of several sources in one file)."""
    return _MIXED[i % len(_MIXED)](i, line)


_OOM_KILLER = (
    "[99999.789012] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0\n"
    "[99999.790001] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),task=python3,pid=5034,uid=0\n"
    "[99999.790123] Out of memory: Killed process 5034 (python3) total-vm:950000000kB, anon-rss:940000000kB\n"
)

FORMATS: dict[str, Callable[[int, str], str]] = {
    "bare": lambda _i, line: line,
    "kubectl": _kubectl,
    "cri": _cri,
    "journald": _journald,
    "cloud-export": _cloud_export,
    "cloud-json": _cloud_json,
    "custom-timestamps": _custom_timestamps,
    "dmesg": _dmesg,
    "mixed": _mixed,
}
_MIXED = (FORMATS["bare"], _kubectl, _journald, _cloud_export, _custom_timestamps, _dmesg)
DEFAULT_FORMATS = ("bare", "kubectl", "journald", "cloud-export", "custom-timestamps", "dmesg", "mixed")


def _wrap(fmt: str, text: str, first: int) -> str:
    wrap = FORMATS[fmt]
    return "".join(wrap(first + i, line) + "\n" for i, line in enumerate(_lines(text)))


def write_log(path: Path, target_mb: float, corpus: str = "real", fmt: str = "bare") -> int:
    """Write a log of about ``target_mb`` MB; return its size in bytes (before any gzip)."""
    blocks = _real_blocks() if corpus == "real" else _serving_blocks()
    target = int(target_mb * 1_000_000)
    with path.open("w", encoding="utf-8") as fh:
        size = i = lines = 0
        while size < target:
            block = blocks(i)
            size += fh.write(_wrap(fmt, block, lines))
            lines += block.count("\n")
            i += 1
        if corpus == "serving":
            size += fh.write(_wrap(fmt, (
                "(EngineCore pid=5627) INFO 11-29 23:59:58 [abstract.py:327] It took 1.551646 seconds to fall asleep.\n"
                "(EngineCore pid=5627) INFO 11-29 23:59:59 [abstract.py:345] It took 0.112183 seconds to wake up "
                "tags {'weights', 'kv_cache'}.\n"
            ), lines))  # fmt: skip
        if fmt == "dmesg":
            size += fh.write(_OOM_KILLER)
    return path.stat().st_size


def _load_parser(impl: str | None) -> Callable[[Path], dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    folder = impl if impl is not None and Path(impl).is_dir() else None
    if folder is not None:
        sys.path.insert(0, folder)  # an older runner/ package: it comes first
    if impl is None or folder is not None:
        from runner.parse import vllm_log

        if folder is not None and not Path(vllm_log.__file__).is_relative_to(folder):
            raise SystemExit(f"--impl {folder}: no runner/parse/vllm_log.py there")
        return vllm_log.parse_log_file
    spec = importlib.util.spec_from_file_location("vllm_log_impl", impl)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_log_file


def _child(path: str, impl: str | None) -> None:
    parse = _load_parser(impl)
    out: dict[str, Any] = {}
    if path:
        t0, c0 = time.perf_counter(), time.process_time()
        record = parse(Path(path))
        out = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
               "stats_count": record["stats_count"],
               "wrapper": record.get("wrapper", "-"), "errors": record["errors"]}  # fmt: skip
    out["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


def _run_child(path: Path | None, impl: str | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(path or "")]
    if impl:
        cmd += ["--impl", impl]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise SystemExit(f"the timed child failed: {last[0]}")
    return json.loads(done.stdout.splitlines()[-1])


def _formats(arg: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in arg.split(",") if name.strip())
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown format {unknown}: choose from {', '.join(FORMATS)}")
    return names


def _bench(fmt: str, args: argparse.Namespace, baseline: int) -> str:
    with tempfile.TemporaryDirectory(prefix="bench_parse_log_") as tmp:
        path = Path(tmp) / "vllm.log"
        size = write_log(path, args.mb, args.corpus, fmt)
        if args.gzip:
            with path.open("rb") as src, gzip.open(path.with_suffix(".log.gz"), "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            path.unlink()
            path = path.with_suffix(".log.gz")
        runs = [_run_child(path, args.impl) for _ in range(args.repeat)]
    best = min(run["seconds"] for run in runs)
    best_cpu = min(run["cpu_seconds"] for run in runs)
    peak = max(run["maxrss_kib"] for run in runs)
    mb = size / 1_000_000
    first = runs[0]
    return (f"{fmt:<18} {mb / best:6.1f} MB/s ({mb / best_cpu:5.1f} by CPU time)  "
            f"{peak / 1024:4.0f} MiB peak (+{(peak - baseline) / 1024:.0f})  "
            f"{mb:.0f} MB in {best:.2f} s  wrapper={first['wrapper']} stats={first['stats_count']} "
            f"errors={','.join(first['errors']) or '-'}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=300.0, help="size of each generated log in MB")
    parser.add_argument("--corpus", choices=("real", "serving"), default="real")
    parser.add_argument("--format", type=_formats, default=DEFAULT_FORMATS,
                        help=f"comma-separated, from: {', '.join(FORMATS)} (default: {','.join(DEFAULT_FORMATS)})")
    parser.add_argument("--gzip", action="store_true", help="parse a gzip-compressed copy")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs, each in a fresh process (best is reported)")
    parser.add_argument("--impl", type=lambda p: str(Path(p).resolve()),
                        help="time this copy of vllm_log.py, or the runner/ package in this folder, instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.impl)
        return
    baseline = _run_child(None, args.impl)["maxrss_kib"]
    print(f"corpus {args.corpus}, ~{args.mb:g} MB per format{', gzip' if args.gzip else ''}, "
          f"best of {args.repeat}, parser: {args.impl or 'runner.parse.vllm_log'}, "
          f"baseline after import {baseline / 1024:.0f} MiB, {_load()}")  # fmt: skip
    for fmt in args.format:
        print(_bench(fmt, args, baseline), flush=True)
    print(f"{_load()} at the end, {os.cpu_count()} CPUs")


def _load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


if __name__ == "__main__":
    main()
