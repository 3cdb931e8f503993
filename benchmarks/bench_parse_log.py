"""Time the vLLM log parser on a synthetic ~100 MB server log.

Not a test: run ``.venv/bin/python benchmarks/bench_parse_log.py [--mb 100]``. The log is
written to a temporary directory (removed afterwards) and has a real vLLM 0.24.0 startup,
then a serving mix that is heavy on short lines (which is the hard case for a line parser):
uvicorn access lines, request-log lines, periodic ``Engine 000:`` stats lines (INFO, and
DEBUG when idle), ``\\r``-joined progress bars, and a sleep/wake cycle at the end.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from runner.parse.vllm_log import parse_log_file

REPO = Path(__file__).resolve().parents[1]
STARTUP = REPO / "tests/fixtures/vllm_logs/real/vllm-0.24.0-h200-first_start.log"
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


def write_log(path: Path, target_mb: float) -> int:
    rng = random.Random(42)
    target = int(target_mb * 1_000_000)
    with path.open("w", encoding="utf-8") as fh:
        size = fh.write(STARTUP.read_text(encoding="utf-8"))
        i = 0
        while size < target:
            size += fh.write(_serving_block(rng, i))
            i += 1
        size += fh.write(
            "(EngineCore pid=5627) INFO 11-29 23:59:58 [abstract.py:327] "
            "It took 1.551646 seconds to fall asleep.\n"
            "(EngineCore pid=5627) INFO 11-29 23:59:59 [abstract.py:345] It took 0.112183 seconds to wake up "
            "tags {'weights', 'kv_cache'}.\n"
        )
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the synthetic log in MB")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (best is reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_parse_log_") as tmp:
        path = Path(tmp) / "vllm.log"
        size = write_log(path, args.mb)
        best = float("inf")
        result: dict[str, object] = {}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = parse_log_file(path)
            best = min(best, time.perf_counter() - t0)
        mb = size / 1_000_000
        print(f"log: {mb:.1f} MB, {result['stats_count']} stats lines, errors={result['errors']}")
        print(f"parse_log_file: best of {args.repeat}: {best:.2f} s = {mb / best:.1f} MB/s")
        print(f"extrapolated for 100 MB: {100 / (mb / best):.2f} s")


if __name__ == "__main__":
    main()
