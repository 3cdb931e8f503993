"""The break-even model: pure arithmetic, then the H200's committed runs through it, then the
reference campaign's node as docs/offload.md works it out (a prediction)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from runner.experiments.offload.breakeven import (
    Baseline,
    TierRead,
    TurnShape,
    baseline,
    breakeven_read_gb_s,
    merge,
    path_gb_s,
    predict_turn_s,
    read_seconds,
    verdict,
)

H200 = Path(__file__).resolve().parents[2] / "fixtures/offload_h200"
KIB256 = 256 * 1024  # the qwen3-32b preset's KV a token (64 layers x 8 KV heads x 128 x K,V x bf16)


def test_a_tier_pays_when_it_reads_a_token_faster_than_the_engine_recomputes_it() -> None:
    # 10,000 tokens/s of recompute at 256 KiB a token: 2.62 GB/s is the line.
    line = breakeven_read_gb_s(KIB256, 10_000)
    assert line == pytest.approx(2.62144)
    assert read_seconds(10_000, KIB256, line) == pytest.approx(1.0)  # as long as recomputing them
    assert verdict(44.0, line) == "pays on this node"
    assert verdict(2.08, line) == "would pay at >= 2.62 GB/s (it read 2.08 GB/s)"
    assert verdict(None, line) == "would pay at >= 2.62 GB/s (its rate was not measured)"
    assert verdict(1.0, None) == ""


def test_the_baseline_is_the_revisit_turns_totals_and_repeats_take_the_median() -> None:
    turns = [TurnShape(8, 100_000, 10.0, 14.0), TurnShape(8, 110_000, 11.0, 15.0)]
    base = baseline(turns)
    assert base == Baseline(10_000.0, 0.5, 2)  # 210,000 tokens in 21 s; 8 s outside prefill over 16 requests
    assert base.compute_s(TurnShape(8, 10_000, 1.0, 5.0)) == pytest.approx(4.0 + 1.0)
    assert baseline([TurnShape(0, 0, 0.0, 1.0)]) is None and baseline([]) is None
    assert merge([Baseline(8_000, 0.4, 3), Baseline(9_000, 0.6, 3), Baseline(12_000, 0.5, 3)]) == Baseline(
        9_000, 0.5, 9)


def test_the_prediction_adds_each_tiers_reads_and_has_none_without_a_rate() -> None:
    base = Baseline(10_000, 0.5, 3)
    turns = [TurnShape(8, 2_000, 0.5, 6.0)] * 2
    reads = [TierRead("cpu", 100_000, 50.0), TierRead("fs", 20_000, 2.0)]
    # Per turn: 4 s outside prefill + 0.2 s of prefill + half of (0.524 s + 2.62 s) of reads.
    expected = 4.2 + (100_000 * KIB256 / 1e9 / 50 + 20_000 * KIB256 / 1e9 / 2) / 2
    assert predict_turn_s(base, turns, reads, KIB256) == pytest.approx(expected)
    assert predict_turn_s(base, turns, [TierRead("fs", 20_000, None)], KIB256) is None
    assert predict_turn_s(base, [], reads, KIB256) is None
    assert path_gb_s(1.75, 44.5) == pytest.approx(1 / (1 / 1.75 + 1 / 44.5)) and path_gb_s(1.75, None) is None


def _h200_turns(mode: str) -> list[TurnShape]:
    """The revisit turns of a committed H200 run. Those runs kept no requests.jsonl, so a turn's
    prefill seconds are priced at its TTFT p90 per round of 4 requests (the last first token of a
    round of requests sent together)."""
    out = []
    with (H200 / "turns.csv").open() as fh:
        for r in csv.DictReader(fh):
            if r["mode"] == mode and int(r["turn"]) >= 1:
                n = int(r["requests_ok"])
                out.append(TurnShape(n, int(r["prompt_tokens_sum"]) - int(r["cached_tokens_sum"]),
                                     math.ceil(n / 4) * float(r["ttft_p90_s"]), float(r["turn_wall_s"])))
    return out


def _cached(mode: str) -> int:
    with (H200 / "turns.csv").open() as fh:
        return sum(int(r["cached_tokens_sum"]) for r in csv.DictReader(fh) if r["mode"] == mode and int(r["turn"]))


def _mean_wall(turns: list[TurnShape]) -> float:
    return sum(t.wall_s for t in turns) / len(turns)


def test_the_h200s_31b_engine_through_the_model() -> None:
    """hbm_only recomputed ~9.4K tokens/s: a tier must read 2.46 GB/s to beat that. native_cpu's
    44 GB/s pays; LMCache on torch ops (2.08 GB/s) does not, and its revisit turn was hbm_only's;
    the model predicts both turns within 25%."""
    base = baseline(_h200_turns("hbm_only"))
    assert base is not None
    assert base.prefill_tok_s == pytest.approx(9_368, abs=1) and base.other_s_per_request == pytest.approx(0.528, 1e-3)
    line = breakeven_read_gb_s(KIB256, base.prefill_tok_s)
    assert line == pytest.approx(2.456, abs=1e-3)
    assert predict_turn_s(base, _h200_turns("hbm_only"), [], KIB256) == pytest.approx(
        _mean_wall(_h200_turns("hbm_only")))  # its own turns: the arithmetic closes
    for mode, rate, words in (("native_cpu", 43.97, "pays on this node"),
                              ("lmcache_cpu", 2.08, "would pay at >= 2.46 GB/s (it read 2.08 GB/s)")):
        turns = _h200_turns(mode)
        predicted = predict_turn_s(base, turns, [TierRead("cpu", _cached(mode), rate)], KIB256)
        assert predicted == pytest.approx(_mean_wall(turns), rel=0.25), mode
        assert verdict(rate, line) == words


def test_the_h200s_file_system_tier_read_faster_than_its_disk_the_term_the_model_gets_wrong() -> None:
    """tiered (12 sessions, 73.7% from outside the GPU): priced at the disk's 1.75 GB/s and the
    44.5 GB/s copy, the model predicts 31 s against 23.1 s measured. The turn itself says the tier
    delivered ~2.5 GB/s: part of its 40 GiB came from the page cache, which the rows now count
    (engine_disk_read_gb against engine_file_read_gb)."""
    base = baseline(_h200_turns("hbm_only"))
    assert base is not None
    turns = _h200_turns("tiered")
    on_disk = path_gb_s(1.75, 44.52)
    assert on_disk is not None
    predicted = predict_turn_s(base, turns, [TierRead("fs", _cached("tiered"), on_disk)], KIB256)
    assert predicted == pytest.approx(30.9, abs=0.1) and predicted > 1.25 * _mean_wall(turns)
    reads_s = _mean_wall(turns) - sum(base.compute_s(t) for t in turns) / len(turns)
    delivered = _cached("tiered") * KIB256 / 1e9 / len(turns) / reads_s
    assert 1.75 < delivered == pytest.approx(2.49, abs=0.01)
    # ... which is about the break-even rate: recomputing those 12 revisits would have taken as long.
    recompute = sum(base.compute_s(TurnShape(t.requests, t.uncached_tokens + c, 0, 0))
                    for t, c in zip(turns, (148_784, 154_160, 159_536), strict=True)) / len(turns)
    assert recompute == pytest.approx(_mean_wall(turns), rel=0.03)


def test_the_reference_campaigns_node_a_prediction() -> None:
    """docs/offload.md's worked example, from the reference campaign's published figures: 32
    sessions, 5 revisit turns of ~110.8K-token prompts on average, 114.5 s a turn with HBM only (108-121 s),
    17 s with 200 GiB of host RAM (16-18 s) at 97.7% external hits. KV 32 KiB a token (a hybrid with
    16 full-attention layers of 4 KV heads x 256 in FP8: 2.92M tokens x 32 KiB = 89 GiB, the pool
    one H200 has left at 0.9 after 28.5 GiB of weights). Its host-to-GPU rate was not measured:
    this tool's H200 (44 GB/s) stands in."""
    kv, requests, prompt = 32 * 1024, 32, 100_000 + 2_400 * 4 + 400 * 3
    assert kv * 2_920_000 / 2**30 == pytest.approx(89.1, abs=0.1)
    uncached = requests * prompt  # HBM only: 0.0% hits
    external = 0.977 * uncached
    copy_s = external * kv / 1e9 / 44.0
    # Two runs, two unknowns: 114.5 = 32 o + U / R and 17 = 32 o + (U - external) / R + copy_s.
    rate = external / (114.5 - 17 + copy_s)
    other = (114.5 - uncached / rate) / requests
    assert rate == pytest.approx(34_620, abs=10) and other == pytest.approx(0.377, abs=1e-3)
    line = breakeven_read_gb_s(kv, rate)
    assert line == pytest.approx(1.134, abs=1e-3)
    raid = path_gb_s(13.5, 44.0)  # the RAID's 13.5 GB/s, then the copy from the RAM tier to the GPU
    assert raid == pytest.approx(10.33, abs=0.01) and verdict(raid, line) == "pays on this node"
    base = Baseline(rate, other, 5)
    turn = TurnShape(requests, round(uncached - external), 0, 0)
    predicted = predict_turn_s(base, [turn], [TierRead("fs", round(external), raid)], kv)
    assert predicted == pytest.approx(25.4, abs=0.1)  # against 108-121 s recomputing, 16-18 s from RAM
    # One revisit alone: 3.2 s to recompute its 110.8K tokens, 0.27 s to read its 3.6 GB off the RAID.
    assert prompt / rate == pytest.approx(3.2, abs=0.05)
    assert read_seconds(prompt, kv, 13.5) == pytest.approx(0.269, abs=1e-3)
