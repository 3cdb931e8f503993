# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""Reading small /proc and /sys files: an unreadable file is a missing fact, never an error."""

from __future__ import annotations

import re
from pathlib import Path


def read_text(path: str | Path) -> str | None:
    """File content, or None when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def parse_int(text: str | None) -> int | None:
    """``'42\\n'`` -> 42; None for absent or non-numeric text."""
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def natural_key(name: str) -> list[int | str]:
    """Sort key that puts ``nvme2n1`` before ``nvme10n1``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
