"""One request inside the stand-in's engine: its tokens, the KV blocks it holds, what it streams back.

The scheduler (:mod:`nodetools.standin.engine`) moves it through its states; the API handlers read
its ``events`` queue, one generated text piece at a time.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from nodetools.standin.textgen import AnswerGenerator

__all__ = ["EngineRequest", "RequestState"]


class RequestState(enum.Enum):
    WAITING = "waiting"
    LOADING = "loading"  # waiting for external KV blocks
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    eos_id: int
    natural_len: int
    gen: AnswerGenerator
    arrival: float
    hashes: list[int]
    prompt_blocks: int
    # (text piece, finish reason or None); an abort arrives as ("", "abort").
    events: asyncio.Queue[tuple[str, str | None]] = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    committed: int = 0  # blocks [0, committed) are computed and committed
    held: list[int] = field(default_factory=list)  # cached blocks this request holds a reference to
    private: int = 0
    state: RequestState = RequestState.WAITING
    pending_ext: list[int] = field(default_factory=list)
    load_task: asyncio.Task[None] | None = None
    cached_tokens: int | None = None
    gpu_hit_tokens: int = 0
    ext_hit_tokens: int = 0
    first_token_at: float | None = None
    finish_reason: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_slice(self, start: int, stop: int) -> list[int]:
        p = len(self.prompt_ids)
        if stop <= p:
            return self.prompt_ids[start:stop]
        if start >= p:
            return self.output_ids[start - p:stop - p]
        return self.prompt_ids[start:] + self.output_ids[:stop - p]
