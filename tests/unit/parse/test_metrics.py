"""Tests for runner.parse.metrics: Prometheus text → samples, counter deltas, per-run hit rates."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runner.errors import ParseError
from runner.parse.metrics import counter_deltas, parse_metrics_text, prefix_cache_run_rates

METRICS = Path(__file__).resolve().parents[2] / "fixtures" / "metrics"


def _load(name: str) -> dict[str, float]:
    return parse_metrics_text((METRICS / name).read_text(encoding="utf-8"))


def test_labelled_samples_are_rendered_like_prometheus() -> None:
    values = _load("vllm_0.24_before.prom")
    assert values['vllm:prefix_cache_hits_total{engine="0",model_name="/tmp/model"}'] == 40000.0
    assert values['python_gc_objects_collected_total{generation="1"}'] == 678.0
    # Label names are sorted, whatever their order in the text ("le" sits between the others).
    bucket = 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="/tmp/model"}'
    assert values[bucket] == 3.0


def test_sums_per_sample_name_keep_total_suffix() -> None:
    values = _load("vllm_0.24_before.prom")
    assert values["vllm:prefix_cache_hits_total"] == 40000.0
    assert values["python_gc_objects_collected_total"] == 12345.0 + 678.0
    assert "vllm:prefix_cache_hits" not in values  # the family name is not a sample name


def test_no_sums_for_buckets_or_created_timestamps() -> None:
    values = _load("vllm_0.24_before.prom")
    assert "vllm:time_to_first_token_seconds_bucket" not in values
    assert "vllm:prefix_cache_queries_created" not in values
    assert values["vllm:time_to_first_token_seconds_count"] == 5.0
    assert values["vllm:time_to_first_token_seconds_sum"] == 0.75


def test_sums_across_engines_and_label_escaping() -> None:
    values = _load("vllm_dp2_engines.prom")
    assert values["vllm:prefix_cache_queries_total"] == 4000.0
    assert values["vllm:prefix_cache_hits_total"] == 2000.0
    key = 'vllm:lora_info{max_lora="1",running_lora_adapters="a\\"b",waiting_lora_adapters=""}'
    assert values[key] == 1.7e9


def test_unlabelled_sample_and_nan_dropped() -> None:
    values = parse_metrics_text("# TYPE up gauge\nup 1\n# TYPE x gauge\nx NaN\n")
    assert values == {"up": 1.0}


def test_summary_quantiles_are_not_summed() -> None:
    text = '# TYPE rpc summary\nrpc{quantile="0.5"} 0.2\nrpc{quantile="0.9"} 0.7\nrpc_count 10\nrpc_sum 3.0\n'
    values = parse_metrics_text(text)
    assert values['rpc{quantile="0.9"}'] == 0.7
    assert "rpc" not in values
    assert values["rpc_count"] == 10.0


def test_invalid_text_raises_parse_error() -> None:
    with pytest.raises(ParseError, match="not Prometheus text exposition") as info:
        parse_metrics_text('vllm:x{engine="0" 1\n', source="node1:/metrics")
    assert info.value.path == "node1:/metrics"


def test_counter_deltas() -> None:
    before = {"a_total": 10.0, "b_total": 5.0}
    after = {"a_total": 25.0, "b_total": 5.0, "c_total": 7.0}
    assert counter_deltas(before, after, ["a_total", "b", "c_total", "d_total"]) == {
        "a_total": 15.0,
        "b": 0.0,  # found under "b_total"
        "c_total": 7.0,  # absent before: counted from 0
    }


def test_counter_reset_uses_after_value(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="runner.parse.metrics"):
        assert counter_deltas({"a_total": 100.0}, {"a_total": 30.0}, ["a_total"]) == {"a_total": 30.0}
    assert "reset" in caplog.text


def test_run_rates_from_vllm_024_scrapes() -> None:
    rates = prefix_cache_run_rates(_load("vllm_0.24_before.prom"), _load("vllm_0.24_after.prom"))
    assert rates == {
        "prefix_cache_hits": 150000.0,
        "prefix_cache_queries": 200000.0,
        "prefix_cache_hit_pct": 75.0,
        "external_prefix_cache_hits": 40000.0,
        "external_prefix_cache_queries": 50000.0,
        "external_prefix_cache_hit_pct": 80.0,
    }


def test_run_rates_from_legacy_gpu_prefix_names() -> None:
    before = _load("vllm_0.9_gpu_prefix_before.prom")
    rates = prefix_cache_run_rates(before, _load("vllm_0.9_gpu_prefix_after.prom"))
    assert rates == {
        "prefix_cache_hits": 3072.0,
        "prefix_cache_queries": 4096.0,
        "prefix_cache_hit_pct": 75.0,
    }


def test_run_rate_omitted_when_no_queries() -> None:
    before = _load("vllm_0.24_after.prom")
    rates = prefix_cache_run_rates(before, before)
    assert rates["prefix_cache_queries"] == 0.0
    assert "prefix_cache_hit_pct" not in rates
    assert "external_prefix_cache_hit_pct" not in rates


def test_run_rates_sum_engines_and_count_from_zero() -> None:
    rates = prefix_cache_run_rates({}, _load("vllm_dp2_engines.prom"))
    assert rates == {
        "prefix_cache_hits": 2000.0,
        "prefix_cache_queries": 4000.0,
        "prefix_cache_hit_pct": 50.0,
    }


def test_run_rates_without_counters() -> None:
    assert prefix_cache_run_rates({}, {"up": 1.0}) == {}
