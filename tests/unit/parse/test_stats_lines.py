"""The periodic stats line read in one match gives what reading it field by field gives."""

from __future__ import annotations

from pathlib import Path

from runner.parse import vllm_log

LOGS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "vllm_logs"
PREFIX = "(APIServer pid=1) INFO 11-29 14:43:27 [loggers.py:273] "


def test_stats_line_in_one_match_agrees_with_the_field_by_field_reading() -> None:
    """Same entry, same key order, for every stats line of the fixtures and the shapes around them."""
    lines = [line for path in sorted(LOGS.rglob("*.log")) for line in path.read_text(errors="replace").splitlines()
             if "Avg prompt throughput" in line]  # fmt: skip
    head = ("Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 3.0 tokens/s, Running: 2 reqs, "
            "Waiting: 0 reqs")
    tail = "GPU KV cache usage: 1.5%, Prefix cache hit rate: 50.0%"
    lines += [
        f"{PREFIX}Engine 001: {head}, Deferred: 4 reqs, {tail}, External prefix cache hit rate: 7.0%, MM cache hit "
        "rate: 1%",
        f"{PREFIX}Engine 000: {head}, {tail}, Running: 9 reqs",  # a repeated field: the last one wins
        f"{PREFIX}{head}, {tail}",  # early V1: no engine prefix
        f"{PREFIX}2 Engines Aggregated: {head}, {tail}",
        f"{PREFIX}Engine 000: {head.replace('Running: 2', 'Running: 2.0')}, {tail}",
        f"{PREFIX}Engine 000: {head}, CPU KV cache usage: 3.0%, {tail}",
    ]
    fast = 0
    for line in map(vllm_log._clean, lines):
        m = vllm_log._vllm_prefix(line)
        assert m is not None, line
        msg, ts = line[m.end() :], m.group("ts")
        one, fields = vllm_log._stats_v1(msg, ts), vllm_log._stats_fields(msg, ts)
        assert fields is not None, line
        if one is not None:
            fast += 1
            assert list(one.items()) == list(fields.items()), line
    assert fast > 100  # all but the aggregated, "2.0", CPU-usage and V0 shapes
