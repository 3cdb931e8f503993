"""How much the multi-turn load generator adds to the TTFT it measures, at 64 streams of 100K tokens.

A script, not a test: ``.venv/bin/python benchmarks/bench_loadgen.py [--json OUT]``. It starts the
engine stand-in on a free loopback port (a GPU pool large enough for everything, so the server's
modelled costs stay small) and drives it with ``nodetools.loadgen``: 64 sessions of ~100K-token
histories, all 64 in flight, 4 turns (a cold one, then revisits), 64 forced output tokens.

The generator can only distort a TTFT by being late: late to send (building and writing a 500 KB
body while other streams wait) or late to notice the first token (its event loop busy parsing
other streams' chunks). Three measurements, all on this 2-core machine where the stand-in, the
generator and the probes share the cores:

1. Probe A/B. While the load runs, two probes send tiny streaming requests (1 output token) to
   the same server at random moments: one inside the generator's own event loop, one from a
   separate process. Both see the same server; only the client differs. The difference of their
   TTFTs is what the generator's loop adds to a request's TTFT. The same probes on the idle
   server give the baseline difference (~0).
2. The generator's own figures: its event-loop lag (p50/p99/max, sampled every 5 ms through the
   load), its CPU seconds, and the time to build one 100K-token request body.
3. Context: client-side TTFT of the load's requests against the server's own TTFT histogram
   (``vllm:time_to_first_token_seconds`` sum/count deltas). The gap includes the server's request
   parsing and tokenization (the stand-in tokenizes 100K tokens in ~35 ms, one request at a
   time), so it is an upper bound, not the generator's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nodetools.loadgen.client import Conversation, stream_chat  # noqa: E402  (after the repo is on sys.path)
from nodetools.loadgen.multiturn import MultiTurnLoad, Workload  # noqa: E402
from nodetools.loadgen.text import TextSource  # noqa: E402

KNOBS = {"STANDIN_PROCESS_START_S": "0", "STANDIN_MODEL_INIT_S": "0", "STANDIN_DYNAMO_S": "0",
         "STANDIN_COMPILE_MISS_S": "0", "STANDIN_COMPILE_HIT_S": "0", "STANDIN_PROFILE_S": "0",
         "STANDIN_JIT_MISS_S": "0", "STANDIN_JIT_HIT_S": "0", "STANDIN_GRAPH_CAPTURE_S": "0",
         "STANDIN_KV_ALLOC_S": "0", "STANDIN_API_START_S": "0", "STANDIN_KV_CAPACITY_TOKENS": "8000000",
         "STANDIN_PREFILL_S_PER_TOKEN": "2e-7", "STANDIN_DECODE_S_PER_TOKEN": "0.02"}
PROBE_EVERY_S = 0.1
PROBERS = 4  # concurrent probe loops per side: enough samples for a median within a few ms


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _probe_body(i: int) -> bytes:
    conv = Conversation()
    conv.append("user", f"probe {i}: say one word")
    return conv.body("bench", 1, min_tokens=1, ignore_eos=True)


async def probe_loop(url: str, stop: asyncio.Event, samples: list[tuple[float, float]]) -> None:
    """Tiny streaming requests at random moments until ``stop``; (sent at, TTFT) per answer."""

    async def one(http: aiohttp.ClientSession, worker: int) -> None:
        i = 0
        while not stop.is_set():
            await asyncio.sleep(random.uniform(0.5, 1.5) * PROBE_EVERY_S)
            i += 1
            result = await stream_chat(http, url + "/v1/chat/completions", _probe_body(1000 * worker + i), 120)
            if result.ok and result.ttft_s is not None:
                samples.append((result.t_start, result.ttft_s))

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(one(http, w) for w in range(PROBERS)))


def _child_probe(url: str, seconds: float, out: Path) -> int:
    """The out-of-process probe: runs ``seconds`` and writes its samples as JSON."""
    async def run() -> list[tuple[float, float]]:
        stop = asyncio.Event()
        samples: list[tuple[float, float]] = []
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)  # the parent's "done": write what we have
        await probe_loop(url, stop, samples)
        return samples

    out.write_text(json.dumps(asyncio.run(run())))
    return 0


class Server:
    def __init__(self, workdir: Path, port: int) -> None:
        model = workdir / "model"
        subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(model), "--size-mib", "1"],
                       check=True, capture_output=True, cwd=REPO)
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **KNOBS, "VLLM_CACHE_ROOT": str(workdir / "cache"),
               "STANDIN_JIT_DIR": str(workdir / "jit"), "PYTHONPATH": str(REPO)}
        self.log = (workdir / "server.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nodetools.standin", "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
             "--served-model-name", "bench", "--max-model-len", "131072", "--max-num-seqs", "512",
             "--max-num-batched-tokens", "262144", "--enable-prompt-tokens-details"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    async def ready(self) -> None:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                try:
                    async with http.get(self.url + "/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError("stand-in did not start")

    async def ttft_histogram(self) -> tuple[float, float]:
        async with aiohttp.ClientSession() as http, http.get(self.url + "/metrics") as resp:
            text = await resp.text()
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:time_to_first_token_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:time_to_first_token_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
        return total, count

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def _child(url: str, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--probe-child", url, str(seconds), str(out)], cwd=REPO)


def median_diff_ci_ms(a: list[float], b: list[float], rounds: int = 2000) -> list[float]:
    """95% bootstrap interval of median(a) - median(b), in ms."""
    rng = random.Random(0)
    diffs = sorted(statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
                   for _ in range(rounds))
    return [round(diffs[int(0.025 * rounds)] * 1e3, 2), round(diffs[int(0.975 * rounds)] * 1e3, 2)]


def _stats_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ms = sorted(v * 1e3 for v in values)
    err = statistics.stdev(ms) / len(ms) ** 0.5 if len(ms) > 1 else 0.0
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 2), "mean_ms": round(statistics.fmean(ms), 2),
            "stderr_ms": round(err, 2), "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2)}


async def idle_baseline(server: Server, workdir: Path, seconds: float) -> dict[str, Any]:
    out = workdir / "idle_probe.json"
    child = _child(server.url, seconds, out)
    stop = asyncio.Event()
    samples: list[tuple[float, float]] = []
    asyncio.get_running_loop().call_later(seconds, stop.set)
    await probe_loop(server.url, stop, samples)
    await asyncio.to_thread(child.wait, 120)
    external = [t for _, t in json.loads(out.read_text())]
    inside = [t for _, t in samples]
    return {"in_loop": _stats_ms(inside), "external": _stats_ms(external),
            "median_diff_ci95_ms": median_diff_ci_ms(inside, external)}


async def under_load(server: Server, workdir: Path, workload: Workload) -> dict[str, Any]:
    load = MultiTurnLoad(workload, [server.url], "bench", workdir / "requests.jsonl",
                         progress=lambda line: print("  " + line, flush=True))
    stop = asyncio.Event()
    in_loop: list[tuple[float, float]] = []
    ext_out = workdir / "load_probe.json"
    child: subprocess.Popen[bytes] | None = None
    hist0: tuple[float, float] = (0.0, 0.0)

    async def probes_once_loaded() -> None:
        nonlocal child, hist0
        while not load.sessions or load._fh is None:  # sizing runs first: probe the load, not the setup
            await asyncio.sleep(0.05)
        hist0 = await server.ttft_histogram()
        child = _child(server.url, 3600, ext_out)
        await probe_loop(server.url, stop, in_loop)

    prober = asyncio.create_task(probes_once_loaded())
    summary = await load.run()
    stop.set()
    await prober
    hist1 = await server.ttft_histogram()
    assert child is not None
    child.send_signal(signal.SIGTERM)  # the child writes its samples on the way out
    await asyncio.to_thread(child.wait, 120)
    external = [tuple(s) for s in json.loads(ext_out.read_text())] if ext_out.is_file() else []
    t0, t1 = summary["t_load_start"], summary["t_load_start"] + summary["load_wall_s"]
    window = [t for at, t in in_loop if t0 <= at <= t1], [t for at, t in external if t0 <= at <= t1]
    recs = [json.loads(line) for line in (workdir / "requests.jsonl").read_text().splitlines()]
    ok = [r for r in recs if r["status"] == "ok"]
    server_mean = (hist1[0] - hist0[0]) / (hist1[1] - hist0[1]) if hist1[1] > hist0[1] else None
    return {
        "summary": {k: summary[k] for k in ("setup", "load_wall_s", "counts", "client_cpu_s", "loop_lag_ms")},
        "probes": {"in_loop": _stats_ms(window[0]), "external": _stats_ms(window[1]),
                   "median_diff_ci95_ms": median_diff_ci_ms(*window)},
        "load_ttft": _stats_ms([r["ttft_s"] for r in ok]),
        "server_ttft_mean_ms_incl_probes": None if server_mean is None else round(server_mean * 1e3, 2),
        "prompt_tokens_mean": round(statistics.fmean(r["prompt_tokens"] for r in ok), 1) if ok else None,
    }


def body_cost_ms(tokens_chars: int = 450_000, repeats: int = 50) -> float:
    """Time to build one ~100K-token request body from pre-encoded messages."""
    conv = Conversation()
    source = TextSource("body")
    for i in range(50):
        conv.append("user" if i % 2 == 0 else "assistant", source.text(tokens_chars // 50))
    start = time.perf_counter()
    for _ in range(repeats):
        conv.body("bench", 64, min_tokens=64, ignore_eos=True)
    return round((time.perf_counter() - start) / repeats * 1e3, 3)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    workload = Workload(sessions=args.sessions, history_tokens=args.history_tokens, concurrency=args.sessions,
                        turns=args.turns, turn_tokens=200, output_tokens=args.output_tokens,
                        request_timeout_s=600, max_wall_s=1800)
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        workdir = Path(tmp)
        server = Server(workdir, _free_port())
        try:
            await server.ready()
            print("idle baseline (probes only) ...", flush=True)
            idle = await idle_baseline(server, workdir, args.idle_s)
            print(f"load: {workload.sessions} sessions x {workload.history_tokens} tokens, all in flight ...",
                  flush=True)
            loaded = await under_load(server, workdir, workload)
        finally:
            server.stop()
    loaded_delta = (loaded["probes"]["in_loop"].get("median_ms", 0) - loaded["probes"]["external"].get("median_ms", 0))
    idle_delta = idle["in_loop"].get("median_ms", 0) - idle["external"].get("median_ms", 0)
    return {"workload": vars(args), "idle": idle, "load": loaded, "body_build_ms": body_cost_ms(),
            "added_ttft_median_ms": round(loaded_delta - idle_delta, 2), "cores": os.cpu_count()}


def main() -> int:
    if sys.argv[1:2] == ["--probe-child"]:
        return _child_probe(sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--history-tokens", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--idle-s", type=float, default=4.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
