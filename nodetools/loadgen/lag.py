"""How late the generator's own event loop runs: the delay it can add to any timestamp it takes.

A first token that reaches the socket while the loop is busy (parsing other streams, writing
records) is timestamped only when the loop gets to it. A task that sleeps ``interval_s`` and
measures how much later it woke up samples exactly that delay, all through the load.

On a shared machine a late wake-up has two causes: the generator's own work, or waiting for a
CPU that another process (the server) holds. The process CPU time used during each interval
bounds the first: ``own`` lateness is the lateness, but at most the CPU the generator used.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["LoopLag"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LoopLag:
    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.own: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t, cpu = time.perf_counter(), time.process_time()
            await asyncio.sleep(self.interval_s)
            late = max(0.0, time.perf_counter() - t - self.interval_s)
            self.samples.append(late)
            self.own.append(min(late, time.process_time() - cpu))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, float | int]:
        """Stop sampling; p50/p99/max lateness in ms, and the same for the generator's own share."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.samples:
            return {"samples": 0}
        out: dict[str, float | int] = {"samples": len(self.samples)}
        for prefix, values in (("", self.samples), ("own_", self.own)):
            ms = [s * 1000 for s in values]
            out.update({f"{prefix}p50_ms": round(_pct(ms, 0.5), 3), f"{prefix}p99_ms": round(_pct(ms, 0.99), 3),
                        f"{prefix}max_ms": round(max(ms), 3)})
        return out
