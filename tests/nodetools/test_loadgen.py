"""The multi-turn load generator against real stand-in servers: records, barrier, sizing, failures."""

from __future__ import annotations

import asyncio
import collections
import json
import re
import socket
from pathlib import Path
from typing import Any

from nodetools.loadgen.__main__ import main
from nodetools.loadgen.multiturn import MultiTurnLoad, Workload
from nodetools.loadgen.text import TextSource
from runner.parse.loadgen import barrier_violations, read_requests
from tests.nodetools.conftest import Start, free_port

SMALL = {"sessions": 6, "history_tokens": 1500, "concurrency": 3, "turns": 3, "turn_tokens": 100, "output_tokens": 8}


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(workload: Workload, urls: list[str], out: Path) -> dict[str, Any]:
    return asyncio.run(MultiTurnLoad(workload, urls, "m", out, progress=lambda _line: None).run())


def test_text_is_seeded_varied_and_never_one_repeated_token() -> None:
    a, b = TextSource(1).text(20_000), TextSource(2).text(20_000)
    assert a == TextSource(1).text(20_000)
    assert a[:200] != b[:200]
    words = re.findall(r"\w+", a.lower())
    counts = collections.Counter(words)
    assert len(counts) > 200
    assert counts.most_common(1)[0][1] / len(words) < 0.1
    assert any(ch.isdigit() for ch in a) and "," in a and "." in a


def test_every_request_is_a_record_and_no_turn_starts_before_the_last_ended(standin: Start, tmp_path: Path) -> None:
    server = standin("--max-model-len", "4096")
    out = tmp_path / "requests.jsonl"
    summary = run(Workload(**SMALL), [server.url], out)
    recs = records(out)
    assert summary["counts"] == {"ok": 18, "failed": 0, "not_sent": 0} and summary["stopped"] is None
    assert sorted((r["session"], r["turn"]) for r in recs) == [(s, t) for s in range(6) for t in range(3)]
    # The barrier, straight from the timestamps: every turn t request ended before turn t+1 began.
    for turn in (1, 2):
        last_end = max(r["t_end"] for r in recs if r["turn"] == turn - 1)
        assert min(r["t_start"] for r in recs if r["turn"] == turn) >= last_end
    assert barrier_violations(read_requests(out)) == []
    # Round-robin: each turn visits the sessions in the same order, K at a time.
    for turn in range(3):
        order = [r["session"] for r in sorted((r for r in recs if r["turn"] == turn), key=lambda r: r["t_start"])]
        assert sorted(order[:3]) == [0, 1, 2]
    # Lengths are forced, histories sized by the server's tokenizer, the server's usage recorded.
    assert {r["completion_tokens"] for r in recs} == {8} and {r["finish_reason"] for r in recs} == {"length"}
    assert 1500 - 8 <= summary["setup"]["history_tokens_min"] <= summary["setup"]["history_tokens_max"] <= 1500 + 8
    turn0 = [r["prompt_tokens"] for r in recs if r["turn"] == 0]
    assert all(1550 < p < 1700 for p in turn0), turn0
    assert all(r["cached_tokens"] is not None and r["ttft_s"] <= r["latency_s"] for r in recs)
    assert summary["loop_lag_ms"]["samples"] > 0


def test_a_refused_request_is_a_failed_record_and_abandons_its_session(standin: Start, tmp_path: Path) -> None:
    # 1,500 + 300 fits 2,048 tokens; the next turn's prompt does not: HTTP 400 from the server.
    server = standin("--max-model-len", "2048")
    out, summary = tmp_path / "requests.jsonl", tmp_path / "summary.json"
    rc = main(["run", "--url", server.url, "--model", "m", "--out", str(out), "--summary", str(summary),
               "--sessions", "2", "--history-tokens", "1500", "--turns", "3", "--turn-tokens", "300",
               "--output-tokens", "8", "--concurrency", "2"])
    assert rc == 1
    by_key = {(r["session"], r["turn"]): r for r in records(out)}
    assert len(by_key) == 6
    assert by_key[(0, 0)]["status"] == "ok"
    failed = by_key[(0, 1)]
    assert failed["status"] == "failed" and failed["http_status"] == 400
    assert "maximum context length is 2048 tokens" in failed["error"]
    skipped = by_key[(0, 2)]
    assert skipped["status"] == "not_sent" and skipped["error"].startswith("session abandoned: its turn 1 failed")
    assert json.loads(summary.read_text())["counts"] == {"ok": 2, "failed": 2, "not_sent": 2}


def test_wall_time_cap_stops_the_load_and_records_where(standin: Start, tmp_path: Path) -> None:
    server = standin("--max-model-len", "4096", env={"STANDIN_DECODE_S_PER_TOKEN": "0.05"})
    out = tmp_path / "requests.jsonl"
    workload = Workload(sessions=4, history_tokens=300, concurrency=2, turns=2, turn_tokens=50, output_tokens=40,
                        max_wall_s=1.0)
    summary = run(workload, [server.url], out)
    assert summary["stopped"] == "wall-time cap of 1 s reached during turn 0 (0 turns complete)"
    recs = records(out)
    assert len(recs) == 8  # every planned request has its record
    in_flight = [r for r in recs if r["status"] == "failed"]
    assert len(in_flight) == 2 and all(r["error"].startswith("stopped: wall-time cap of 1 s") for r in in_flight)
    assert {r["status"] for r in recs} == {"failed", "not_sent"}
    assert summary["load_wall_s"] < 3


def test_a_server_that_is_gone_fails_every_request_fast_and_retries_are_recorded(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # held, never listening: connections are refused
        workload = Workload(sessions=2, history_tokens=0, turns=2, turn_tokens=0, output_tokens=4, retries=1)
        url = f"http://127.0.0.1:{port}"
        load = MultiTurnLoad(workload, [url], "m", tmp_path / "r.jsonl", progress=lambda _line: None)
        recs_summary = asyncio.run(_run_without_setup(load))
    recs = records(tmp_path / "r.jsonl")
    first = [r for r in recs if r["turn"] == 0]
    attempts = sorted((r["session"], r["attempt"], r["final"]) for r in first)
    assert attempts == [(0, 1, False), (0, 2, True), (1, 1, False), (1, 2, True)]
    assert all(r["status"] == "failed" and "Cannot connect" in r["error"] for r in first)
    assert [r["status"] for r in recs if r["turn"] == 1] == ["not_sent", "not_sent"]
    assert recs_summary["counts"] == {"ok": 0, "failed": 2, "not_sent": 2}


async def _run_without_setup(load: MultiTurnLoad) -> dict[str, Any]:
    """Drive a load whose sessions need no /tokenize (no server to size them with)."""
    import aiohttp

    from nodetools.loadgen.client import Conversation
    from nodetools.loadgen.multiturn import _Session

    load.sessions = [_Session(i, f"{load.urls[0]}/v1/chat/completions", 0, Conversation(), ["Hello."] * 2, 0, [0, 0])
                     for i in range(2)]
    async with aiohttp.ClientSession() as http:
        with load.out.open("w") as fh:
            load._fh = fh
            return await load._drive(http, {}, None, None)
