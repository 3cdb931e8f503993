"""Startup phases: real weight reads, a real compile cache, readiness, and vLLM's log shapes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.standin.support import REPO, VLLM_LINE, StandinFactory

COMPILE_MISS = "Compiling a graph for compile range (1, 8192) takes"
COMPILE_HIT = "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took"


def _parse(log: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "runner", "parse-log", str(log), "--json"],
                         capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(out.stdout)


def test_compile_cache_misses_then_hits_and_a_fresh_dir_misses_again(standin: StandinFactory,
                                                                     tmp_path: Path) -> None:
    cache = {"VLLM_CACHE_ROOT": str(tmp_path / "cache-a")}
    first = standin(env=cache)
    assert first.stop() == 0
    assert COMPILE_MISS in first.log() and COMPILE_HIT not in first.log()
    cache_dir = re.search(r"Using cache directory: (\S+) for vLLM's torch.compile", first.log())
    assert cache_dir and Path(cache_dir.group(1)).is_relative_to(tmp_path / "cache-a/torch_compile_cache")
    assert (Path(cache_dir.group(1)) / "standin_graph.bin").stat().st_size > 0

    again = standin(env=cache)
    assert again.stop() == 0
    assert COMPILE_HIT in again.log() and COMPILE_MISS not in again.log()
    assert f"Using cache directory: {cache_dir.group(1)} " in again.log()
    assert _parse(first.log_path)["compile_cache_hit"] is False
    assert _parse(again.log_path)["compile_cache_hit"] is True

    fresh = standin(env={"VLLM_CACHE_ROOT": str(tmp_path / "cache-b")})
    assert fresh.stop() == 0
    assert COMPILE_MISS in fresh.log() and COMPILE_HIT not in fresh.log()

    # A flag that changes the compile hash misses even with a warm cache (as --enable-sleep-mode did on
    # the reference H200).
    other = standin("--enable-sleep-mode", env=cache)
    assert other.stop() == 0
    assert COMPILE_MISS in other.log()


def test_weights_are_really_read_and_port_answers_only_after_startup(standin: StandinFactory,
                                                                      model_dir: Path) -> None:
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    # 2 MiB at 4 MiB/s takes half a second of reading: /health is probed all along.
    server = standin("--standin-weights-read-mib-s", "4", wait=False)
    refused, first_ok = 0, None
    deadline = time.monotonic() + 20
    while first_ok is None and time.monotonic() < deadline:
        try:
            status = httpx.get(server.url("/health"), timeout=1).status_code
        except httpx.TransportError:
            status = None
        if status == 200:
            first_ok = server.log()
        else:
            refused += 1
            time.sleep(0.01)
    assert first_ok is not None, server.log()
    assert refused >= 10
    assert "Application startup complete." in first_ok
    log = server.log()
    read = re.search(r"\[stand-in\] weights read: (\d+) bytes from (\d+) files", log)
    assert read and int(read.group(1)) == size and read.group(2) == "2"
    took = re.search(r"Loading weights took ([\d.]+) seconds", log)
    assert took and float(took.group(1)) >= 0.45
    assert server.stop() == 0


def test_log_lines_have_vllm_shapes_and_the_runner_parses_them(standin: StandinFactory) -> None:
    server = standin("--max-model-len", "4096", "--num-gpu-blocks-override", "4000",
                     "--kv-offloading-size", "0.01", "--enable-sleep-mode")
    httpx.post(server.url("/v1/completions"), json={"prompt": "hi", "max_tokens": 2}, timeout=5)
    httpx.post(server.url("/sleep?level=1"), timeout=5)
    httpx.post(server.url("/wake_up"), timeout=5)
    assert server.stop() == 0
    lines = server.log().splitlines()
    assert lines[0].startswith("(APIServer pid=") and "non-default args: {'model_tag': " in lines[0]
    bad = [line for line in lines if not VLLM_LINE.match(line)]
    assert not bad, bad
    order = ["non-default args", "Loading weights took", "Model loading took", "torch.compile took",
             "Available KV cache memory", "GPU KV cache size: 64,000 tokens",
             "Maximum concurrency for 4,096 tokens per request: 15.62x", "Graph capturing finished in",
             "init engine (profile, create kv cache, warmup model) took",
             "Starting vLLM server on http://",
             "Available routes are:", "Application startup complete.", "Sleep mode freed",
             "seconds to fall asleep",
             "seconds to wake up", "Shutting down"]
    text = server.log()
    positions = [text.find(marker) for marker in order]
    assert all(p >= 0 for p in positions), dict(zip(order, positions, strict=True))
    assert positions == sorted(positions)

    # The runner's parser (DESIGN §3, "Parsed server log") reads the stand-in's log like vLLM's.
    parsed = _parse(server.log_path)
    assert parsed["compile_cache_hit"] is False
    assert parsed["kv_cache_tokens"] == 64000
    for key in ("weights_load_s", "model_load_s", "compile_s", "graph_capture_s", "init_engine_s",
                "sleep_s", "wake_s", "sleep_freed_gib"):
        assert key in parsed, (key, parsed)


def test_sigterm_during_startup_exits_cleanly(standin: StandinFactory) -> None:
    server = standin("--standin-compile-miss-s", "30", wait=False)
    server.wait_log(r"Dynamo bytecode transform time")
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 5
    assert "Shutting down" in server.log()
    assert "Application startup complete." not in server.log()


def test_kv_pool_smaller_than_max_model_len_fails_like_vllm(standin: StandinFactory) -> None:
    server = standin("--num-gpu-blocks-override", "100", "--max-model-len", "4096", wait=False)
    assert server.proc.wait(20) == 1
    assert "larger than the available KV cache memory" in server.log()
    assert "Engine core initialization failed" in server.log()
