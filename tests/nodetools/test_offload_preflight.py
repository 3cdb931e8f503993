"""The offload preflight refuses, with its numbers, what would hurt the node; cleanup removes leftovers."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nodetools.offload.preflight import _module_check
from nodetools.offload.run import quality_spec, ready_timeout
from nodetools.offload_run import (
    Need,
    clear_leftovers,
    leftover_containers,
    preflight,
    remove_trial_files,
    split_gpus,
)

GIB = 2**30


def facts(node1_free_gib: float = 300, shm_free_gib: float = 1000, stale: list[dict[str, Any]] | None = None,
          data_avail_gib: float = 5000) -> dict[str, Any]:
    """A two-socket node like the reference H200: GPUs 0-3 on NUMA node 0, 4-7 on node 1."""
    stale = stale or []
    return {
        "gpus": [{"index": i, "numa_node": 0 if i < 4 else 1} for i in range(8)],
        "numa": [
            {"node": 0, "mem_free_bytes": 900 * GIB, "file_pages_bytes": 100 * GIB, "shmem_bytes": 0},
            {"node": 1, "mem_free_bytes": int(node1_free_gib * GIB), "file_pages_bytes": 50 * GIB,
             "shmem_bytes": 50 * GIB},
        ],
        "memory": {"available_bytes": 1200 * GIB},
        "shm": {"path": "/dev/shm", "size_bytes": 1000 * GIB, "free_bytes": int(shm_free_gib * GIB),
                "vllm_offload_files": stale, "vllm_offload_bytes": sum(f["size_bytes"] for f in stale), "error": None},
        "mounts": [{"mountpoint": "/", "available_bytes": 50 * GIB},
                   {"mountpoint": "/mnt/data", "available_bytes": int(data_avail_gib * GIB)}],
    }


NATIVE = Need(offload_gib=200, copies=1, gpus=(4,), safety_factor=2.0, uses_shm=True)


def test_a_fitting_offload_passes_with_its_numbers() -> None:
    result = preflight(facts(node1_free_gib=500), NATIVE)
    assert result["reasons"] == []
    (ram,) = result["checks"]["ram"]
    assert ram == {"where": "NUMA node 1", "gpus": [4], "copies": 1, "need_gib": 400.0, "available_gib": 500.0,
                   "how": "free 500.0 GiB + reclaimable page cache 0.0 GiB"}
    assert result["checks"]["shm"]["need_gib"] == 200.0


def test_too_little_ram_on_the_gpus_numa_node_is_refused() -> None:
    (reason,) = preflight(facts(node1_free_gib=300), NATIVE)["reasons"]
    assert reason == ("host RAM: 1 engine copy x 200 GiB offload x safety 2 = 400.0 GiB needed on NUMA node 1 "
                      "(GPUs 4), but only 300.0 GiB is available there (free 300.0 GiB + reclaimable page cache "
                      "0.0 GiB)")


def test_engine_copies_multiply_the_need() -> None:
    # A gpt-oss-120b deployment: four single-GPU copies x 400 GB on one socket pair.
    need = Need(offload_gib=400, copies=4, gpus=(0, 1, 2, 3), safety_factor=1.0, uses_shm=True)
    reasons = preflight(facts(), need)["reasons"]
    assert reasons[0] == ("host RAM: 4 engine copies x 400 GiB offload x safety 1 = 1600.0 GiB needed on NUMA node 0 "
                          "(GPUs 0,1,2,3), but only 1000.0 GiB is available there (free 900.0 GiB + reclaimable page "
                          "cache 100.0 GiB)")
    assert reasons[1] == ("/dev/shm: 4 engine copies x 400 GiB = 1600.0 GiB needed for the native offload buffers, "
                          "but it has 1000.0 GiB free (size 1000.0 GiB)")
    # The prepared retry, 96 GiB per copy with the safety factor, fits.
    assert preflight(facts(), Need(offload_gib=96, copies=4, gpus=(0, 1, 2, 3), uses_shm=True))["reasons"] == []


def test_copies_on_both_sockets_are_checked_per_numa_node() -> None:
    need = Need(offload_gib=100, copies=2, gpus=(3, 4), safety_factor=2.0)
    checks = preflight(facts(node1_free_gib=150), need)
    assert [c["where"] for c in checks["checks"]["ram"]] == ["NUMA node 0", "NUMA node 1"]
    assert checks["reasons"] == ["host RAM: 1 engine copy x 100 GiB offload x safety 2 = 200.0 GiB needed on NUMA "
                                 "node 1 (GPUs 4), but only 150.0 GiB is available there (free 150.0 GiB + "
                                 "reclaimable page cache 0.0 GiB)"]


def test_without_gpu_numa_information_the_whole_host_counts() -> None:
    f = facts()
    f["gpus"], f["numa"] = [], []
    result = preflight(f, Need(offload_gib=700, copies=1, safety_factor=2.0))
    assert result["reasons"] == ["host RAM: 1 engine copy x 700 GiB offload x safety 2 = 1400.0 GiB needed on this "
                                 "host, but only 1200.0 GiB is available there (MemAvailable)"]


def test_a_stale_offload_file_is_refused_by_name_and_size() -> None:
    stale = [{"name": "vllm_offload_0_1234.mmap", "size_bytes": 400 * GIB}]
    (reason,) = preflight(facts(node1_free_gib=900, stale=stale), NATIVE)["reasons"]
    assert reason == ("stale offload files in /dev/shm hold 400.0 GiB: vllm_offload_0_1234.mmap (400.0 GiB); "
                      "remove them or set cleanup: true")


def test_a_file_system_tier_without_space_is_refused() -> None:
    need = Need(offload_gib=64, gpus=(4,), fs_dir="/mnt/data/kv_cache/campaign.trial", fs_gib=1000)
    (reason,) = preflight(facts(node1_free_gib=900, data_avail_gib=20), need)["reasons"]
    assert reason == ("file-system tier: /mnt/data/kv_cache/campaign.trial needs 1,000 GiB free, but its filesystem "
                      "(/mnt/data) has 20.0 GiB available")


def test_a_context_longer_than_max_model_len_is_refused() -> None:
    need = Need(max_model_len=Need.from_json({"max_model_len": "32k"}).max_model_len, context_tokens=116_800)
    (reason,) = preflight(facts(), need)["reasons"]
    assert reason == ("context: the load needs about 118,000 tokens per request (longest prompt, its output and "
                      "the chat template), more than max-model-len 32,000")
    assert Need.from_json({"max_model_len": "128K"}).max_model_len == 131072


def test_leftover_containers_are_found_and_removed_with_cleanup(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls = tmp_path / "docker-calls"
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$1" = ps ]; then
  printf 'gpu-campaign-offload.x\\tvllm/vllm-openai:v0.31.0\\n'
  printf 'lmcache-old\\tlmcache/vllm-openai:v0.5.6rc3\\nweb\\tnginx:1\\n'
fi
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    containers, error = leftover_containers()
    assert error is None
    assert containers == [{"name": "gpu-campaign-offload.x", "image": "vllm/vllm-openai:v0.31.0"},
                          {"name": "lmcache-old", "image": "lmcache/vllm-openai:v0.5.6rc3"}]
    (reason,) = preflight(facts(), Need(), containers)["reasons"]
    assert reason == ("leftover engine containers hold memory: gpu-campaign-offload.x (vllm/vllm-openai:v0.31.0), "
                      "lmcache-old (lmcache/vllm-openai:v0.5.6rc3); remove them or set cleanup: true")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "vllm_offload_0_99.mmap").write_bytes(b"x" * 1024)
    (shm / "other").write_bytes(b"keep")
    removed = clear_leftovers(shm)
    assert removed == [f"{shm}/vllm_offload_0_99.mmap (0.0 GiB)", "container gpu-campaign-offload.x "
                       "(vllm/vllm-openai:v0.31.0)", "container lmcache-old (lmcache/vllm-openai:v0.5.6rc3)"]
    assert sorted(p.name for p in shm.iterdir()) == ["other"]
    assert "rm --force gpu-campaign-offload.x" in calls.read_text() and "rm --force web" not in calls.read_text()


def test_after_a_trial_only_its_own_offload_files_and_fs_tier_are_removed(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    old, new = shm / "vllm_offload_old.mmap", shm / "vllm_offload_new.mmap"
    old.write_bytes(b"o")
    new.write_bytes(b"n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fs = tmp_path / "kv-fs"
    (fs / "model_abc_r0").mkdir(parents=True)
    removed = remove_trial_files(shm, since=time.time() - 60, fs_dir=str(fs))
    assert removed == [f"{new} (0.0 GiB)", f"file-system tier {fs}"]
    assert old.exists() and not new.exists() and not fs.exists()


def test_gpus_are_shared_evenly_between_copies() -> None:
    assert split_gpus((0, 1, 2, 3), 4) == [[0], [1], [2], [3]]
    assert split_gpus((4, 5, 6, 7), 2) == [[4, 5], [6, 7]]
    assert split_gpus((), 3) == [[], [], []]
    with pytest.raises(ValueError, match="3 GPUs cannot be split evenly between 2 engine copies"):
        split_gpus((0, 1, 2), 2)


def test_a_modes_package_is_looked_for_with_the_engines_pythonpath(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "lmcache_standin").mkdir(parents=True)
    (site / "lmcache_standin" / "__init__.py").write_text("")
    need = Need(python=sys.executable, python_module="lmcache_standin")
    (missing,) = _module_check(need)
    assert missing == (f"python module lmcache_standin is not installed beside the engine ({sys.executable}): "
                       "the mode needs it")
    assert _module_check(Need(python=sys.executable, python_module="lmcache_standin", pythonpath=str(site))) == []
    assert _module_check(Need(python=str(tmp_path / "nopython"), python_module="x")) == [
        f"python {str(tmp_path / 'nopython')!r} for the engine does not exist"]
    assert _module_check(Need(python_module="x", image="lmcache/vllm-openai:v1")) == []  # checked in the image


def test_the_wait_for_an_engine_stays_inside_the_phase_and_quality_can_be_off() -> None:
    assert ready_timeout(1800, 540) == 510 and ready_timeout(60, 540) == 60
    assert ready_timeout(1800, 20) == 10 and ready_timeout(1800, 0) == 1800
    assert quality_spec('{"enabled": false, "conversations": 2}') is None and quality_spec("") is None
    spec = quality_spec('{"enabled": true, "conversations": 2, "turns": 2}')
    assert spec is not None and (spec.conversations, spec.turns, spec.doc_tokens) == (2, 2, 6000)
    with pytest.raises(ValueError, match="must be a JSON object"):
        quality_spec("[1]")
