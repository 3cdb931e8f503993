"""What a start begins from on disk: the compile and JIT caches, and the engine's Python bytecode.

Both are read from the node just before the start, never inferred from the mode:

* :func:`cache_state`: ``fresh`` (the caches are a folder made for this trial, or a container
  gets none), ``empty`` (the persistent cache folders hold no file), ``warm`` (they hold some),
  ``unknown`` (a process engine with no cache folder of the campaign's: its own defaults); with
  the files and bytes per cache.
* :func:`bytecode_state`: per Python package of the engine (``vllm``, ``torch``...), how many of
  its modules have a current ``__pycache__/<module>.<cache tag>.pyc`` for the engine's own
  interpreter (right magic number; the source's mtime and size in the header, or its hash for a
  checked hash-based pyc). The engine's interpreter only locates the packages (``find_spec`` of a
  top-level name imports nothing); the headers are read here, of every module up to
  ``MAX_PYC_CHECKS`` a package and of an even spread of them past that (every k-th in path order:
  vLLM, torch and transformers are ~10,000 modules, 0.5 s a trial on the H200 read in full; the
  share warm is the question, and 400 modules answer it to a few per cent).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MAX_CACHE_FILES", "MAX_PYC_CHECKS", "bytecode_state", "cache_state", "locate", "pyc_fraction", "pyc_path"]

MAX_PYC_CHECKS = 400  # .pyc headers read per package at most (an even spread past that)

MAX_CACHE_FILES = 1_000_000  # files counted per cache folder before the count stops (it says so)

_LOCATE = """\
import importlib.util, json, os, sys, sysconfig
out = {"cache_tag": sys.implementation.cache_tag, "magic": importlib.util.MAGIC_NUMBER.hex(), "packages": {},
       "pycache_prefix": sys.pycache_prefix or "", "stdlib": sysconfig.get_paths()["stdlib"],
       "site": [p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p) != os.getcwd()]}
for name in sys.argv[1:]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    out["packages"][name] = places[0] if places else (spec.origin or "") if spec is not None else ""
print(json.dumps(out))
"""


def _count(folder: Path) -> tuple[int, int, bool]:
    """(files, bytes, whether the count stopped at MAX_CACHE_FILES) under ``folder``."""
    files = size = 0
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    files += 1
                    size += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            if files >= MAX_CACHE_FILES:
                return files, size, True
    return files, size, False


def cache_state(caches: Mapping[str, str], fresh_dir: str = "", container: bool = False) -> dict[str, Any]:
    """The state of a start's compile and JIT caches (``caches``: name -> folder, as in launch.json)."""
    if not caches:
        return {"cache_state": "fresh" if container else "unknown", "cache_files": {}, "cache_bytes": 0}
    files: dict[str, int] = {}
    total_bytes = 0
    capped = False
    for name, folder in sorted(caches.items()):
        n, size, stopped = _count(Path(folder))
        files[name] = n
        total_bytes += size
        capped = capped or stopped
    root = os.path.realpath(fresh_dir) if fresh_dir else ""
    fresh = bool(root) and all(os.path.commonpath([root, os.path.realpath(p)]) == root for p in caches.values())
    state = "warm" if sum(files.values()) else "fresh" if fresh else "empty"
    out: dict[str, Any] = {"cache_state": state, "cache_files": files, "cache_bytes": total_bytes}
    if capped:
        out["cache_count_stopped_at"] = MAX_CACHE_FILES
    return out


def _pyc_current(source: Path, pyc: Path, magic: bytes, check_hash: bool) -> bool:
    try:
        with pyc.open("rb") as fh:
            head = fh.read(16)
        if len(head) < 16 or head[:4] != magic:
            return False
        flags = int.from_bytes(head[4:8], "little")
        if flags & 1:  # hash-based: unchecked ones are always used, checked ones must match the source
            if not flags & 2 or not check_hash:
                return True
            return head[8:16] == importlib.util.source_hash(source.read_bytes())
        st = source.stat()
        return (int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)
    except OSError:
        return False


def pyc_path(source: Path, cache_tag: str, prefix: str = "") -> Path:
    """Where the engine's interpreter looks for ``source``'s bytecode: ``__pycache__`` beside it, or,
    with ``PYTHONPYCACHEPREFIX``, the source's absolute folder mirrored under the prefix."""
    name = f"{source.stem}.{cache_tag}.pyc"
    if prefix:
        # As CPython's cache_from_source: the absolute folder as found, no symlink resolved.
        return Path(prefix) / str(source.parent.absolute()).lstrip(os.sep) / name
    return source.parent / "__pycache__" / name


def _why_not(source: Path, pyc: Path) -> str:
    """Why a module has no usable .pyc: ``stale`` (one there, for another source), ``other_interpreter``
    (only another Python's), ``no_pycache_dir`` (its folder never got one), else ``missing``."""
    if pyc.exists():
        return "stale"
    folder = pyc.parent
    if not folder.is_dir():
        return "no_pycache_dir"
    if any(folder.glob(f"{source.stem}.*.pyc")):
        return "other_interpreter"
    return "missing"


def pyc_fraction(place: Path, cache_tag: str, magic: bytes, prefix: str = "") -> dict[str, Any]:
    """Modules under ``place`` (a package folder or one module), how many have a current .pyc, and
    why the others have none (``reasons``, counted like ``current``: scaled up when sampled)."""
    check_hash = magic == importlib.util.MAGIC_NUMBER  # this interpreter's source hash is the engine's
    sources: list[Path] = []
    if place.is_file():
        sources = [place] if place.suffix == ".py" else []
    else:
        for root, dirs, names in os.walk(place):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            sources.extend(Path(root) / n for n in names if n.endswith(".py"))
    sources.sort()
    every = -(-len(sources) // MAX_PYC_CHECKS) or 1  # ceil: at most MAX_PYC_CHECKS headers read
    checked = sources[::every]
    reasons: dict[str, int] = {}
    for src in checked:
        pyc = pyc_path(src, cache_tag, prefix)
        if not _pyc_current(src, pyc, magic, check_hash):
            why = _why_not(src, pyc)
            reasons[why] = reasons.get(why, 0) + 1
    current = len(checked) - sum(reasons.values())
    fraction = current / len(checked) if checked else None
    folder = place if place.is_dir() else place.parent
    # "current" counts the package's modules: the checked ones' share of them when sampled.
    return {"path": str(place), "modules": len(sources), "checked": len(checked), "every": every,
            "current": current if every == 1 else round(fraction * len(sources)),
            "fraction": round(fraction, 4) if fraction is not None else None,
            "reasons": {k: v * every if every > 1 else v for k, v in sorted(reasons.items())},
            "writable": os.access(Path(prefix) if prefix else folder, os.W_OK)}


def locate(python: str, env: Mapping[str, str], packages: list[str], timeout_s: float = 60) -> dict[str, Any]:
    """Where the engine's ``python`` (with ``env``) finds ``packages``, its stdlib, cache tag, magic
    number and pycache prefix; ``{"error": ...}`` when it cannot run."""
    try:
        done = subprocess.run([python, "-c", _LOCATE, *packages], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        located = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"error": f"could not run {python}: {exc}"}
    if located is None:
        tail = done.stderr.strip().splitlines()[-1:] or [f"rc {done.returncode}"]
        return {"error": f"{python} could not locate the packages: {tail[0]}"}
    return located


def bytecode_state(python: str, env: Mapping[str, str], packages: list[str], timeout_s: float = 60) -> dict[str, Any]:
    """Warm ``.pyc`` fractions of ``packages`` as the engine's ``python`` (with ``env``) imports them
    (under its ``PYTHONPYCACHEPREFIX`` when it has one)."""
    started = time.monotonic()
    located = locate(python, env, packages, timeout_s)
    if "error" in located:
        return located
    magic = bytes.fromhex(located["magic"])
    prefix = str(located.get("pycache_prefix") or "")
    out: dict[str, Any] = {"python": python, "cache_tag": located["cache_tag"], "order": list(packages),
                           "packages": {}}
    if prefix:
        out["pycache_prefix"] = prefix
    for name in packages:
        place = located["packages"].get(name) or ""
        out["packages"][name] = (pyc_fraction(Path(place), located["cache_tag"], magic, prefix) if place
                                 else {"error": f"{name} is not importable by {python}"})
    out["seconds"] = round(time.monotonic() - started, 3)
    return out
