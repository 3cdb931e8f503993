"""How much load the engine stand-in sustains before its own overhead distorts TTFT by > 5 ms.

A script, not a test: ``.venv/bin/python benchmarks/bench_standin.py [--json OUT]``. It starts the
stand-in on a free loopback port twice and drives it with aiohttp from this process (on a 2-core
machine the client takes one core, so the figures are a floor for a node with more cores):

1. Concurrent streams. N streams decode continuously (``--standin-decode-s-per-token D``, 200
   tokens each, restarted when done) while a probe sends short streaming requests at random
   moments. The model says a probe's first token arrives after the rest of the current step plus
   one step: D/2 + D on average. Distortion = mean probe TTFT - 1.5 D. The server's own
   ``standin:engine_step_lag_seconds`` (how late each step ends) is reported beside it.
2. Request rate. Short requests (4 tokens) arrive open-loop (Poisson) at R req/s with zero
   modelled costs, so every millisecond of TTFT is overhead (HTTP, tokenizer, scheduler, client).
   Distortion = mean TTFT at R - mean TTFT at a low rate.

Both report the largest load level whose distortion stays within 5 ms. The stand-in tokenizes with the
made model's ``tokenizer.json`` (``tokenizers``); ``--prompt-words N`` puts N words of English text in
front of every prompt (N=100 is about a GuideLLM 128-token prompt), so the tokenizer's cost shows.
The summary names the tokenizer the server used (``/v1/models``).
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

from nodetools.standin.cli import make_model  # noqa: E402  (after the repo is on sys.path)

LIMIT_S = 0.005
_FILLER = ("the page cache holds the weights while the compile cache holds the graphs and every request sends "
           "its whole history again so a rehearsal must count tokens as the model does")
PROBERS = 5  # parallel probe loops: enough samples for a mean within ~0.5 ms
STARTUP_KNOBS = {"STANDIN_PROCESS_START_S": "0", "STANDIN_MODEL_INIT_S": "0", "STANDIN_DYNAMO_S": "0",
                 "STANDIN_COMPILE_MISS_S": "0", "STANDIN_COMPILE_HIT_S": "0", "STANDIN_PROFILE_S": "0",
                 "STANDIN_JIT_MISS_S": "0", "STANDIN_JIT_HIT_S": "0", "STANDIN_GRAPH_CAPTURE_S": "0",
                 "STANDIN_KV_ALLOC_S": "0", "STANDIN_API_START_S": "0", "STANDIN_PREFILL_S_PER_TOKEN": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, workdir: Path, model: Path, decode_s: float, extra: list[str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **STARTUP_KNOBS, "STANDIN_DECODE_S_PER_TOKEN": str(decode_s),
               "VLLM_CACHE_ROOT": str(workdir / "cache"), "STANDIN_JIT_DIR": str(workdir / "jit"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.log = (workdir / f"server-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nodetools.standin", "serve", str(model), "--host", "127.0.0.1", "--port",
             str(self.port), "--max-num-seqs", "4096", "--served-model-name", "bench", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    async def ready(self, session: aiohttp.ClientSession) -> None:
        for _ in range(600):
            try:
                async with session.get(self.url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError("stand-in did not start")

    async def tokenizer(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.url + "/v1/models") as resp:
            card = (await resp.json())["data"][0]
        info = card.get("standin_tokenizer") or {"kind": "regex (a stand-in that does not report it)"}
        return str(info["kind"]) + (f" vocab {info['vocab_size']}" if "vocab_size" in info else "")

    async def step_lag(self, session: aiohttp.ClientSession) -> tuple[float, float]:
        async with session.get(self.url + "/metrics") as resp:
            text = await resp.text()
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith("standin:engine_step_lag_seconds_sum"):
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("standin:engine_step_lag_seconds_count"):
                count = float(line.rsplit(" ", 1)[1])
        return total, count

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()


def _filler(words: int) -> str:
    vocabulary = _FILLER.split()
    return "".join(vocabulary[i % len(vocabulary)] + " " for i in range(words))


async def _stream(session: aiohttp.ClientSession, url: str, max_tokens: int, prompt: str) -> float:
    """Send one streaming completion; returns the TTFT (first content chunk), drains the rest."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    ttft = -1.0
    async with session.post(url + "/v1/completions", json=body) as resp:
        # iter_any, not readline: the client shares the 2 cores, so it must cost little per chunk.
        async for data in resp.content.iter_any():
            if ttft < 0 and b"data: {" in data:
                ttft = time.perf_counter() - start
    return ttft


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def bench_streams(server: Server, decode_s: float, levels: list[int], probes: int, prefix: str = ""
                        ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with _session() as session:
        await server.ready(session)
        for n in levels:
            stop = asyncio.Event()

            async def background(i: int, stop: asyncio.Event = stop) -> None:
                await asyncio.sleep(random.random() * decode_s * 20)  # spread the starts
                while not stop.is_set():
                    await _stream(session, server.url, 200, prefix + f"background stream {i}")

            tasks = [asyncio.create_task(background(i)) for i in range(n)]
            await asyncio.sleep(max(1.0, decode_s * 40))
            lag0 = await server.step_lag(session)
            ttfts: list[float] = []

            async def prober(w: int, n: int = n, ttfts: list[float] = ttfts) -> None:
                # A random pause makes the arrival phase within a step uniform: the model's mean is 1.5 D.
                for k in range(probes // PROBERS):
                    await asyncio.sleep(random.random() * decode_s * 3)
                    ttfts.append(await _stream(session, server.url, 2, prefix + f"probe {n} {w} {k}"))

            await asyncio.gather(*(prober(w) for w in range(PROBERS)))
            lag1 = await server.step_lag(session)
            stop.set()
            await asyncio.gather(*tasks)
            expected = 1.5 * decode_s
            mean = statistics.fmean(ttfts)
            steps = lag1[1] - lag0[1]
            error = statistics.stdev(ttfts) / len(ttfts) ** 0.5
            rows.append({"streams": n, "mean_ttft_ms": mean * 1e3, "p90_ttft_ms": _pct(ttfts, 0.9) * 1e3,
                         "modelled_ttft_ms": expected * 1e3, "distortion_ms": (mean - expected) * 1e3,
                         "stderr_ms": error * 1e3,
                         "mean_step_lag_ms": (lag1[0] - lag0[0]) / steps * 1e3 if steps else 0.0})
            _print_row(rows[-1])
    return rows


async def bench_rate(server: Server, rates: list[float], seconds: float, prefix: str = "") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with _session() as session:
        await server.ready(session)
        baseline = None
        for rate in rates:
            start = time.perf_counter()
            next_at = start
            tasks = []
            while next_at - start < seconds:
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                prompt = prefix + f"request {len(tasks)} at {rate}"
                tasks.append(asyncio.create_task(_stream(session, server.url, 4, prompt)))
                next_at += random.expovariate(rate)
            ttfts = list(await asyncio.gather(*tasks))
            elapsed = time.perf_counter() - start
            mean = statistics.fmean(ttfts)
            baseline = mean if baseline is None else baseline
            rows.append({"offered_rps": rate, "achieved_rps": len(ttfts) / elapsed,
                         "mean_ttft_ms": mean * 1e3,
                         "p90_ttft_ms": _pct(ttfts, 0.9) * 1e3, "distortion_ms": (mean - baseline) * 1e3})
            _print_row(rows[-1])
    return rows


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _print_row(row: dict[str, Any]) -> None:
    print("  " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
          flush=True)


def _within(rows: list[dict[str, Any]], key: str) -> Any:
    ok = [r[key] for r in rows if r["distortion_ms"] <= LIMIT_S * 1e3]
    return max(ok) if ok else None


async def _tokenizer_of(server: Server) -> str:
    async with _session() as session:
        return await server.tokenizer(session)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decode-s", type=float, default=0.02, help="modelled seconds per decode step")
    parser.add_argument("--streams", default="16,64,128,256,384,512", help="levels; empty to skip")
    parser.add_argument("--rates", default="10,200,500,1000,1500,2000,3000", help="levels; empty to skip")
    parser.add_argument("--probes", type=int, default=200, help="probe requests per level")
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each request-rate level")
    parser.add_argument("--no-access-log", action="store_true",
                        help="start it with --disable-uvicorn-access-log (campaigns keep the access lines)")
    parser.add_argument("--prompt-words", type=int, default=0,
                        help="words of English text in front of every prompt (default 0: prompts of ~5 tokens)")
    parser.add_argument("--model", type=Path, help="serve this model folder (default: make one with make-model)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    prefix = _filler(args.prompt_words)
    random.seed(1)
    extra = ["--disable-uvicorn-access-log"] if args.no_access_log else []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = args.model or work / "model"
        if args.model is None:
            make_model(model, size_mib=4, shards=1, max_position_embeddings=4096)
        streams: list[dict[str, Any]] = []
        rates: list[dict[str, Any]] = []
        tokenizer = "-"
        if args.streams:
            print(f"Concurrent streams (decode {args.decode_s * 1e3:.0f} ms/token, 200-token streams):")
            server = Server(work, model, args.decode_s, extra)
            try:
                streams = asyncio.run(bench_streams(server, args.decode_s,
                                                    [int(x) for x in args.streams.split(",")], args.probes, prefix))
            finally:
                server.stop()
        if args.rates:
            print("Request rate (4-token streaming requests, zero modelled cost):")
            server = Server(work, model, 0.0, extra)
            try:
                levels = [float(x) for x in args.rates.split(",")]
                rates = asyncio.run(bench_rate(server, levels, args.seconds, prefix))
                tokenizer = asyncio.run(_tokenizer_of(server))
            finally:
                server.stop()
    summary = {"engine": "stand-in", "tokenizer": tokenizer, "prompt_words": args.prompt_words,
               "cpu_count": os.cpu_count(), "limit_ms": LIMIT_S * 1e3,
               "access_log": not args.no_access_log, "max_streams_within_limit": _within(streams, "streams"),
               "max_rps_within_limit": _within(rates, "offered_rps"), "streams": streams, "rates": rates}
    print(f"Within {LIMIT_S * 1e3:.0f} ms of TTFT distortion: "
          f"{summary['max_streams_within_limit']} concurrent streams, "
          f"{summary['max_rps_within_limit']} requests/s (cpu_count={os.cpu_count()}, tokenizer {tokenizer}, "
          f"prompt words {args.prompt_words}).")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
