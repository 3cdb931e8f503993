"""HTTP probes of an engine on this node: a POST to it, and the one-token completion that proves it serves.

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

__all__ = ["first_token", "post"]


def post(port: int, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``127.0.0.1:port``; (HTTP status, the answer's bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def first_token(port: int, model: str, timeout: float) -> bool:
    """One tiny completion; True when it returned a real token."""
    try:
        status, body = post(port, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 1,
                                                        "temperature": 0}, timeout)
    except (OSError, http.client.HTTPException):
        return False
    if status != 200:
        return False
    try:
        choices = json.loads(body).get("choices") or []
    except ValueError:
        return False
    return bool(choices and choices[0].get("text"))
