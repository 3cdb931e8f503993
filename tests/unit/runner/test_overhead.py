"""The report's overhead line: the campaign's wall outside its starts' measured windows."""

from __future__ import annotations

import pytest

from runner.overhead import campaign_overhead, overhead_line

RUNS = [{"started": 100.0, "ended": 200.0}, {"started": 300.0}]  # the second was cut short: not counted
RECORDS = [
    {"kind": "startup", "status": "ok", "metrics": {"first_token_s": 40.0, "stop_s": 1.0}},
    {"kind": "startup", "status": "ok", "metrics": {"first_token_s": 30.0, "sleep_http_s": 1.0,
                                                    "wake_to_first_token_s": 0.5, "stop_s": 1.5}},
    {"kind": "startup", "status": "failed", "metrics": {}},
    {"kind": "facts", "status": "ok", "metrics": {}},
]


def test_the_outside_share_counts_ok_starts_and_their_sleep_wake() -> None:
    o = campaign_overhead(RUNS, RECORDS)
    assert (o["wall_s"], o["measured_s"], o["stop_s"], o["trials"]) == (100.0, 71.5, 2.5, 2)
    assert o["outside_fraction"] == pytest.approx(0.285)
    assert o["outside_fraction_stops_measured"] == pytest.approx(0.26)
    assert "28.5% of its 100 s wall" in overhead_line(RUNS, RECORDS)


def test_nothing_measured_says_nothing() -> None:
    assert campaign_overhead(RUNS, RECORDS[2:]) == {} and overhead_line([], RECORDS) == ""
