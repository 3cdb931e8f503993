"""vLLM's operational routes: health, version, Prometheus metrics, the prefix-cache reset, sleep mode."""

from __future__ import annotations

from aiohttp import web

from nodetools.standin.config import STANDIN_VERSION
from nodetools.standin.engine import Engine
from nodetools.standin.protocol import ApiError
from nodetools.standin.responses import error_response, json_response
from nodetools.standin.tokenizer import TokenizerInfo

__all__ = ["AdminRoutes"]


class AdminRoutes:
    """Handlers that answer about the engine, or change its state, rather than generate."""

    def __init__(self, engine: Engine, tokenizer_info: TokenizerInfo) -> None:
        self.engine = engine
        self.tokenizer_info = tokenizer_info

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": f"{STANDIN_VERSION}+standin", "engine": "stand-in",
                              "tokenizer": self.tokenizer_info.kind})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.engine.stats.render(), content_type="text/plain",
                            headers={"X-Engine": "stand-in"})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.reset_prefix_cache()
        return web.Response(status=200)

    # Sleep mode (the routes exist only with --enable-sleep-mode).
    async def sleep(self, request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            return error_response(ApiError(400, "level must be 1 or 2", param="level"))
        if level not in (1, 2):
            return error_response(ApiError(400, "level must be 1 or 2", param="level"))
        await self.engine.sleep(level)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", None)
        await self.engine.wake_up(list(tags) if tags else None)
        return web.Response(status=200)

    async def collective_rpc(self, request: web.Request) -> web.Response:
        """vLLM's development RPC, for the one method a level-2 wake needs: ``reload_weights``."""
        try:
            body = await request.json()
        except ValueError as exc:
            return error_response(ApiError(400, f"JSON decode error: {exc}"))
        method = body.get("method") if isinstance(body, dict) else None
        if method is None:
            return error_response(ApiError(400, "Missing 'method' in request body"))
        if method != "reload_weights":
            return error_response(ApiError(400, f"the stand-in's collective_rpc runs reload_weights only, not "
                                                f"{str(method)[:64]!r}", param="method"))
        try:
            await self.engine.reload_weights()
        except NotImplementedError as exc:  # vLLM's answer for a format it cannot reload (dummy)
            return error_response(ApiError(500, str(exc), "InternalServerError"))
        return json_response({"results": [None]})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return json_response({"is_sleeping": self.engine.is_sleeping})
