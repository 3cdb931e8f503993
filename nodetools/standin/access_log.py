"""The HTTP access log, as uvicorn writes it in vLLM's log (``INFO:     1.2.3.4:5 - "POST ..." 200 OK``)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from nodetools.standin.vllm_log import ProcLogger

__all__ = ["UvicornAccessLogger", "remember_peer"]

_PEER_KEY = "standin_peer"


def remember_peer(request: web.Request) -> None:
    """Keep the client's address for the access line: a client that leaves mid-stream takes the
    transport, and the address with it, before the line is written."""
    request[_PEER_KEY] = request.transport.get_extra_info("peername") if request.transport else None


class UvicornAccessLogger(AbstractAccessLogger):
    """aiohttp builds the access logger itself, so the API server's logger is a class attribute."""

    api: ProcLogger | None = None

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if self.api is None:
            return
        peer = request.get(_PEER_KEY) or (
            request.transport.get_extra_info("peername") if request.transport else None)
        client = f"{peer[0]}:{peer[1]}" if peer else "-"
        v = request.version
        self.api.uvicorn('%s - "%s %s HTTP/%d.%d" %d %s', client, request.method, request.path_qs,
                         v.major, v.minor, response.status, response.reason)
