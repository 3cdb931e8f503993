"""The LRU pathology of a working set 1.3x the GPU KV pool, and what offload tiers buy.

13 sessions of 100 blocks each visit a 1,000-block pool round-robin, each turn re-sending the
session's whole history plus one block: every session's blocks are evicted before its next turn,
so the GPU prefix cache hits almost nothing (the reference campaign's 0.0%), while a host-RAM tier
large enough for the working set serves nearly every prompt token as an external hit.
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx

from tests.standin.support import Standin, StandinFactory

BLOCK = 16
SESSIONS = 13
HISTORY_BLOCKS = 100
TURNS = 3
# 1,000 GPU blocks; the host tier counts 1 KiB per token so 0.05 GiB holds ~52k tokens (> 21k live).
GPU_FLAGS = ("--num-gpu-blocks-override", "1000", "--max-model-len", "4096")
ENV = {"STANDIN_OFFLOAD_BYTES_PER_TOKEN": "1024", "VLLM_LOG_STATS_INTERVAL": "1"}
TOP_ID = 8000  # token ids must be in the made model's vocabulary (8,192), as vLLM requires


def _run_round_robin(server: Standin) -> tuple[dict[str, float], dict[str, float]]:
    """Turn 1 warms up; returns /metrics before and after turns 2..TURNS."""
    rng = random.Random(7)
    histories = [[rng.randrange(1000, TOP_ID) for _ in range(HISTORY_BLOCKS * BLOCK)]
                 for _ in range(SESSIONS)]
    before: dict[str, float] = {}
    with httpx.Client(timeout=30) as client:
        for turn in range(TURNS):
            if turn == 1:
                before = server.metrics()
            for history in histories:
                history.extend(rng.randrange(1000, TOP_ID) for _ in range(BLOCK))  # "plus a little"
                resp = client.post(server.url("/v1/completions"), json={"prompt": history, "max_tokens": 1})
                resp.raise_for_status()
    return before, server.metrics()


def _rate(before: dict[str, float], after: dict[str, float], hits: str, queries: str) -> float:
    return (after[hits] - before[hits]) / (after[queries] - before[queries])


def test_working_set_over_capacity_gets_no_gpu_hits(standin: StandinFactory) -> None:
    server = standin(*GPU_FLAGS, env=ENV)
    before, after = _run_round_robin(server)
    gpu = _rate(before, after, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    assert gpu < 0.02
    assert after["vllm:external_prefix_cache_hits_total"] == 0
    server.wait_log(r"Prefix cache hit rate: 0\.0%")
    assert server.stop() == 0


def test_host_ram_tier_turns_the_misses_into_external_hits(standin: StandinFactory) -> None:
    server = standin(*GPU_FLAGS, "--kv-offloading-backend", "native", "--kv-offloading-size", "0.05", env=ENV)
    before, after = _run_round_robin(server)
    gpu = _rate(before, after, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
    external = _rate(before, after, "vllm:external_prefix_cache_hits_total",
                     "vllm:external_prefix_cache_queries_total")
    assert gpu < 0.02
    assert external > 0.8
    line = server.wait_log(r"Prefix cache hit rate: [\d.]+%, External prefix cache hit rate: ([\d.]+)%")
    assert float(line.group(1)) > 50  # rolling over all requests, turn 1's misses included
    assert "Creating v1 connector with name: OffloadingConnector" in server.log()
    assert server.stop() == 0


def test_file_system_tier_catches_what_a_small_ram_tier_evicts(standin: StandinFactory,
                                                                tmp_path: Path) -> None:
    fs_root = tmp_path / "kv-fs"
    # 0.005 GiB at 1 KiB/token is ~5k tokens: most of the 21k live tokens spill to the fs tier.
    server = standin(*GPU_FLAGS, "--kv-offloading-size", "0.005", "--standin-kv-fs-dir", str(fs_root),
                     env=ENV)
    before, after = _run_round_robin(server)
    external = _rate(before, after, "vllm:external_prefix_cache_hits_total",
                     "vllm:external_prefix_cache_queries_total")
    assert external > 0.8
    assert server.sample("standin:external_hits_by_tier_total", tier="fs") > 0
    block_files = list(fs_root.glob("*_r0/*/*_g0/*.bin"))
    assert len(block_files) > 500  # real files, one per block
    assert "TieringOffloadingSpec" in server.log()
    assert server.stop() == 0
