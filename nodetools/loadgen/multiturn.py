"""The multi-turn chat load: N sessions with long histories, K requests in flight, T turns.

Every turn appends about ``turn_tokens`` tokens of new user text to each session's history and
asks for exactly ``output_tokens`` tokens (``min_tokens`` + ``ignore_eos``). A barrier makes every
session finish turn t before any starts turn t+1, and sessions are visited in the same order every
turn (round-robin), so a session's blocks are as old as possible when it comes back: the access
pattern that defeats an LRU prefix cache once the working set exceeds it.

One JSONL record per request, failed ones included, written as each finishes. A session whose
request fails is abandoned for its remaining turns (its history would no longer be the one the
other modes saw); those turns are ``not_sent`` records with the reason, as are the turns a stop
(``stop`` event, wall-time cap) prevented. Retries are off by default; with ``retries`` > 0 each
failed attempt is its own record (``final: false``).

Turns are numbered from 0: turn 0 is the first visit, which every mode must prefill from
scratch; turns 1.. are the revisits an offload tier can serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from nodetools.loadgen.client import Conversation, Result, stream_chat
from nodetools.loadgen.lag import LoopLag
from nodetools.loadgen.sizing import ServerTokenizer, build_history, sized_text
from nodetools.loadgen.text import TextSource
from nodetools.loadgen.workload import Workload

__all__ = ["MultiTurnLoad", "Workload"]


@dataclass
class _Session:
    index: int
    url: str
    engine: int
    conversation: Conversation
    turn_texts: list[str]
    history_tokens: int
    turn_token_counts: list[int]
    abandoned: str | None = None


@dataclass
class _State:
    turn: int = -1
    turns_done: int = 0
    stop_reason: str | None = None
    first_failed_turn: int | None = None
    recorded: set[tuple[int, int]] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0, "not_sent": 0})


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # noqa: T201 - a node-side program: stderr is its progress


class MultiTurnLoad:
    """Drives one ``Workload`` against one or more engine copies (``urls``) of one model."""

    def __init__(self, workload: Workload, urls: list[str], model: str, out: Path,
                 progress: Callable[[str], None] = _stderr) -> None:
        if not urls:
            raise ValueError("at least one server URL is needed")
        problems = workload.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.w = workload
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.out = out
        self.progress = progress
        self.state = _State()
        self.sessions: list[_Session] = []
        self._fh: IO[str] | None = None

    # --- setup ---------------------------------------------------------------------------------

    async def _build_session(self, tok: ServerTokenizer, index: int) -> _Session:
        w = self.w
        source = TextSource(f"{w.seed}:{index}")
        history = await build_history(tok, source, w.history_tokens, w.exchange_tokens)
        conversation = Conversation()
        for message in history.messages:
            conversation.append(message["role"], message["content"])
        texts, counts = [], []
        for _ in range(w.turns):
            text, count = await sized_text(tok, source, w.turn_tokens) if w.turn_tokens else ("Go on.", 0)
            texts.append(text)
            counts.append(count)
        engine = index % len(self.urls)
        return _Session(index, f"{self.urls[engine]}/v1/chat/completions", engine, conversation, texts,
                        history.tokens, counts)

    async def _setup(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        t0 = time.perf_counter()
        tok = ServerTokenizer(session, self.urls[0], self.model)
        # One session first, alone: it calibrates characters per token for all the others.
        first = await self._build_session(tok, 0)
        limit = asyncio.Semaphore(4)

        async def build(i: int) -> _Session:
            async with limit:
                return await self._build_session(tok, i)

        rest = await asyncio.gather(*(build(i) for i in range(1, self.w.sessions)))
        self.sessions = [first, *rest]
        histories = [s.history_tokens for s in self.sessions]
        turn_counts = [c for s in self.sessions for c in s.turn_token_counts]
        return {"setup_s": round(time.perf_counter() - t0, 3), "tokenize_calls": tok.calls,
                "chars_per_token": round(1 / tok.tokens_per_char, 3),
                "history_tokens_min": min(histories), "history_tokens_max": max(histories),
                "history_tokens_mean": round(statistics.fmean(histories), 1),
                "turn_tokens_mean": round(statistics.fmean(turn_counts), 1) if turn_counts else 0}

    # --- records -------------------------------------------------------------------------------

    def _write(self, session: _Session, turn: int, status: str, fields: dict[str, Any], attempt: int = 1,
               final: bool = True) -> None:
        record = {"session": session.index, "turn": turn, "attempt": attempt, "final": final, "status": status,
                  "engine": session.engine, **fields}
        assert self._fh is not None
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        if final:
            self.state.recorded.add((session.index, turn))
            self.state.counts[status] += 1
            if status == "failed" and self.state.first_failed_turn is None:
                self.state.first_failed_turn = turn

    def _not_sent(self, session: _Session, turn: int, reason: str) -> None:
        self._write(session, turn, "not_sent", {"error": reason}, attempt=0)

    # --- the load ------------------------------------------------------------------------------

    async def _request(self, http: aiohttp.ClientSession, s: _Session, turn: int) -> Result | None:
        if s.abandoned:
            self._not_sent(s, turn, s.abandoned)
            return None
        w = self.w
        s.conversation.append("user", s.turn_texts[turn])
        body = s.conversation.body(self.model, w.output_tokens, min_tokens=w.output_tokens, ignore_eos=True)
        result: Result | None = None
        for attempt in range(1, w.retries + 2):
            t_start = time.time()
            try:
                result = await stream_chat(http, s.url, body, w.request_timeout_s)
            except asyncio.CancelledError:
                self._write(s, turn, "failed", {"error": f"stopped: {self.state.stop_reason or 'cancelled'}",
                                                "t_start": round(t_start, 6),
                                                "latency_s": round(time.time() - t_start, 6)}, attempt)
                raise
            final = result.ok or attempt == w.retries + 1 or not _retryable(result)
            fields = result.record()
            fields.pop("ok")
            self._write(s, turn, "ok" if result.ok else "failed", fields, attempt, final)
            if final:
                break
        assert result is not None
        if result.ok:
            s.conversation.append("assistant", result.text)
        else:
            s.conversation.pop()
            s.abandoned = f"session abandoned: its turn {turn} failed ({result.error})"
        return result

    async def _turns(self, http: aiohttp.ClientSession) -> None:
        for turn in range(self.w.turns):
            self.state.turn = turn
            t0 = time.perf_counter()
            queue = list(self.sessions)  # the same order every turn: round-robin
            results: list[Result] = []

            async def worker(queue: list[_Session] = queue, turn: int = turn, results: list[Result] = results) -> None:
                while queue:
                    result = await self._request(http, queue.pop(0), turn)
                    if result is not None:
                        results.append(result)

            await asyncio.gather(*(worker() for _ in range(min(self.w.concurrency, len(queue)))))
            self.state.turns_done = turn + 1
            ok = [r for r in results if r.ok]
            ttfts = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
            median = f"{statistics.median(ttfts):.3f} s" if ttfts else "-"
            self.progress(f"turn {turn}/{self.w.turns - 1}: {len(ok)} ok, {len(results) - len(ok)} failed, "
                          f"median TTFT {median}, wall {time.perf_counter() - t0:.2f} s")

    async def run(self, stop: asyncio.Event | None = None, stop_reason: Callable[[], str] | None = None
                  ) -> dict[str, Any]:
        """Size the texts, run every turn, and return the summary (also on a stop or the cap)."""
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
            setup = await self._setup(http)
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with self.out.open("w", buffering=1) as fh:
                self._fh = fh
                return await self._drive(http, setup, stop, stop_reason)

    async def _drive(self, http: aiohttp.ClientSession, setup: dict[str, Any], stop: asyncio.Event | None,
                     stop_reason: Callable[[], str] | None) -> dict[str, Any]:
        lag = LoopLag()
        lag.start()
        cpu0, t_wall0, t0 = time.process_time(), time.time(), time.perf_counter()
        turns = asyncio.create_task(self._turns(http))
        waiters = {turns}
        stopper = asyncio.create_task(stop.wait()) if stop is not None else None
        if stopper is not None:
            waiters.add(stopper)
        try:
            done, _ = await asyncio.wait(waiters, timeout=self.w.max_wall_s, return_when=asyncio.FIRST_COMPLETED)
            if turns not in done:
                turn = self.state.turn
                if stopper is not None and stopper in done:
                    self.state.stop_reason = (stop_reason() if stop_reason else "stopped") + f" during turn {turn}"
                else:
                    self.state.stop_reason = (f"wall-time cap of {self.w.max_wall_s:g} s reached during turn "
                                              f"{turn} ({self.state.turns_done} turns complete)")
                turns.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await turns
            else:
                turns.result()  # a bug in the load must surface, not become a quiet summary
        finally:
            if stopper is not None:
                stopper.cancel()
            lag_summary = await lag.stop()
        wall = time.perf_counter() - t0
        reason = self.state.stop_reason
        for s in self.sessions:
            for turn in range(self.w.turns):
                if (s.index, turn) not in self.state.recorded:
                    self._not_sent(s, turn, f"not sent: {reason}")
        if reason:
            self.progress(f"load stopped: {reason}")
        return {
            "workload": asdict(self.w), "urls": self.urls, "model": self.model, "setup": setup,
            "t_load_start": round(t_wall0, 6), "load_wall_s": round(wall, 3),
            "turns_completed": self.state.turns_done, "stopped": reason, "counts": dict(self.state.counts),
            "first_failed_turn": self.state.first_failed_turn,
            "client_cpu_s": round(time.process_time() - cpu0, 3), "loop_lag_ms": lag_summary,
        }


def _retryable(result: Result) -> bool:
    """Connection failures, 429 and 5xx are worth another attempt; a timeout already waited enough."""
    if result.http_status is None:
        return not (result.error or "").startswith("timeout")
    return result.http_status == 429 or result.http_status >= 500
