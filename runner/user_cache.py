"""The runner's cache between runs (``$GPU_CAMPAIGN_CACHE``, default ``~/.cache/gpu-campaign``):
what an earlier run found that a later one may take instead of finding it again (a host's facts,
the hosts an inventory pattern selects). Each entry's name is a digest of everything it depends on.
Best effort: an entry that cannot be read or written is a miss, never a failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.errors import ResultsWriteError
from runner.files import atomic_write_text
from runner.results_reader import ResultsReader, Shape

__all__ = ["CACHE_VARIABLE", "cache_folder", "entry_name", "files_digest", "read_entry", "write_entry"]

logger = logging.getLogger(__name__)

CACHE_VARIABLE = "GPU_CAMPAIGN_CACHE"
_BYTES_READ = 1 << 20  # larger files count by size and mtime
_MAX_FILES = 2000  # a tree with more is not cached (hashing it would cost what the cache saves)


def cache_folder(part: str) -> Path:
    said = os.environ.get(CACHE_VARIABLE)
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    return (Path(said) if said else xdg / "gpu-campaign") / part


def entry_name(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32] + ".json"


def files_digest(paths: Sequence[str | Path]) -> str | None:
    """Each path as given (resolved where it exists) and the names and bytes of its files (a
    folder's, all the way down); a path that is not there counts by its text (a host list). A file
    over ``_BYTES_READ`` counts by its size and modification time (an inventory folder may hold
    carried builds or a wheelhouse). None past ``_MAX_FILES`` files: such a tree is not cached."""
    digest = hashlib.sha256()
    seen = 0
    for given in paths:
        path = Path(given)
        if not path.exists():
            digest.update(b"?" + str(given).encode() + b"\0")
            continue
        path = path.resolve()
        digest.update(str(path).encode() + b"\0")
        for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
            seen += 1
            if seen > _MAX_FILES:
                return None
            stat = f.stat()
            body = f.read_bytes() if stat.st_size <= _BYTES_READ else f"{stat.st_size}:{stat.st_mtime_ns}".encode()
            digest.update(str(f.relative_to(path.parent)).encode() + b"\0" + body + b"\0")
    return digest.hexdigest()


def read_entry(folder: Path, name: str, shape: Shape) -> Any | None:
    try:
        return ResultsReader(folder, quarantine=False).json(name, shape)
    except OSError:
        return None


def write_entry(folder: Path, name: str, value: Any) -> None:
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_text(folder / name, json.dumps(value))
    except (OSError, ResultsWriteError) as exc:
        logger.debug("not cached (%s): %s", folder / name, exc)
