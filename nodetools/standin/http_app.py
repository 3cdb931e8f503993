"""The HTTP side of the API server: its route table, and listening on the socket bound at process start."""

from __future__ import annotations

import os
import socket

from aiohttp import web

from nodetools.standin.access_log import UvicornAccessLogger
from nodetools.standin.admin_api import AdminRoutes
from nodetools.standin.config import ServeConfig
from nodetools.standin.engine import Engine
from nodetools.standin.openai_api import OpenAIRoutes
from nodetools.standin.tokenizer import TokenizerInfo
from nodetools.standin.vllm_log import STYLES, ProcLogger

__all__ = ["build_routes", "start_http"]


def build_routes(cfg: ServeConfig, engine: Engine, max_model_len: int, tokenizer_info: TokenizerInfo
                 ) -> list[web.RouteDef]:
    """Every route, in the order the log's ``Available routes are:`` lists them."""
    admin = AdminRoutes(engine, tokenizer_info)
    openai = OpenAIRoutes(cfg, engine, max_model_len, tokenizer_info)
    routes = [
        web.get("/health", admin.health, allow_head=False),
        web.get("/version", admin.version, allow_head=False),
        web.get("/metrics", admin.metrics, allow_head=False),
        web.post("/tokenize", openai.tokenize),
        web.post("/detokenize", openai.detokenize),
        web.get("/v1/models", openai.models, allow_head=False),
        web.post("/reset_prefix_cache", admin.reset_prefix_cache),
        web.post("/v1/chat/completions", openai.chat),
        web.post("/v1/completions", openai.completions),
    ]
    if cfg.enable_sleep_mode:
        routes += [web.post("/sleep", admin.sleep), web.post("/wake_up", admin.wake_up),
                   web.get("/is_sleeping", admin.is_sleeping, allow_head=False),
                   web.post("/collective_rpc", admin.collective_rpc)]
    return routes


async def start_http(cfg: ServeConfig, routes: list[web.RouteDef], sock: socket.socket, api: ProcLogger,
                     environ: dict[str, str]) -> web.AppRunner:
    """Listen on ``sock`` and log what vLLM's API server logs up to ``Application startup complete.``

    The caller stops the server with ``runner.cleanup()``.
    """
    app = web.Application()
    app.add_routes(routes)
    access = None if cfg.disable_uvicorn_access_log else api.logger
    UvicornAccessLogger.api = api
    runner = web.AppRunner(app, access_log_class=UvicornAccessLogger, access_log=access,
                           handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    api.info("Supported tasks: ['generate']")
    if environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
        api.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in "
                    "production!")
    url = f"http://{cfg.host or '0.0.0.0'}:{sock.getsockname()[1]}"
    api.info(STYLES[cfg.knobs.log_style]["server_start"], url)
    api.info("Available routes are:")
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter") or ""
        api.info("Route: %s, Methods: %s", path, route.method)
    site = web.SockSite(runner, sock, shutdown_timeout=1.0)
    await site.start()
    api.uvicorn("Started server process [%d]", os.getpid())
    api.uvicorn("Waiting for application startup.")
    api.uvicorn("Application startup complete.")
    return runner
