"""Server-sent events for ``"stream": true``: one ``data:`` event per piece, then ``data: [DONE]``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from nodetools.standin.protocol import ChunkTemplate, GenRequest, chat_chunk, completion_chunk, usage_chunk
from nodetools.standin.request import EngineRequest
from nodetools.standin.responses import dumps

__all__ = ["stream_events"]

UsageOf = Callable[[list[EngineRequest]], dict[str, Any]]


async def stream_events(request: web.Request, gen: GenRequest, reqs: list[EngineRequest], model: str,
                        usage_of: UsageOf) -> web.StreamResponse:
    """Stream the pieces of ``reqs`` (one per prompt) as vLLM's chunks, in the order the engine made them.

    A client that leaves ends the stream quietly; the caller aborts the requests it no longer reads.
    """
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    events: asyncio.Queue[tuple[int, str, str | None]] = asyncio.Queue()
    forwarders: list[asyncio.Task[None]] = []
    if len(reqs) == 1:
        source: asyncio.Queue[Any] = reqs[0].events
    else:
        source = events
        forwarders = [asyncio.create_task(_forward(i, r, events)) for i, r in enumerate(reqs)]
    chat = gen.kind == "chat"
    templates = [ChunkTemplate(gen, model, i) for i in range(len(reqs))]
    try:
        if chat:
            await _sse(resp, chat_chunk(gen, model, 0, {"role": "assistant", "content": ""}))
        done = 0
        while done < len(reqs):
            item = await source.get()
            index, piece, reason = item if len(reqs) > 1 else (0, *item)
            if reason is None and not gen.continuous_usage:
                # the common chunk: bytes from a per-choice template, no JSON encoding per token
                await resp.write(templates[index].piece(piece))
                continue
            if reason is not None:
                done += 1
            per_chunk = usage_of(reqs) if gen.continuous_usage else None
            if chat:
                await _sse(resp, chat_chunk(gen, model, index, {"content": piece}, finish=reason,
                                            chunk_usage=per_chunk))
            else:
                await _sse(resp, completion_chunk(gen, model, index, piece, finish=reason,
                                                  chunk_usage=per_chunk))
        if gen.include_usage:
            await _sse(resp, usage_chunk(gen, model, usage_of(reqs)))
        await resp.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        return resp  # the client left
    finally:
        for task in forwarders:
            task.cancel()
    await resp.write_eof()
    return resp


async def _forward(index: int, req: EngineRequest, out: asyncio.Queue[tuple[int, str, str | None]]) -> None:
    """Merge the pieces of several prompts into one queue, tagged with the prompt's choice index."""
    while True:
        piece, reason = await req.events.get()
        out.put_nowait((index, piece, reason))
        if reason is not None:
            return


async def _sse(resp: web.StreamResponse, data: dict[str, Any]) -> None:
    await resp.write(b"data: " + dumps(data).encode() + b"\n\n")
