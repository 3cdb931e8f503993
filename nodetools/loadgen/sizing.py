"""Texts sized in tokens with the server's own ``/tokenize`` (vLLM's and the stand-in's).

Counting with the server means counting with the model's tokenizer and chat template, whatever
the model is, without installing a tokenizer on the node. A text is first cut to the length a
characters-per-token estimate predicts, then trimmed or extended at word boundaries until the
server's count is within a small tolerance; every count is one ``/tokenize`` call, all before
the load's clock starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from nodetools.loadgen.client import get_json
from nodetools.loadgen.text import TextSource

__all__ = ["ServerTokenizer", "SizedHistory", "build_history", "sized_text"]

_MAX_ROUNDS = 6


class ServerTokenizer:
    """Counts tokens with ``POST /tokenize``; learns characters per token as it goes."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        self.session = session
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        self.calls = 0
        self._chars = 0
        self._tokens = 0

    @property
    def tokens_per_char(self) -> float:
        return self._tokens / self._chars if self._chars else 0.25  # English BPE: ~4 chars per token

    async def _count(self, payload: dict[str, Any], chars: int) -> int:
        body = await get_json(self.session, self.url, {"model": self.model, **payload})
        self.calls += 1
        count = int(body["count"])
        self._chars += chars
        self._tokens += count
        return count

    async def count_text(self, text: str) -> int:
        return await self._count({"prompt": text, "add_special_tokens": False}, len(text))

    async def count_messages(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> int:
        chars = sum(len(m["content"]) for m in messages)
        return await self._count({"messages": messages, "add_generation_prompt": add_generation_prompt}, chars)


def _cut(text: str, chars: int) -> str:
    """``text`` shortened to at most ``chars`` characters, at a word boundary."""
    if len(text) <= chars:
        return text
    head = text[:max(1, chars)]
    return head.rsplit(" ", 1)[0] if " " in head else head


async def sized_text(tok: ServerTokenizer, source: TextSource, tokens: int, tolerance: float = 0.02) -> tuple[str, int]:
    """About ``tokens`` tokens of text (within ``tolerance``): (text, counted tokens)."""
    text = _cut(source.text(int(tokens / tok.tokens_per_char) + 64), int(tokens / tok.tokens_per_char))
    count = await tok.count_text(text)
    for _ in range(_MAX_ROUNDS):
        if abs(count - tokens) <= max(2, tokens * tolerance):
            break
        chars = int((tokens - count) / tok.tokens_per_char)
        text = _cut(text, len(text) + chars) if chars < 0 else text + " " + _cut(source.text(chars), chars)
        count = await tok.count_text(text)
    return text, count


def _shorten(messages: list[dict[str, str]], chars: int, keep: int = 40) -> None:
    """Take ``chars`` characters off the end of the conversation: from the last message down to
    ``keep`` characters, then from the one before it (a first estimate of characters per token can
    overshoot by more than the last message holds)."""
    for message in reversed(messages):
        if chars <= 0:
            return
        content = message["content"]
        take = min(chars, len(content) - keep)
        if take > 0:
            message["content"] = _cut(content, len(content) - take)
            chars -= take


@dataclass
class SizedHistory:
    messages: list[dict[str, str]]
    tokens: int  # the server's count of the rendered chat (no generation prompt)


async def build_history(tok: ServerTokenizer, source: TextSource, tokens: int, exchange_tokens: int = 2000,
                        tolerance: float = 0.002) -> SizedHistory:
    """A prior conversation of about ``tokens`` tokens: user/assistant exchanges ending with the
    assistant, so the first turn's question follows naturally."""
    if tokens <= 0:
        return SizedHistory([], 0)
    per_char = tok.tokens_per_char
    messages: list[dict[str, str]] = []
    planned = 0.0
    while planned < tokens:
        for role, share in (("user", 0.7), ("assistant", 0.3)):
            chars = max(40, int(min(exchange_tokens * share, tokens - planned + 8) / per_char))
            messages.append({"role": role, "content": _cut(source.text(chars), chars)})
            planned += chars * per_char
    count = await tok.count_messages(messages, add_generation_prompt=False)
    for _ in range(_MAX_ROUNDS):
        if abs(count - tokens) <= max(8, tokens * tolerance):
            break
        chars = int((tokens - count) / tok.tokens_per_char)
        last = messages[-1]["content"]
        if chars < 0 and len(last) + chars < 40 and len(messages) > 2:
            messages = messages[:-2]  # drop the last exchange; the next round extends what is left
        elif chars < 0:
            _shorten(messages, -chars)
        else:
            messages[-1]["content"] = last + " " + _cut(source.text(chars), chars)
        count = await tok.count_messages(messages, add_generation_prompt=False)
    return SizedHistory(messages, count)
