"""The refusals that need no node (each kind's ``plan_checks``): each with its number and its limit,
and a pass beside each refusal. ``--plan`` exits 3 with them (tests/unit/runner/test_plan_cli.py)."""

from __future__ import annotations

from typing import Any

import pytest

from runner.experiments.base import TrialContext
from runner.experiments.offload import KIND as OFFLOAD
from runner.experiments.offload import MODES
from runner.experiments.snapshot import KIND as SNAPSHOT

GIB = 2**30
STANDIN = {"kind": "stand-in", "runtime": "process", "model": "/m", "port": 18010, "args": {"max-model-len": 16384},
           "env": {"STANDIN_KV_CAPACITY_TOKENS": "60000", "STANDIN_OFFLOAD_BYTES_PER_TOKEN": "4096"}}
# offload-local.yaml's load: 8 sessions of 8,000 + 4 x 448 tokens = 78,336 tokens, 9,921 a request at most.
LOAD = {"sessions": 8, "history_tokens": 8000, "concurrency": 4, "turns": 4, "turn_tokens": 400,
        "output_tokens": 48}
QUALITY = {"conversations": 4, "turns": 3, "doc_tokens": 1500, "max_tokens": 64}


def offload(mode: str, engine: dict[str, Any] | None = None, facts: dict[str, Any] | None = None,
            **params: Any) -> list[str]:
    dumped = MODES[mode].model_validate({"workload": LOAD, "quality": QUALITY, **params}).model_dump(mode="json")
    ctx = TrialContext(mode, dumped, engine or STANDIN, host="h", trial_id=f"offload.{mode}.r1@h",
                       remote_dir="/work/t", campaign="c", facts=facts)
    return OFFLOAD.plan_checks(ctx)


def with_args(**args: Any) -> dict[str, Any]:
    return {**STANDIN, "args": {**STANDIN["args"], **args}}


def test_a_context_longer_than_max_model_len_is_refused_with_both_numbers() -> None:
    assert offload("hbm_only", with_args(**{"max-model-len": 1024})) == [
        "context: the load needs about 9,921 tokens per request (longest prompt, its output and the chat "
        "template), more than max-model-len 1,024"]
    assert offload("hbm_only") == []  # 16,384
    assert offload("hbm_only", with_args(**{"max-model-len": "10k"})) == []  # 10,000, as vLLM reads it
    assert offload("hbm_only", with_args(**{"max-model-len": "9k"}))[0].endswith("more than max-model-len 9,000")


def test_a_max_model_len_vllm_cannot_read_is_named() -> None:
    assert offload("hbm_only", with_args(**{"max-model-len": "lots"})) == [
        "engine.args.max-model-len: 'lots' is no length vLLM reads (an integer, or 32k / 32K)"]


def test_a_working_set_that_fits_the_gpu_pool_refuses_an_offload_mode() -> None:
    big_pool = {**STANDIN, "env": {**STANDIN["env"], "STANDIN_KV_CAPACITY_TOKENS": "80000"}}
    assert offload("native_cpu", big_pool, offload_gib=0.5) == [
        "sizing: the working set (78,336 tokens) fits the GPU KV pool (80,000 tokens: STANDIN_KV_CAPACITY_TOKENS), "
        "so no offload tier is ever read; give more sessions or history_tokens, or a smaller pool"]
    assert offload("hbm_only", big_pool) == []  # no tier to reach: the baseline stands
    assert offload("native_cpu", offload_gib=0.5) == []  # 1.31x the 60,000-token pool
    unknown_pool = {**STANDIN, "env": {}}
    assert offload("native_cpu", unknown_pool, offload_gib=0.5) == []  # the engine sizes it: known on the node


def test_a_file_system_tier_under_a_ram_tier_that_holds_the_working_set_is_refused() -> None:
    vllm = {"kind": "vllm", "runtime": "process", "model": "/m", "port": 9000, "gpus": [0], "version": "0.24.0",
            "rehearsal_model": "qwen3-32b", "args": {"load-format": "dummy", "num-gpu-blocks-override": 5280}}
    load = {"sessions": 8, "concurrency": 1, "history_tokens": 12000, "turns": 4, "turn_tokens": 400,
            "output_tokens": 32}
    # 109,824 tokens against 84,480 in the pool and 32 GiB / 256 KiB = 131,072 in RAM.
    assert offload("tiered", vllm, workload=load, offload_gib=32, fs_gib=64) == [
        "sizing: the working set (109,824 tokens) fits the GPU KV pool and the host RAM tier (84,480 + 131,072 = "
        "215,552 tokens), so the file-system tier is never reached; give more sessions or history_tokens, or a "
        "smaller offload_gib"]
    assert offload("tiered", vllm, workload=load, offload_gib=4, fs_gib=64) == []  # 84,480 + 16,384 < 109,824
    assert offload("native_cpu", vllm, workload=load, offload_gib=32) == []  # its RAM tier is read


NUMA_FACTS = {
    "memory": {"total_bytes": 128 * GIB, "available_bytes": 120 * GIB},
    "numa": [{"node": 0, "mem_total_bytes": 64 * GIB, "mem_free_bytes": 60 * GIB},
             {"node": 1, "mem_total_bytes": 64 * GIB, "mem_free_bytes": 60 * GIB}],
    "gpus": [{"index": 0, "numa_node": 0, "memory_total_mib": 143771}, {"index": 1, "numa_node": 1}],
    "shm": {"path": "/dev/shm", "size_bytes": 64 * GIB, "free_bytes": 1 * GIB,
            "vllm_offload_files": [{"name": "vllm_offload_0_1.mmap", "size_bytes": GIB}]},
}


def test_host_ram_from_cached_facts_is_checked_against_the_gpus_numa_node_in_all() -> None:
    on_gpu0 = {**STANDIN, "gpus": [0]}
    assert offload("native_cpu", on_gpu0, NUMA_FACTS, offload_gib=40) == [
        "host RAM: 1 engine copy x 40 GiB offload x safety 2 = 80.0 GiB needed on NUMA node 0 (GPUs 0), but only "
        "64.0 GiB is there in all (its MemTotal)"]
    # What was free when the facts were read (60 GiB, 1 GiB of /dev/shm, a stale file) refuses nothing at
    # plan time: the node's own preflight checks it when the trial starts.
    assert offload("native_cpu", on_gpu0, NUMA_FACTS, offload_gib=30) == []
    assert offload("native_cpu", on_gpu0, None, offload_gib=400) == []  # no facts cached: nothing known


def test_the_whole_host_counts_without_gpu_numa_facts_and_dev_shm_by_its_size() -> None:
    host_only = {"memory": {"total_bytes": 32 * GIB}, "shm": {"path": "/dev/shm", "size_bytes": 16 * GIB}}
    assert offload("native_cpu", STANDIN, host_only, offload_gib=20, ram_safety_factor=1) == [
        "/dev/shm: 1 engine copy x 20 GiB = 20.0 GiB needed for the native offload buffers, but it has 16.0 GiB "
        "in all (its size)"]
    assert offload("native_cpu", STANDIN, host_only, offload_gib=17, ram_safety_factor=2)[0] == (
        "host RAM: 1 engine copy x 17 GiB offload x safety 2 = 34.0 GiB needed on this host, but only 32.0 GiB "
        "is there in all (MemTotal)")
    assert offload("lmcache_cpu", STANDIN, host_only, offload_gib=15, ram_safety_factor=2) == []  # no /dev/shm
    assert offload("native_cpu", STANDIN, {"shm": {}}, offload_gib=15) == []  # no memory figure: unknown


H200 = {"memory": {"total_bytes": 125 * GIB},
        "gpus": [{"index": 0, "memory_total_mib": 143771}],
        "mounts": [{"mountpoint": "/", "fstype": "ext4", "size_bytes": 100 * GIB},
                   {"mountpoint": "/dev/shm", "fstype": "tmpfs", "size_bytes": 63 * GIB},
                   {"mountpoint": "/mnt/data", "fstype": "xfs", "size_bytes": 7000 * GIB}]}
VLLM = {"kind": "vllm", "model": "/m", "port": 8000, "gpus": [0], "args": {"gpu-memory-utilization": 0.5}}


def snapshot(mode: str, engine: dict[str, Any], facts: dict[str, Any] | None, **params: Any) -> list[str]:
    dumped = SNAPSHOT.modes[mode].model_validate(params).model_dump(mode="json")
    ctx = TrialContext(mode, dumped, engine, host="h", trial_id=f"snapshot.{mode}.r1@h",
                       remote_dir="/opt/work/snapshot.r1", campaign="c", facts=facts)
    return SNAPSHOT.plan_checks(ctx)


def unquiesced(reason: str) -> str:
    """An engine that does not sleep first: the refusal names the remedy (runner/experiments/snapshot.py)."""
    return f"quiesce none: {reason}; quiesce the engine first (quiesce: sleep)"


def test_a_criu_image_is_checked_against_its_filesystem_and_ram_in_all() -> None:
    # 0.9 of a 140.4 GiB H200 is 126.4 GiB: more than the root filesystem and than the host's RAM.
    full = {**VLLM, "args": {}}
    assert snapshot("criu", full, H200) == [unquiesced(r) for r in (
        "the image holds the engine's GPU memory (>= 126.4 GiB) but /opt/work/snapshot.r1/images (ext4 at /) has "
        "100.0 GiB in all (its size)",
        "dumping moves 126.4 GiB of GPU memory to host RAM: 126.4 GiB needed, 125.0 GiB in all (MemTotal)")]
    # Half the card (70.2 GiB) on tmpfs is RAM twice over; on the RAID it fits.
    assert snapshot("criu", VLLM, H200, images_dir="/dev/shm/images") == [unquiesced(r) for r in (
        "the image holds the engine's GPU memory (>= 70.2 GiB) but /dev/shm/images (tmpfs at /dev/shm) has "
        "63.0 GiB in all (its size)",
        "dumping moves 70.2 GiB of GPU memory to host RAM and writes it again to tmpfs at /dev/shm: 140.4 GiB "
        "needed, 125.0 GiB in all (MemTotal)")]
    assert snapshot("criu", VLLM, H200, images_dir="/mnt/data/images") == []
    assert snapshot("criu", full, H200, quiesce="sleep") == []  # asleep, the image holds the weights only


def test_cuda_checkpoint_is_checked_against_ram_in_all_and_nothing_without_facts() -> None:
    assert snapshot("cuda_checkpoint", {**VLLM, "args": {}}, H200) == [unquiesced(
        "checkpointing moves up to 126.4 GiB of GPU memory (0.9 of GPU(s) 0) to host RAM, but only 125.0 GiB "
        "is there in all (MemTotal, from the facts an earlier run gathered)")]
    assert snapshot("cuda_checkpoint", VLLM, H200) == []
    assert snapshot("cuda_checkpoint", {**VLLM, "args": {}}, None) == []
    assert snapshot("cuda_checkpoint", {**VLLM, "gpus": []}, H200) == []  # no GPU: nothing moves


@pytest.mark.parametrize("mode", ["criu", "cuda_checkpoint", "vllm_snapshot"])
def test_gpus_the_facts_do_not_list_refuse_nothing(mode: str) -> None:
    assert snapshot(mode, {**VLLM, "gpus": [3], "args": {}}, H200) == []
