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
from collections.abc import Iterator, Sequence
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


def _inventory_files(path: Path) -> Iterator[Path]:
    """What Ansible reads for an inventory source: a file and the group_vars/host_vars beside it, or
    a folder all the way down (links followed, each folder once; hidden names skipped, as Ansible
    skips them)."""
    if path.is_file():
        yield path
        roots = [path.parent / "group_vars", path.parent / "host_vars"]
    else:
        roots = [path]
    seen: set[tuple[int, int]] = set()
    for root in (r for r in roots if r.is_dir()):
        for folder, dirs, files in os.walk(root, followlinks=True):
            stat = Path(folder).stat()
            if (stat.st_dev, stat.st_ino) in seen:
                dirs[:] = []
                continue
            seen.add((stat.st_dev, stat.st_ino))
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            yield from (Path(folder) / f for f in sorted(files) if not f.startswith("."))


def files_digest(paths: Sequence[str | Path]) -> str | None:
    """Each path as given (resolved where it exists) and the names and bytes of what Ansible reads
    for it (``_inventory_files``); a path that is not there counts by its text (a host list). A file
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
        for f in _inventory_files(path):
            seen += 1
            if seen > _MAX_FILES:
                return None
            stat = f.stat()
            body = f.read_bytes() if stat.st_size <= _BYTES_READ else f"{stat.st_size}:{stat.st_mtime_ns}".encode()
            digest.update(os.path.relpath(f, path.parent).encode() + b"\0" + body + b"\0")
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
