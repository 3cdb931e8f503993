"""Every rung of the KV ladder on the stand-in: LMCache's disk below its RAM, its startup line on
the torch-ops fallback, its retrieval lines, and vLLM's transfer counters per tier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodetools.offload.lmcache_gate import CUDA_EXTENSION, TORCH_OPS, lmcache_path
from runner.experiments.offload.collect import kv_transfers
from tests.standin.support import StandinFactory
from tests.standin.test_offload import ENV, GPU_FLAGS, _run_round_robin

LMCACHE = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})


def test_lmcaches_disk_is_a_file_system_tier_below_its_ram(standin: StandinFactory, tmp_path: Path) -> None:
    disk = tmp_path / "lmcache-disk"
    # 0.005 GB of RAM at 1 KiB a token holds ~5k of the 21k live tokens: the rest come off the disk.
    server = standin(*GPU_FLAGS, "--kv-transfer-config", LMCACHE, env={
        **ENV, "LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": "0.005",
        "LMCACHE_LOCAL_DISK": f"file://{disk}/", "LMCACHE_MAX_LOCAL_DISK_SIZE": "1"})
    before, after = _run_round_robin(server)
    assert after["vllm:external_prefix_cache_hits_total"] - before["vllm:external_prefix_cache_hits_total"] > 10_000
    assert server.sample("standin:external_hits_by_tier_total", tier="fs") > 0
    assert len(list(disk.glob("*_r0/*/*_g0/*.bin"))) > 100  # real files, one per block
    log = server.log()
    assert "LMCACHE_LOCAL_DISK is modelled as a file-system tier below it" in log
    assert lmcache_path(log) == CUDA_EXTENSION  # started, and no fallback line
    # One LMCache line per retrieval: collect reads them as LMCache's transfers (its "GB" is GiB).
    moved = kv_transfers([], [log])
    assert moved["kv_transfer_source"] == "lmcache log" and moved["kv_cpu_to_gpu_gb"] > 0.01
    assert "vllm:kv_offload_total_bytes_total" not in after  # LMCache has no connector counters
    assert server.stop() == 0


def test_lmcache_on_its_torch_ops_fallback_says_so_at_start(standin: StandinFactory) -> None:
    server = standin(*GPU_FLAGS, "--kv-transfer-config", LMCACHE,
                     env={**ENV, "LMCACHE_MAX_LOCAL_CPU_SIZE": "0.05", "STANDIN_LMCACHE_OPS": "torch"})
    assert lmcache_path(server.log()) == TORCH_OPS  # before any request: a startup line
    assert "lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays on the torch baseline" in server.log()
    assert server.stop() == 0


def test_the_offloading_connector_counts_bytes_and_seconds_per_tier(standin: StandinFactory, tmp_path: Path) -> None:
    server = standin(*GPU_FLAGS, "--kv-offloading-size", "0.005", "--standin-kv-fs-dir", str(tmp_path / "fs"),
                     env={**ENV, "STANDIN_CPU_LOAD_S_PER_TOKEN": "2e-6", "STANDIN_FS_LOAD_S_PER_TOKEN": "1e-5"})
    _, after = _run_round_robin(server)

    def moved(kind: str) -> float:  # a transfer type appears once it moved something
        return sum(v for k, v in after.items() if k.startswith("vllm:kv_offload_total_bytes_total{")
                   and f'transfer_type="{kind}"' in k)

    assert moved("CPU_to_GPU") == 1024 * server.sample("standin:external_hits_by_tier_total", tier="cpu")
    fs = moved("FS_to_GPU")
    assert fs == 1024 * server.sample("standin:external_hits_by_tier_total", tier="fs") > 0
    # The modelled cost: 1 KiB in 2 us from RAM (0.51 GB/s), in 10 us from files (0.10 GB/s).
    seconds = server.sample("vllm:kv_offload_total_time_total", transfer_type="FS_to_GPU")
    assert fs / 1e9 / seconds == pytest.approx(1024 / 1e-5 / 1e9, rel=1e-6)
    assert server.stop() == 0
