"""The offload load's shape and its arithmetic: one source for the runner and the node.

The load generator runs these dataclasses on the node; the runner builds its campaign parameters
from their defaults and sizes a trial with the same functions, so a default or a context length
is written once. Stdlib only: the runner imports this module (nodetools never import the runner).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_FAILED_REQUESTS", "QUESTION_TOKENS", "QualitySpec", "Workload", "known_fields",
           "request_context_tokens", "with_chat_template"]

# More failed or unsent requests than this fail the trial (the runner's default; off: every
# planned request must be answered).
MAX_FAILED_REQUESTS = 0
# What one quality question adds to its conversation, besides its answer's own tokens. The longest
# question (the first: two made-up depot names and the ANSWER instruction, 172 characters) is 88
# tokens with the qwen3-tiny rehearsal tokenizer (1,024 tokens: the most tokens per character of
# any preset) and 72 with the 8,192-token presets' (measured over 10 seeds x 16 conversations);
# the chat-template markers of the question and of its answer add 6 each: at most 100, so 128.
# tests/nodetools/test_quality.py measures the questions against this budget.
QUESTION_TOKENS = 128


@dataclass(frozen=True)
class Workload:
    """The multi-turn load's shape; the defaults are the reference campaign's (32 sessions of
    ~100K-token histories, 8 in flight, 6 turns of +2,400 tokens and 400 forced output tokens)."""

    sessions: int = 32
    history_tokens: int = 100_000
    concurrency: int = 8
    turns: int = 6
    turn_tokens: int = 2_400
    output_tokens: int = 400
    seed: int = 0
    request_timeout_s: float = 600.0
    max_wall_s: float = 2400.0  # the reference campaign's LMCache run hit its 40 minutes in turn 4
    retries: int = 0
    exchange_tokens: int = 2_000  # size of the synthetic earlier exchanges a history is made of

    def problems(self) -> list[str]:
        out = [f"{name} must be >= 1" for name in ("sessions", "concurrency", "turns", "output_tokens")
               if getattr(self, name) < 1]
        out += [f"{name} must be >= 0" for name in ("history_tokens", "turn_tokens", "retries")
                if getattr(self, name) < 0]
        out += [f"{name} must be > 0" for name in ("request_timeout_s", "max_wall_s") if getattr(self, name) <= 0]
        return out

    def context_tokens(self) -> int:
        """About how long each session's context is once its last turn is answered."""
        return self.history_tokens + self.turns * (self.turn_tokens + self.output_tokens)

    def working_set_tokens(self) -> int:
        """The live context of all sessions after the last turn: what the KV tiers must hold."""
        return self.sessions * self.context_tokens()


@dataclass(frozen=True)
class QualitySpec:
    """The quality check: 8 conversations x 3 questions (the reference campaign's 24) over one
    shared document."""

    conversations: int = 8
    turns: int = 3  # questions per conversation
    doc_tokens: int = 6000
    seed: int = 0
    max_tokens: int = 256
    request_timeout_s: float = 300.0
    concurrency: int = 4

    def context_tokens(self) -> int:
        """The longest conversation: the document, then every question and its longest answer."""
        return self.doc_tokens + self.turns * (QUESTION_TOKENS + self.max_tokens)


def request_context_tokens(workload: Workload, quality: QualitySpec | None) -> int:
    """The longest request the trial sends (prompt and output), before the chat template."""
    return max(workload.context_tokens(), quality.context_tokens() if quality is not None else 0)


def with_chat_template(tokens: int) -> int:
    """A request's length with the chat template's markers around its messages: 1% and 32 tokens
    more, what the preflight compares with max-model-len (0 stays 0: nothing is sent)."""
    return int(tokens * 1.01) + 32 if tokens else 0


def known_fields(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that the dataclass ``cls`` takes: a campaign's parameters carry more."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}
