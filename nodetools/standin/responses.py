"""JSON response bodies as the stand-in writes them: compact, UTF-8, vLLM's error shape."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from nodetools.standin.protocol import ApiError, error_body

__all__ = ["dumps", "error_response", "json_response"]

# Compact separators and raw UTF-8, as FastAPI's JSONResponse writes them in vLLM.
dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(data).encode(), status=status, content_type="application/json")


def error_response(err: ApiError) -> web.Response:
    return json_response(error_body(err), err.status)
