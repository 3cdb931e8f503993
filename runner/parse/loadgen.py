"""Parse the multi-turn load generator's JSONL (``nodetools.loadgen``) into frames and per-turn figures.

Pure: a file or lines in, pandas out. One record per request attempt; ``final`` marks the attempt
that counts (retries are off by default, so normally every record is final). ``status`` is
``ok``, ``failed`` (with ``error``) or ``not_sent`` (a session abandoned after a failure, or a
stop/cap before its turn). Times: ``t_start``/``t_first_token``/``t_end`` are unix seconds,
``ttft_s``/``latency_s`` seconds measured with a monotonic clock.

Turns are numbered from 0 (the first visit, which every mode prefills from scratch); the turns
from 1 on are the revisits an offload tier can serve.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from runner.errors import ParseError

__all__ = ["REQUEST_COLUMNS", "TURN_COLUMNS", "barrier_violations", "read_requests", "requests_frame",
           "session_context_tokens", "turn_table"]

REQUEST_COLUMNS = ("session", "turn", "attempt", "final", "status", "engine", "error", "http_status", "t_start",
                   "t_first_token", "t_end", "ttft_s", "latency_s", "prompt_tokens", "completion_tokens",
                   "cached_tokens", "content_chunks", "output_chars", "finish_reason", "request_id")
TURN_COLUMNS = ("turn", "requests_ok", "requests_failed", "requests_not_sent", "ttft_median_s", "ttft_p90_s",
                "latency_median_s", "turn_wall_s", "prompt_tokens_mean", "prompt_tokens_sum",
                "completion_tokens_sum", "cached_tokens_sum", "cached_pct")
_STATUSES = {"ok", "failed", "not_sent"}
_NUMERIC = ("session", "turn", "attempt", "engine", "http_status", "t_start", "t_first_token", "t_end", "ttft_s",
            "latency_s", "prompt_tokens", "completion_tokens", "cached_tokens", "content_chunks", "output_chars")


def requests_frame(lines: Iterable[str], source: str = "<jsonl>") -> pd.DataFrame:
    """Records → a frame with every column of :data:`REQUEST_COLUMNS` (NaN/None where absent)."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise ParseError(source, f"line {number}: not JSON: {exc}") from exc
        if not isinstance(record, dict) or record.get("status") not in _STATUSES:
            raise ParseError(source, f"line {number}: not a load-generator record (status must be one of "
                                     f"{sorted(_STATUSES)})")
        for key in ("session", "turn"):
            if not isinstance(record.get(key), int):
                raise ParseError(source, f"line {number}: {key} must be an integer")
        records.append(record)
    frame = pd.DataFrame(records, columns=list(REQUEST_COLUMNS))
    for column in _NUMERIC:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["final"] = frame["final"].fillna(True).astype(bool)
    return frame


def read_requests(path: Path) -> pd.DataFrame:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ParseError(str(path), f"cannot read: {exc.strerror}") from exc
    return requests_frame(text.splitlines(), str(path))


def _final(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["final"]]


def turn_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per turn: counts by status, TTFT median and p90 and latency median of the ok
    requests, the turn's wall time (first request sent to last one finished), tokens, and the
    share of prompt tokens the server reported as cached (``usage``; empty when it did not)."""
    rows = []
    final = _final(frame)
    for turn, group in final.groupby("turn", sort=True):
        ok = group[group["status"] == "ok"]
        sent = frame[(frame["turn"] == turn) & frame["t_start"].notna()]  # every attempt took wall time
        ends = sent["t_end"].where(sent["t_end"].notna(), sent["t_start"] + sent["latency_s"])
        cached = ok["cached_tokens"].dropna()
        prompt_with_cached = ok.loc[cached.index, "prompt_tokens"].sum()
        rows.append({
            "turn": int(turn),
            "requests_ok": len(ok),
            "requests_failed": int((group["status"] == "failed").sum()),
            "requests_not_sent": int((group["status"] == "not_sent").sum()),
            "ttft_median_s": ok["ttft_s"].median() if len(ok) else None,
            "ttft_p90_s": ok["ttft_s"].quantile(0.9) if len(ok) else None,
            "latency_median_s": ok["latency_s"].median() if len(ok) else None,
            "turn_wall_s": (ends.max() - sent["t_start"].min()) if len(sent) else None,
            "prompt_tokens_mean": ok["prompt_tokens"].mean() if len(ok) else None,
            "prompt_tokens_sum": int(ok["prompt_tokens"].sum()) if len(ok) else 0,
            "completion_tokens_sum": int(ok["completion_tokens"].sum()) if len(ok) else 0,
            "cached_tokens_sum": int(cached.sum()) if len(cached) else None,
            "cached_pct": 100.0 * cached.sum() / prompt_with_cached if len(cached) and prompt_with_cached else None,
        })
    table = pd.DataFrame(rows, columns=list(TURN_COLUMNS))
    for column in ("ttft_median_s", "ttft_p90_s", "latency_median_s", "turn_wall_s", "prompt_tokens_mean",
                   "cached_pct"):
        table[column] = pd.to_numeric(table[column], errors="coerce").round(4)
    return table


def barrier_violations(frame: pd.DataFrame) -> list[str]:
    """Requests of turn t+1 sent before every request of turn t had finished (should be none)."""
    sent = frame[frame["t_start"].notna()]
    ends = sent["t_end"].where(sent["t_end"].notna(), sent["t_start"] + sent["latency_s"])
    out = []
    turns = sorted(int(t) for t in sent["turn"].unique())
    for prev, turn in itertools.pairwise(turns):
        last_end = ends[sent["turn"] == prev].max()
        early = sent[(sent["turn"] == turn) & (sent["t_start"] < last_end)]
        out += [f"session {int(r.session)} sent turn {turn} at {r.t_start:.6f}, before turn {prev} ended at "
                f"{last_end:.6f}" for r in early.itertuples()]
    return out


def session_context_tokens(frame: pd.DataFrame) -> int:
    """The live context the load built: per session, its last answered request's prompt plus
    answer tokens (the server's ``usage`` counts), summed over sessions."""
    ok = _final(frame)
    ok = ok[(ok["status"] == "ok") & ok["prompt_tokens"].notna()]
    if ok.empty:
        return 0
    last = ok.sort_values("turn").groupby("session").tail(1)
    return int((last["prompt_tokens"] + last["completion_tokens"].fillna(0)).sum())
