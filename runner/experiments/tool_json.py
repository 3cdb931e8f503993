"""A node tool's JSON output, read bounded: the one way the storage modes read what their tool wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.errors import ParseError

__all__ = ["read_tool_json"]


def read_tool_json(path: Path, tool: str, max_bytes: int) -> Any:
    """``path``'s JSON; a file over ``max_bytes`` (not the tool's output), unreadable or not JSON is a
    :class:`ParseError` naming the file and ``tool``."""
    source = str(path)
    try:
        if path.stat().st_size > max_bytes:
            raise ParseError(source, f"larger than {max_bytes} bytes: not {tool}'s output")
        return json.loads(path.read_text())
    except OSError as exc:
        raise ParseError(source, f"cannot read it: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ParseError(source, f"not JSON (truncated?): {exc}") from exc
