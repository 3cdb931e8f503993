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


def test_a_snapshot_trial_measures_its_start_sleep_dump_staging_and_every_restore() -> None:
    metrics = {"first_token_s": 50.0, "sleep_s": 1.0, "dump_s": 4.0, "stage_s": 4.0, "stop_s": 0.0,
               "restore_dropped_to_first_token_s": 7.0, "restore_warm_to_first_token_s": 5.0,
               "restore_to_first_token_s": 7.0}  # the primary restore, already among the two
    runs, records = [{"started": 0.0, "ended": 100.0}], [{"kind": "snapshot", "status": "ok", "metrics": metrics}]
    o = campaign_overhead(runs, records)
    assert o["measured_s"] == 71.0 and o["outside_fraction"] == pytest.approx(0.29)
    assert "1 ok trials' measured windows and stages" in overhead_line(runs, records)


def test_a_modes_own_preparation_is_measured_and_a_stopped_trial_is_the_stops_loss() -> None:
    runs = [{"started": 0.0, "ended": 100.0, "interrupted": True}]
    records = [{"kind": "startup", "status": "ok", "metrics": {"first_token_s": 40.0, "bytecode_compile_s": 10.0}},
               {"kind": "startup", "status": "interrupted", "duration_s": 30.0, "metrics": {}}]
    o = campaign_overhead(runs, records)
    assert (o["wall_s"], o["measured_s"], o["cut_s"]) == (70.0, 50.0, 30.0)
    assert "30 s of trials cut short by a stop are left out" in overhead_line(runs, records)
    # A run that never ended (a crash) is not in the wall: its cut trial is not taken from it.
    crashed = [{"started": 0.0, "ended": 100.0}, {"started": 200.0}]
    assert campaign_overhead(crashed, records)["wall_s"] == 100.0
