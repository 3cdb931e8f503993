"""The load generator's JSONL: frames, per-turn figures, the barrier check, the live context."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from runner.errors import ParseError
from runner.parse.loadgen import barrier_violations, requests_frame, session_context_tokens, turn_table


def rec(session: int, turn: int, t0: float, ttft: float, latency: float, status: str = "ok", **extra: Any) -> str:
    base: dict[str, Any] = {"session": session, "turn": turn, "attempt": 1, "final": True, "status": status,
                            "engine": 0, "error": None}
    if status != "not_sent":
        base.update(t_start=t0, t_first_token=t0 + ttft, t_end=t0 + latency, ttft_s=ttft, latency_s=latency,
                    prompt_tokens=1000 + 100 * turn, completion_tokens=10, cached_tokens=900 * turn)
    base.update(extra)
    return json.dumps(base)


LINES = [
    rec(0, 0, 100.0, 1.0, 2.0), rec(1, 0, 100.5, 2.0, 3.0),        # turn 0 ends at 103.5
    rec(0, 1, 103.6, 0.2, 1.0), rec(1, 1, 103.7, 0.4, 1.2),        # turn 1 ends at 104.9
    rec(0, 2, 105.0, 0.1, 0.5),
    rec(1, 2, 105.0, 0.3, 0.4, status="failed", error="HTTP 500: boom", completion_tokens=None, cached_tokens=None),
]


def test_turns_summarise_ok_requests_and_count_the_rest() -> None:
    table = turn_table(requests_frame(LINES)).set_index("turn")
    assert list(table.index) == [0, 1, 2]
    assert table.loc[0, "ttft_median_s"] == 1.5 and table.loc[0, "turn_wall_s"] == 3.5
    assert table.loc[1, "ttft_median_s"] == pytest.approx(0.3) and table.loc[1, "turn_wall_s"] == pytest.approx(1.3)
    assert table.loc[1, "cached_pct"] == pytest.approx(100 * 1800 / 2200, abs=1e-3)
    assert table.loc[2, "requests_ok"] == 1 and table.loc[2, "requests_failed"] == 1
    assert table.loc[2, "ttft_median_s"] == pytest.approx(0.1)
    assert table.loc[0, "completion_tokens_sum"] == 20


def test_the_barrier_holds_and_a_violation_is_named() -> None:
    assert barrier_violations(requests_frame(LINES)) == []
    early = [*LINES, rec(2, 1, 103.0, 0.1, 0.2)]  # sent before turn 0 finished at 103.5
    (violation,) = barrier_violations(requests_frame(early))
    assert violation == "session 2 sent turn 1 at 103.000000, before turn 0 ended at 103.500000"


def test_not_sent_and_retried_requests() -> None:
    lines = [rec(0, 0, 10.0, 0.5, 1.0, status="failed", error="ServerDisconnectedError", final=False),
             rec(0, 0, 11.0, 0.5, 1.0, attempt=2),
             rec(0, 1, 0, 0, 0, status="not_sent", error="not sent: wall-time cap")]
    table = turn_table(requests_frame(lines)).set_index("turn")
    assert table.loc[0, "requests_ok"] == 1 and table.loc[0, "requests_failed"] == 0  # only the final attempt counts
    assert table.loc[0, "turn_wall_s"] == 2.0  # but every attempt took wall time
    assert table.loc[1, "requests_not_sent"] == 1 and math.isnan(table.loc[1, "ttft_median_s"])


def test_live_context_is_each_sessions_last_answered_request() -> None:
    # Session 0: turn 2 prompt 1200 + 10; session 1: its last ok is turn 1, 1100 + 10.
    assert session_context_tokens(requests_frame(LINES)) == 1210 + 1110


def test_bad_lines_are_parse_errors_with_their_line() -> None:
    with pytest.raises(ParseError, match="line 2: not JSON"):
        requests_frame([LINES[0], "{oops"], "r.jsonl")
    with pytest.raises(ParseError, match="line 1: not a load-generator record"):
        requests_frame([json.dumps({"session": 0, "turn": 0, "status": "weird"})])
    with pytest.raises(ParseError, match="line 1: turn must be an integer"):
        requests_frame([json.dumps({"session": 0, "turn": "1", "status": "ok"})])
