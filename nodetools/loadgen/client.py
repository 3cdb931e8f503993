"""One streaming chat request, timed from the moment its bytes leave to its first content token.

A conversation's messages are JSON-encoded once, when they are appended (``Conversation``), so
a 100K-token request body is a join of cached bytes: the generator's event loop never spends
milliseconds serialising a long history while other streams wait for their first token.

``stream_chat`` never raises for a failed request: an HTTP error, a timeout, a connection the
server dropped, or a stream that ended before ``[DONE]`` all come back as a ``Result`` with
``ok=False`` and the error in words.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["Conversation", "Result", "get_json", "stream_chat"]

_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class Conversation:
    """A chat history as pre-encoded JSON message objects."""

    def __init__(self) -> None:
        self.messages: list[dict[str, str]] = []
        self._encoded: list[bytes] = []

    def append(self, role: str, content: str) -> None:
        message = {"role": role, "content": content}
        self.messages.append(message)
        self._encoded.append(_ENCODE(message).encode())

    def pop(self) -> None:
        self.messages.pop()
        self._encoded.pop()

    def body(self, model: str, max_tokens: int, *, min_tokens: int = 0, ignore_eos: bool = False,
             temperature: float | None = None) -> bytes:
        """The request body: streaming, with the final usage chunk, lengths forced when asked."""
        params: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True},
                                  "max_tokens": max_tokens}
        if min_tokens:
            params["min_tokens"] = min_tokens
        if ignore_eos:
            params["ignore_eos"] = True
        if temperature is not None:
            params["temperature"] = temperature
        parts = [_ENCODE(params).encode()[:-1], b',"messages":[']
        for i, message in enumerate(self._encoded):
            parts.extend((b"," if i else b"", message))
        parts.append(b"]}")
        return b"".join(parts)  # one copy of the (long) history, not several


@dataclass
class Result:
    ok: bool
    t_start: float  # unix seconds when the request was sent
    error: str | None = None
    http_status: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    content_chunks: int = 0
    finish_reason: str | None = None
    request_id: str | None = None
    text: str = ""
    pieces: list[str] = field(default_factory=list, repr=False)

    def record(self) -> dict[str, Any]:
        """The JSONL fields of this result (the text itself is not recorded: it can be long)."""
        return {
            "ok": self.ok, "error": self.error, "http_status": self.http_status,
            "t_start": round(self.t_start, 6),
            "t_first_token": None if self.ttft_s is None else round(self.t_start + self.ttft_s, 6),
            "t_end": None if self.latency_s is None else round(self.t_start + self.latency_s, 6),
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 6),
            "latency_s": None if self.latency_s is None else round(self.latency_s, 6),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens, "content_chunks": self.content_chunks,
            "output_chars": len(self.text), "finish_reason": self.finish_reason, "request_id": self.request_id,
        }


def _usage(result: Result, usage: dict[str, Any]) -> None:
    result.prompt_tokens = usage.get("prompt_tokens")
    result.completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        result.cached_tokens = int(details["cached_tokens"])


def _chunk(result: Result, payload: bytes, t0: float) -> str | None:
    """Apply one SSE data payload; returns an error text when the server sent one."""
    try:
        event = json.loads(payload)
    except ValueError:
        return f"unparseable stream chunk: {payload[:120]!r}"
    if not isinstance(event, dict):
        return f"unexpected stream chunk: {payload[:120]!r}"
    if "error" in event:
        err = event["error"]
        return f"server error in stream: {err.get('message', err) if isinstance(err, dict) else err}"
    result.request_id = result.request_id or event.get("id")
    for choice in event.get("choices") or ():
        content = (choice.get("delta") or {}).get("content")
        if content:
            if result.ttft_s is None:
                result.ttft_s = time.perf_counter() - t0
            result.content_chunks += 1
            result.pieces.append(content)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
    if event.get("usage"):
        _usage(result, event["usage"])
    return None


async def stream_chat(session: aiohttp.ClientSession, url: str, body: bytes, timeout_s: float) -> Result:
    """POST a streaming chat completion to ``url`` and time it; failures are results, not raises.

    ``asyncio.CancelledError`` (a stop or a wall-time cap) propagates: the caller records it.
    """
    t_wall = time.time()
    t0 = time.perf_counter()
    result = Result(ok=False, t_start=t_wall)
    done = False
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            result.http_status = resp.status
            if resp.status != 200:
                text = (await resp.text(errors="replace")).strip()
                result.error = f"HTTP {resp.status}: {_error_message(text)}"
                return _finish(result, t0)
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    break
                error = _chunk(result, payload, t0)
                if error is not None:
                    result.error = error
                    return _finish(result, t0)
    except TimeoutError:
        result.error = f"timeout: no complete answer within {timeout_s:g} s"
        return _finish(result, t0)
    except aiohttp.ClientError as exc:
        result.error = f"{type(exc).__name__}: {exc}".strip()
        return _finish(result, t0)
    if not done:
        result.error = "stream ended before [DONE] (the server closed the connection)"
    elif result.finish_reason not in ("stop", "length"):
        result.error = f"finish_reason {result.finish_reason!r} (the server aborted the request)"
    else:
        result.ok = True
    return _finish(result, t0)


def _finish(result: Result, t0: float) -> Result:
    result.latency_s = time.perf_counter() - t0
    result.text = "".join(result.pieces)
    return result


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))[:300]
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])[:300]
    return text[:300]


async def get_json(session: aiohttp.ClientSession, url: str, payload: dict[str, Any] | None = None,
                   timeout_s: float = 120) -> Any:
    """GET (or POST ``payload``) and decode JSON; raises on HTTP errors (setup, not measurement)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    if payload is None:
        async with session.get(url, timeout=timeout) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)
    async with session.post(url, json=payload, timeout=timeout) as resp:
        if resp.status != 200:
            raise RuntimeError(f"POST {url}: HTTP {resp.status}: {_error_message(await resp.text())}")
        return await resp.json(content_type=None)

