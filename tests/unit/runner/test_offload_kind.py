"""The offload kind: modes rendered from data, strict parameters, resources, and collect on real artefacts."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.experiments.base import TrialContext
from runner.experiments.launch import engine_argv
from runner.experiments.offload import KIND, MODES, working_set
from runner.spec import load_campaign

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests/fixtures"


def recipe(mode: str, **params: object) -> dict[str, object]:
    return MODES[mode].model_validate(params).model_dump(mode="json")["recipe"]


def test_native_cpu_is_the_seeds_flag_pair() -> None:
    argv = engine_argv(recipe("native_cpu", offload_gib=200)["args"])
    assert argv == ["--enable-prompt-tokens-details", "--kv-offloading-backend", "native", "--kv-offloading-size",
                    "200.0"]
    assert engine_argv(recipe("hbm_only")["args"]) == ["--enable-prompt-tokens-details"]


def test_tiered_renders_a_tiering_spec_with_an_fs_tier() -> None:
    r = recipe("tiered", offload_gib=64, fs_dir="/mnt/data/kv_cache")
    argv = engine_argv(r["args"])
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    extra = config["kv_connector_extra_config"]
    assert config["kv_connector"] == "OffloadingConnector" and extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["cpu_bytes_to_use"] == 64 * 2**30
    assert extra["secondary_tiers"] == [{"type": "fs", "root_dir": "{trial_fs_dir}", "n_read_threads": 32,
                                         "n_write_threads": 16}]
    assert r["min_version"] == "0.22.0" and r["fs"] is True and r["shm"] is True


def test_lmcache_modes_use_the_connector_and_its_environment() -> None:
    cpu = recipe("lmcache_cpu", offload_gib=200, image="lmcache/vllm-openai:v0.5.6rc3")
    assert cpu["args"]["kv-transfer-config"] == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    assert cpu["env"] == {"LMCACHE_CHUNK_SIZE": "256", "LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": "200"}
    assert cpu["image"] == "lmcache/vllm-openai:v0.5.6rc3" and cpu["shm"] is False
    disk = recipe("lmcache_disk", offload_gib=20, fs_gib=500)
    assert disk["env"]["LMCACHE_LOCAL_DISK"] == "file://{trial_fs_dir}/"
    assert disk["env"]["LMCACHE_MAX_LOCAL_DISK_SIZE"] == "500"
    assert disk["standin"] == ""  # the stand-in models LMCache's disk as a file-system tier below its RAM
    # LMCache's torch-ops fallback is refused unless the mode asks for it; the node gets the flag.
    assert cpu["refuse_torch_ops"] is True and disk["refuse_torch_ops"] is True
    assert recipe("lmcache_cpu", allow_torch_fallback=True)["refuse_torch_ops"] is False
    assert recipe("native_cpu")["refuse_torch_ops"] is False


def test_resources_reserve_ram_for_every_copy_with_the_safety_factor() -> None:
    params = MODES["native_cpu"].model_validate({"offload_gib": 96, "engine_copies": 4}).model_dump(mode="json")
    res = KIND.resources(TrialContext("native_cpu", params, {"gpus": [0, 1, 2, 3]}))
    assert res.host_ram_gib == 96 * 4 * 2.0 and res.exclusive and res.gpus == (0, 1, 2, 3)


def test_parameters_are_strict_per_mode(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign("""\
name: bad
inventory: inventory
engine: {model: /m}
experiments:
  - kind: offload
    modes:
      hbm_only: {offload_gib: 10}
      native_cpu: {offload_gib: 0, workload: {sessions: 0, turns: 2}}
""")
    with pytest.raises(SpecError) as info:
        load_campaign(path, check_hosts=False)
    assert info.value.lines == [
        f"{path}:7: experiments[0].modes.hbm_only.offload_gib: unknown key",
        f"{path}:8: experiments[0].modes.native_cpu.workload.sessions: must be >= 1",
        f"{path}:8: experiments[0].modes.native_cpu.offload_gib: must be > 0",
    ]


@pytest.mark.parametrize("name", ["offload-local.yaml", "offload-h200.yaml"])
def test_shipped_campaigns_validate(name: str) -> None:
    loaded = load_campaign(REPO / "campaigns" / name, check_hosts=False)
    offload = loaded.modes[[e.kind for e in loaded.campaign.experiments].index("offload")]
    assert {"hbm_only", "native_cpu"} <= set(offload)
    assert offload["hbm_only"]["workload"] == offload["native_cpu"]["workload"]


def test_working_set_says_which_tier_can_be_reached() -> None:
    seed = working_set(3_660_000, 32, 2_920_000, 0)
    assert seed["ws_over_hbm"] == 1.253 and "1.25x the GPU KV pool" in seed["tier_note"]
    # The reference campaign's RAID tier: 4 GPUs held the whole working set.
    raid = working_set(3_660_000, 32, 4_310_000, 6_000_000)
    assert raid["tier_note"].startswith("working set 3,660,000 tokens fits the GPU KV pool (4,310,000)")
    ram = working_set(3_660_000, 32, 2_920_000, 6_000_000)
    assert "a tier below host RAM cannot be reached" in ram["tier_note"] and ram["ws_over_hbm_plus_host"] == 0.41
    fs = working_set(3_660_000, 32, 2_920_000, 300_000)
    assert fs["tier_note"].endswith("a file-system tier can be reached")


def _requests(turns: int, sessions: int) -> str:
    lines = []
    for turn in range(turns):
        for s in range(sessions):
            t0 = 1000.0 + 10 * turn + s
            lines.append(json.dumps({
                "session": s, "turn": turn, "attempt": 1, "final": True, "status": "ok", "engine": 0, "error": None,
                "t_start": t0, "t_first_token": t0 + 0.5, "t_end": t0 + 2, "ttft_s": 2.0 if turn == 0 else 0.5,
                "latency_s": 2.0, "prompt_tokens": 100_000 + 2_800 * turn, "completion_tokens": 400,
                "cached_tokens": 0 if turn == 0 else 99_000}))
    return "\n".join(lines) + "\n"


def test_collect_on_real_vllm_artefacts(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "h200"
    raw.mkdir(parents=True)
    log = (FIXTURES / "vllm_logs/real/vllm-0.24.0-h200-offload_native.log").read_text()
    during = ("(APIServer pid=31055) INFO 11-29 14:52:10 [loggers.py:259] Engine 000: Avg prompt throughput: "
              "9000.0 tokens/s, Avg generation throughput: 300.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, GPU KV "
              "cache usage: 97.0%, Prefix cache hit rate: 1.5%, External prefix cache hit rate: 97.7%\n")
    after = during.replace("14:52:10", "14:53:10").replace("1.5%", "60.0%").replace("97.7%", "12.0%")
    head = log[:log.index("(APIServer pid=31055) INFO:     Shutting down")] if "Shutting down" in log else log
    (raw / "server.log").write_text(head + during + after)
    load_end = len((head + during).encode())
    shutil.copy(FIXTURES / "metrics/vllm_0.24_before.prom", raw / "metrics_before.txt")
    shutil.copy(FIXTURES / "metrics/vllm_0.24_after.prom", raw / "metrics_after.txt")
    (raw / "requests.jsonl").write_text(_requests(turns=3, sessions=4))
    (raw / "run.json").write_text(json.dumps({
        "ready_s": 92.1, "log_offsets": [{"load_start": 0, "load_end": load_end}],
        "load": {"load_wall_s": 30.0, "turns_completed": 3, "client_cpu_s": 1.5,
                 "loop_lag_ms": {"samples": 10, "p50_ms": 0.2, "p99_ms": 1.1, "max_ms": 2.0}},
        "quality": {"applicable": True, "engine": "vllm", "total": 24, "correct": 24, "looping": 0,
                    "failed_requests": 0}}))
    params = MODES["native_cpu"].model_validate(
        {"offload_gib": 8, "workload": {"sessions": 4, "history_tokens": 100_000, "turns": 3}}).model_dump(mode="json")
    metrics = KIND.collect(TrialContext("native_cpu", params, {}, tmp_path, "h200"))
    # The log's last stats line *of the load*, not the one written during the quality check.
    assert metrics["prefix_hit_pct_log_last"] == 1.5 and metrics["external_hit_pct_log_last"] == 97.7
    assert metrics["prefix_hit_pct_metrics_run"] == 75.0 and metrics["external_hit_pct_metrics_run"] == 80.0
    assert metrics["kv_cache_tokens"] == 1_108_208
    # 8 GiB at the GPU's 67.64 GiB / 1,108,208 tokens.
    assert metrics["host_tier_tokens"] == int(8 * 1_108_208 / 67.64)
    assert metrics["host_tier_source"] == "estimate from GPU bytes per token"
    assert metrics["working_set_tokens"] == 4 * (100_000 + 2 * 2_800 + 400)
    assert metrics["quality"] == "24/24 correct, 0/24 looping" and metrics["quality_correct"] == 24
    assert metrics["ttft_median_turn0_s"] == 2.0 and metrics["ttft_median_revisit_s"] == 0.5
    assert metrics["barrier_ok"] is True and metrics["requests_ok"] == 12
    assert metrics["cached_pct_usage"] == round(100 * 8 * 99_000 / (4 * (100_000 + 102_800 + 105_600)), 2)
    host = metrics["host_tier_tokens"]
    assert metrics["sizing_note"] == (f"GPU pool 1,108,208 tokens; working set {metrics['working_set_tokens']:,} "
                                      f"tokens (0.38x the pool); host RAM tier 8 GiB ({host:,} tokens); "
                                      f"GPU + host RAM {1_108_208 + host:,} tokens (0.34x)")
    assert "kv_transfer_source" not in metrics  # this log and these snapshots count no transfers


def test_a_ram_tier_that_refused_to_store_says_so_in_the_row(tmp_path: Path) -> None:
    """The H200's tiered run with a 2 GiB RAM tier (its log, with 25 of the 934 refusals kept): the
    row counts "cannot store blocks" and the tier note says why the file-system tier stayed empty."""
    raw = tmp_path / "raw" / "h200"
    raw.mkdir(parents=True)
    shutil.copy(FIXTURES / "vllm_logs/real/vllm-0.24.0-h200-offload_tiered_ram_tier_too_small.log", raw / "server.log")
    (raw / "requests.jsonl").write_text(_requests(turns=3, sessions=4))
    (raw / "run.json").write_text(json.dumps({"ready_s": 156.5, "kv_bytes_per_token": 262144,
                                              "load": {"load_wall_s": 60.1, "turns_completed": 3}}))
    load = {"sessions": 8, "history_tokens": 12000, "turns": 4, "turn_tokens": 400, "output_tokens": 32}
    params = MODES["tiered"].model_validate({"offload_gib": 2, "fs_gib": 32, "workload": load}).model_dump(mode="json")
    metrics = KIND.collect(TrialContext("tiered", params, {"args": {"num-gpu-blocks-override": 5280}}, tmp_path,
                                        "h200"))
    assert metrics["offload_store_refused"] == 25
    assert metrics["tier_note"].endswith(
        "; the engine refused to store blocks 25 times ('cannot store blocks'): the RAM tier had no room for the "
        "requests in flight, so what it refused was never offloaded")
    assert metrics["host_tier_tokens"] == 8192 and metrics["kv_cache_tokens"] == 84480
    native = MODES["native_cpu"].model_validate({"offload_gib": 2}).model_dump(mode="json")
    (raw / "server.log").write_text((FIXTURES / "vllm_logs/real/vllm-0.24.0-h200-offload_native.log").read_text())
    assert "offload_store_refused" not in KIND.collect(TrialContext("native_cpu", native, {}, tmp_path, "h200"))


def _transfer_metrics(cpu_to_gpu: tuple[float, float], gpu_to_cpu: tuple[float, float]) -> str:
    """vLLM's offloading connector counters (vllm/.../offloading/metrics.py: OffloadPromMetrics)."""
    lines = ["# TYPE vllm:kv_offload_total_bytes counter", "# TYPE vllm:kv_offload_total_time counter"]
    for kind, (size, seconds) in (("CPU_to_GPU", cpu_to_gpu), ("GPU_to_CPU", gpu_to_cpu)):
        labels = f'engine="0",model_name="m",transfer_type="{kind}"'
        lines += [f"vllm:kv_offload_total_bytes_total{{{labels}}} {size}",
                  f"vllm:kv_offload_total_time_total{{{labels}}} {seconds}"]
    return "\n".join(lines) + "\n"


def test_kv_transfers_are_the_counter_deltas_with_their_rate(tmp_path: Path) -> None:
    from runner.experiments.offload.collect import _metric_pairs, kv_transfers
    from runner.experiments.offload.report import rows

    (tmp_path / "metrics_before.txt").write_text(_transfer_metrics((1e9, 0.1), (0.0, 0.0)))
    (tmp_path / "metrics_after.txt").write_text(_transfer_metrics((14.39e9, 0.48), (5.13e9, 0.104)))
    # The second engine copy adds its own.
    (tmp_path / "metrics_before.c1.txt").write_text(_transfer_metrics((0.0, 0.0), (0.0, 0.0)))
    (tmp_path / "metrics_after.c1.txt").write_text(_transfer_metrics((1e9, 0.02), (0.0, 0.0)))
    moved = kv_transfers(_metric_pairs(tmp_path), ["KV Transfer metrics: CPU_to_GPU_total_bytes=999"])
    assert moved == {"kv_cpu_to_gpu_gb": 14.39, "kv_cpu_to_gpu_s": 0.4, "kv_cpu_to_gpu_gb_s": 35.98,
                     "kv_gpu_to_cpu_gb": 5.13, "kv_gpu_to_cpu_s": 0.104, "kv_gpu_to_cpu_gb_s": 49.33,
                     "kv_transfer_source": "metrics"}
    (row,) = rows({"metrics": {**moved, "ws_over_hbm": 1.3}})
    assert row["kv_cpu_to_gpu_gb_s"] == 35.98 and row["kv_transfer_source"] == "metrics" and row["ws_over_hbm"] == 1.3


def test_kv_transfers_fall_back_to_the_connectors_log_lines_of_the_load() -> None:
    from runner.experiments.offload.collect import kv_transfers

    line = ("(EngineCore pid=3) INFO 11-29 14:52:1{i} [metrics.py:103] KV Transfer metrics: "
            "CPU_to_GPU_total_bytes=2000000000, CPU_to_GPU_total_time=0.05, GPU_to_CPU_total_bytes=1e9, "
            "GPU_to_CPU_total_time=0.02\n")
    window = "".join(line.format(i=i) for i in range(3))
    assert kv_transfers([], [window]) == {"kv_cpu_to_gpu_gb": 6.0, "kv_cpu_to_gpu_s": 0.15, "kv_cpu_to_gpu_gb_s": 40.0,
                                          "kv_gpu_to_cpu_gb": 3.0, "kv_gpu_to_cpu_s": 0.06, "kv_gpu_to_cpu_gb_s": 50.0,
                                          "kv_transfer_source": "log"}
    assert kv_transfers([], ["no connector here"]) == {}  # no figure is never a zero


def test_lmcache_copies_are_read_from_its_own_log_lines() -> None:
    """The H200's lmcache_cpu run (its log with 99,518 repeated platform lines dropped): LMCache has
    no /metrics counters or connector lines; it logs each request's copy, size in GiB."""
    from runner.experiments.offload.collect import kv_transfers

    log = (FIXTURES / "vllm_logs/real/vllm-0.24.0-h200-offload_lmcache_cpu.log").read_text()
    moved = kv_transfers([], [log])
    # 45 stores: 26.75 GiB in 5.264 s; 24 retrievals: 70.4375 GiB in 36.368 s (LMCache on torch ops).
    assert moved == {"kv_cpu_to_gpu_gb": 75.632, "kv_cpu_to_gpu_s": 36.368, "kv_cpu_to_gpu_gb_s": 2.08,
                     "kv_gpu_to_cpu_gb": 28.723, "kv_gpu_to_cpu_s": 5.264, "kv_gpu_to_cpu_gb_s": 5.46,
                     "kv_transfer_source": "lmcache log"}


def test_the_engines_file_io_during_the_load_is_the_counters_delta_summed_over_copies() -> None:
    # vLLM 0.24.0's /metrics count CPU<->GPU copies only: the H200's tiered run moved 121 GB to the
    # GPU with no figure for its file-system tier. The engine's own read() counters say it.
    from runner.experiments.offload.collect import engine_file_io

    gib = 2**30

    def io(rchar: int, read: int = 0, wchar: int = 0, write: int = 0) -> dict:
        return {"rchar": rchar, "read_bytes": read, "wchar": wchar, "write_bytes": write}

    run = {"file_io": [
        {"before": {"processes": {"10:5": io(gib), "11:6": io(0)}},
         "after": {"processes": {"10:5": io(41 * gib, 2 * gib, 40 * gib, 39 * gib), "11:6": io(gib),
                                 "12:9": io(50 * gib)}}},  # started during the load: its lifetime is no delta
        {"before": {"processes": {"20:1": io(9 * gib)}}, "after": {"processes": {}}},  # a copy that died
        {"before": {}, "after": {}},  # a container's copy: not counted
    ]}
    assert engine_file_io(run) == {"engine_file_read_gb": round(41 * gib / 1e9, 3),
                                   "engine_disk_read_gb": round(2 * gib / 1e9, 3),
                                   "engine_file_write_gb": round(40 * gib / 1e9, 3),
                                   "engine_disk_write_gb": round(39 * gib / 1e9, 3)}
    assert engine_file_io({}) == {} and engine_file_io({"file_io": [run["file_io"][1]]}) == {}
