"""Which tier served each hit and at what rate, LMCache's copy path, the revisit turns and the
hbm_only baseline of a results folder, and the ladder's columns and report table on real logs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from nodetools.offload.lmcache_gate import (
    CUDA_EXTENSION,
    TORCH_OPS,
    fallback_line,
    first_fallback,
    lmcache_path,
    refusal,
    scan_logs,
)
from runner.experiments.base import TrialContext
from runner.experiments.offload import KIND, MODES
from runner.experiments.offload.breakeven import TierRead, TurnShape
from runner.experiments.offload.ladder_report import ladder_section
from runner.experiments.offload.revisits import folder_baseline, prefill_busy_s, turn_shapes
from runner.experiments.offload.tiers import TierInputs, tier_columns, tier_reads
from runner.parse.loadgen import requests_frame

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LMCACHE_LOG = FIXTURES / "vllm_logs/real/vllm-0.24.0-h200-offload_lmcache_cpu.log"
NATIVE_LOG = FIXTURES / "vllm_logs/real/vllm-0.24.0-h200-offload_native.log"
KIB256 = 256 * 1024


def test_hbm_only_has_the_gpu_alone() -> None:
    cols = tier_columns(TierInputs(gpu_hits=1200, external_hits=None, host_tier=False, fs_tier=False,
                                   kv_bytes_per_token=KIB256))
    assert cols == {"tier_hit_tokens_gpu": 1200,
                    "tier_hit_source": "the engine's prefix-cache hits (no tier below the GPU)"}
    assert tier_reads(cols) == []


def test_a_host_tier_serves_every_external_hit_at_the_engines_copy_rate() -> None:
    # The H200's native_cpu run: 74.5 GB to the GPU at 43.97 GB/s (its /metrics counters).
    cols = tier_columns(TierInputs(gpu_hits=6_000, external_hits=284_000, host_tier=True, fs_tier=False,
                                   kv_bytes_per_token=KIB256, transfers={"kv_cpu_to_gpu_gb_s": 43.97,
                                                                         "kv_transfer_source": "metrics"}))
    assert cols["tier_hit_tokens_cpu"] == 284_000 and "tier_hit_tokens_fs" not in cols
    assert cols["tier_read_gb_cpu"] == round(284_000 * KIB256 / 1e9, 3)
    assert cols["tier_read_gb_s"] == cols["tier_read_gb_s_cpu"] == 43.97 and cols["tier_read_tier"] == "cpu"
    assert cols["tier_read_source"] == "RAM: the engine's CPU->GPU copies"
    assert tier_reads(cols) == [TierRead("cpu", 284_000, 43.97)]


def test_vllms_tiering_splits_by_the_engines_file_reads_and_prices_the_disk_at_the_nodes_rate() -> None:
    """vLLM 0.24.0 times only its CPU<->GPU copies: the file-system tier's share is what the engine
    read from files, its rate the disk's measured one for what the disk moved, plus the copy."""
    base = dict(gpu_hits=0, external_hits=460_000, host_tier=True, fs_tier=True, kv_bytes_per_token=KIB256,
                transfers={"kv_cpu_to_gpu_gb_s": 44.5})
    fs_gb = 400_000 * KIB256 / 1e9
    cols = tier_columns(TierInputs(**base, file_read_gb=fs_gb, disk_read_gb=30.0, disk_limit_gb_s=1.75,
                                   disk_limit_source="fio seq_read_direct /opt/gpu-campaign/fio"))
    assert cols["tier_hit_tokens_fs"] == 400_000 and cols["tier_hit_tokens_cpu"] == 60_000
    seconds = 30.0 / 1.75 + fs_gb / 44.5
    assert cols["tier_read_gb_s_fs"] == round(fs_gb / seconds, 2) == cols["tier_read_gb_s"]
    assert cols["tier_read_tier"] == "fs"
    assert "30 GB from the disk at its measured 1.75 GB/s (fio seq_read_direct" in cols["tier_read_source"]
    # More file reads than external hits (a tier written and read back): capped at the hits.
    assert tier_columns(TierInputs(**base, file_read_gb=500.0))["tier_hit_tokens_fs"] == 460_000
    # No storage trial: the tokens stand, the rate says why it is missing.
    cols = tier_columns(TierInputs(**base, file_read_gb=fs_gb))
    assert "tier_read_gb_s_fs" not in cols and "tier_read_gb_s" not in cols
    assert "no storage trial measured the node's disk" in cols["tier_read_source"]
    # A container's engine reads outside the counted group: no split, said so.
    cols = tier_columns(TierInputs(**base))
    assert "tier_hit_tokens_fs" not in cols and "were not counted" in cols["tier_hit_source"]


def test_per_tier_counters_and_a_timed_fs_transfer_win() -> None:
    """The stand-in counts hits per tier and times its file-system loads (FS_to_GPU)."""
    cols = tier_columns(TierInputs(
        gpu_hits=10, external_hits=900, host_tier=True, fs_tier=True, by_tier={"cpu": 300, "fs": 600},
        kv_bytes_per_token=4096, transfers={"kv_cpu_to_gpu_gb_s": 2.05, "kv_fs_to_gpu_gb_s": 0.41},
        file_read_gb=0.0))
    assert (cols["tier_hit_tokens_cpu"], cols["tier_hit_tokens_fs"]) == (300, 600)
    assert cols["tier_hit_source"] == "the engine's per-tier counters"
    assert (cols["tier_read_gb_s_cpu"], cols["tier_read_gb_s_fs"], cols["tier_read_gb_s"]) == (2.05, 0.41, 0.41)
    assert "file system: the engine's timed fs->GPU transfers" in cols["tier_read_source"]


def test_lmcache_times_its_retrievals_for_both_its_tiers() -> None:
    cols = tier_columns(TierInputs(gpu_hits=0, external_hits=300_000, host_tier=True, fs_tier=True, lmcache=True,
                                   kv_bytes_per_token=KIB256, transfers={"kv_cpu_to_gpu_gb_s": 2.08},
                                   file_read_gb=100_000 * KIB256 / 1e9))
    assert (cols["tier_hit_tokens_cpu"], cols["tier_hit_tokens_fs"]) == (200_000, 100_000)
    assert cols["tier_read_gb_s_cpu"] == cols["tier_read_gb_s_fs"] == 2.08
    assert cols["tier_read_source"] == ("RAM: LMCache's retrieval lines; file system: LMCache's retrieval lines "
                                        "(its disk and RAM together)")


def test_lmcaches_copy_path_from_its_own_startup_line() -> None:
    text = LMCACHE_LOG.read_text()
    assert fallback_line(text) == ("lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays on the torch "
                                   "baseline for all ops.")
    assert lmcache_path(text) == TORCH_OPS
    older = "LMCache WARNING: lmcache.c_ops compiled extension not found; CudaDeviceOps stays on the torch baseline"
    assert lmcache_path(older) == TORCH_OPS
    # The extension bound: LMCache started and said nothing about it.
    bound = "\n".join(line for line in text.splitlines() if "compiled extension not found" not in line)
    assert lmcache_path(bound) == CUDA_EXTENSION
    assert lmcache_path(NATIVE_LOG.read_text()) == ""  # no LMCache in this engine
    reason = refusal(fallback_line(text) or "")
    assert reason.startswith("LMCache runs its KV copies as torch ops, not its CUDA extension: its log says "
                             "'lmcache.cuda_ops compiled extension not found; ")
    assert "docs/offload.md, 'LMCache at its real speed'" in reason and "allow_torch_fallback: true" in reason


def test_every_copys_log_counts(tmp_path: Path) -> None:
    clean, fell_back = tmp_path / "server.log", tmp_path / "server.c1.log"
    clean.write_text("Creating v1 connector with name: LMCacheConnectorV1 and engine_id: x\n")
    fell_back.write_text(LMCACHE_LOG.read_text())
    assert scan_logs([clean]) == CUDA_EXTENSION and scan_logs([clean, fell_back]) == TORCH_OPS
    assert scan_logs([tmp_path / "missing.log"]) == ""
    assert first_fallback([clean, fell_back]) == fallback_line(LMCACHE_LOG.read_text())
    assert first_fallback([clean]) is None
    assert scan_logs([fell_back], limit=1000) == ""  # bounded: only the head of a log is read


def test_a_turns_prefill_seconds_count_overlapping_waits_once() -> None:
    assert prefill_busy_s([(0, 1.5), (0, 3.0), (0.5, 1.0), (7.5, 9.0), (7.6, 10.0)]) == pytest.approx(5.5)
    assert prefill_busy_s([]) == 0.0


def _record(session: int, turn: int, t0: float, ttft: float, prompt: int, cached: int | None,
            status: str = "ok") -> str:
    return json.dumps({"session": session, "turn": turn, "attempt": 1, "final": True, "status": status,
                       "t_start": t0, "t_first_token": t0 + ttft, "t_end": t0 + ttft + 2, "ttft_s": ttft,
                       "latency_s": ttft + 2, "prompt_tokens": prompt, "completion_tokens": 32,
                       "cached_tokens": cached})


def test_revisit_turns_from_the_requests() -> None:
    lines = [_record(s, 0, 100.0, 1.0 + s, 12_000, 0) for s in range(2)]
    lines += [_record(0, 1, 200.0, 1.5, 12_400, 100), _record(1, 1, 200.0, 3.0, 12_400, 400)]
    lines += [_record(0, 2, 300.0, 1.0, 12_800, 0), _record(1, 2, 300.0, 1.0, 12_800, 0, "failed")]
    lines += [_record(0, 3, 400.0, 1.0, 13_200, None), _record(1, 3, 400.0, 1.0, 13_200, 0)]
    shapes = turn_shapes(requests_frame(lines))
    # Turn 0 is the cold visit; turn 2 lost a request; turn 3's usage had no cached tokens.
    assert shapes == [TurnShape(requests=2, uncached_tokens=24_800 - 500, prefill_busy_s=3.0, wall_s=5.0)]


def _store(root: Path, trial_id: str, **record: object) -> Path:
    folder = root / "trials" / trial_id
    folder.mkdir(parents=True)
    (folder / "trial.json").write_text(json.dumps({"id": trial_id, "kind": "offload", **record}))
    return folder


def test_the_baseline_is_the_ok_hbm_only_trials_of_the_same_experiment_and_host(tmp_path: Path) -> None:
    common = {"experiment": "offload", "host": "h200", "mode": "hbm_only", "status": "ok"}
    _store(tmp_path, "offload.hbm_only.r1@h200", **common,
           metrics={"prefill_tok_s": 9_000.0, "other_s_per_request": 0.5, "baseline_turns": 3})
    _store(tmp_path, "offload.hbm_only.r2@h200", **common,
           metrics={"prefill_tok_s": 10_000.0, "other_s_per_request": 0.6, "baseline_turns": 3})
    _store(tmp_path, "offload.hbm_only.r3@h200", **{**common, "status": "failed"}, metrics={"prefill_tok_s": 1.0})
    _store(tmp_path, "offload.hbm_only.r1@other", **{**common, "host": "other"},
           metrics={"prefill_tok_s": 1.0, "other_s_per_request": 0.1})
    _store(tmp_path, "small.hbm_only.r1@h200", **{**common, "experiment": "small"},
           metrics={"prefill_tok_s": 1.0, "other_s_per_request": 0.1})
    trial = _store(tmp_path, "offload.tiered.r1@h200", experiment="offload", host="h200", mode="tiered",
                   status="running")
    base, trials = folder_baseline(trial, "h200")
    assert base is not None and (base.prefill_tok_s, base.other_s_per_request, base.turns) == (9_500.0, 0.55, 6)
    assert trials == "offload.hbm_only.r1@h200, offload.hbm_only.r2@h200"
    # An hbm_only trial counts its own turns before its record holds them.
    mine = _store(tmp_path, "offload.hbm_only.r3b@h200", **{**common, "status": "running"})
    base, trials = folder_baseline(mine, "h200", [TurnShape(8, 110_000, 10.0, 14.0)])
    assert base is not None and base.prefill_tok_s == 10_000.0 and trials.startswith("offload.hbm_only.r3b@h200, ")
    assert folder_baseline(_store(tmp_path / "empty", "x", experiment="offload"), "h200") == (None, "")


def _lmcache_trial(results: Path) -> TrialContext:
    raw = results / "trials" / "offload.lmcache_cpu.r1@h200" / "raw" / "h200"
    raw.mkdir(parents=True)
    shutil.copy(LMCACHE_LOG, raw / "server.log")
    lines = [_record(s, t, 100.0 * t + s, 3.0 if t == 0 else 1.2, 12_000 + 400 * t, 0 if t == 0 else 11_776)
             for t in range(3) for s in range(4)]
    (raw / "requests.jsonl").write_text("\n".join(lines) + "\n")
    (raw / "run.json").write_text(json.dumps({"ready_s": 94.6, "kv_bytes_per_token": KIB256,
                                              "load": {"load_wall_s": 65.3, "turns_completed": 3}}))
    params = MODES["lmcache_cpu"].model_validate({"offload_gib": 32}).model_dump(mode="json")
    (raw.parent.parent / "trial.json").write_text(json.dumps({"id": "offload.lmcache_cpu.r1@h200", "kind": "offload",
                                                               "experiment": "offload", "status": "running"}))
    return TrialContext("lmcache_cpu", params, {"kind": "vllm", "args": {"num-gpu-blocks-override": 5280}},
                        raw.parent.parent, "h200")


def test_collect_adds_the_ladder_on_the_h200s_lmcache_log(tmp_path: Path) -> None:
    results = tmp_path / "results"
    ctx = _lmcache_trial(results)
    metrics = KIND.collect(ctx)
    assert metrics["lmcache_path"] == TORCH_OPS
    assert metrics["kv_cpu_to_gpu_gb_s"] == 2.08 and metrics["kv_transfer_source"] == "lmcache log"
    # No /metrics snapshots here: no token split, said so, and no hbm_only trial yet: no model.
    assert "tier_hit_tokens_cpu" not in metrics and "breakeven_read_gb_s" not in metrics
    assert metrics["model_note"].startswith("no ok hbm_only trial of this experiment and host yet")
    assert metrics["turn_wall_mean_revisit_s"] == pytest.approx(3 + 2 + 1.2)
    # The hbm_only trial arrives (another lease): the same folder now has a baseline.
    _store(results, "offload.hbm_only.r1@h200", experiment="offload", host="h200", mode="hbm_only", status="ok",
           metrics={"prefill_tok_s": 9_368.3, "other_s_per_request": 0.528, "baseline_turns": 3})
    metrics = KIND.collect(ctx)
    assert metrics["breakeven_read_gb_s"] == round(KIB256 * 9_368.3 / 1e9, 3)
    assert metrics["model_note"] == ("recompute 9,368 tokens/s and 0.528 s a request outside prefill "
                                     "(offload.hbm_only.r1@h200, 3 revisit turns); KV 262,144 bytes a token")
    # Without /metrics the tier's tokens are unknown: reads priced as free would flatter it, so no prediction.
    assert "predicted_revisit_turn_s" not in metrics
    # With the engine's counters (before and after the load), the tier's tokens and the turn are priced.
    raw = ctx.trial_dir / "raw" / "h200"
    counters = "# TYPE vllm:{0} counter\nvllm:{0}_total{{engine=\"0\",model_name=\"m\"}} {1}\n"
    names = ("prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_queries", "external_prefix_cache_hits")
    (raw / "metrics_before.txt").write_text("".join(counters.format(name, 0) for name in names))
    (raw / "metrics_after.txt").write_text("".join(counters.format(name, value) for name, value in zip(
        names, (150_000, 0, 150_000, 8 * 11_776), strict=True)))
    metrics = KIND.collect(ctx)
    assert metrics["tier_hit_tokens_cpu"] == 8 * 11_776 and metrics["tier_hit_tokens_gpu"] == 0
    assert metrics["tier_read_gb_s"] == 2.08 and metrics["tier_verdict"] == (
        f"would pay at >= {metrics['breakeven_read_gb_s']:.2f} GB/s (it read 2.08 GB/s)")
    reads = 8 * 11_776 * KIB256 / 1e9 / 2.08 / 2  # two revisit turns
    compute = 4 * 0.528 + 4 * (624 + 1_024) / 2 / 9_368.3
    assert metrics["predicted_revisit_turn_s"] == pytest.approx(compute + reads, abs=2e-3)
    assert metrics["predicted_error_pct"] == pytest.approx(
        100 * (metrics["predicted_revisit_turn_s"] / metrics["turn_wall_mean_revisit_s"] - 1), abs=0.1)


def test_the_report_table_says_per_mode_whether_the_tier_pays() -> None:
    frame = pd.DataFrame([
        {"mode": "hbm_only", "status": "ok", "tier_hit_tokens_gpu": 0, "breakeven_read_gb_s": 2.46,
         "turn_wall_mean_revisit_s": 15.6, "predicted_revisit_turn_s": 15.6, "model_note": "recompute 9,368"},
        {"mode": "native_cpu", "status": "ok", "tier_hit_tokens_gpu": 100, "tier_hit_tokens_cpu": 308_000,
         "tier_read_tier": "cpu", "tier_read_gb_s": 43.97, "breakeven_read_gb_s": 2.46,
         "turn_wall_mean_revisit_s": 4.52, "predicted_revisit_turn_s": 5.23},
        {"mode": "lmcache_cpu", "status": "ok", "lmcache_path": "torch_ops", "tier_hit_tokens_cpu": 305_000,
         "tier_read_tier": "cpu", "tier_read_gb_s": 2.08, "breakeven_read_gb_s": 2.46,
         "turn_wall_mean_revisit_s": 15.58, "predicted_revisit_turn_s": 17.55},
        {"mode": "lmcache_cpu", "status": "failed"},
    ])
    text = ladder_section(frame)
    assert "| native_cpu | 1 |" in text and "| pays on this node |" in text
    assert "| lmcache_cpu | 1 | torch_ops |" in text and "would pay at >= 2.46 GB/s (it read 2.08 GB/s)" in text
    assert "lmcache_cpu's revisit turn over native_cpu's: 3.45 (15.58 s / 4.52 s)." in text
    assert "The model's baseline: recompute 9,368." in text
    assert ladder_section(frame[frame["status"] == "failed"]) == ""
