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
  share warm is the question, and 400 modules answer it to a few per cent). Where the packages
  are and which modules to read is kept for a campaign's next trial (``keep``) while the
  interpreter, its ``sys.path`` folders and every package folder keep their mtimes; the headers
  are read every time.

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodetools.proc import write_json_atomic

__all__ = ["MAX_CACHE_FILES", "MAX_PYC_CHECKS", "bytecode_state", "cache_state", "locate", "pyc_fraction", "pyc_path"]

MAX_PYC_CHECKS = 400  # .pyc headers read per package at most (an even spread past that)

RACY_S = 2.0  # a folder whose mtime is this recent is not trusted to show the next change

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


def _listed(place: Path) -> tuple[list[str], dict[str, int]]:
    """The ``.py`` files under ``place`` (a package folder or one module) in path order, as os.walk
    finds them, and each folder's mtime read before it was listed: a file added or removed changes
    its folder's mtime, so equal mtimes say the list still holds (a ``__pycache__`` is neither)."""
    if place.is_file():
        with contextlib.suppress(OSError):
            return ([str(place)] if place.suffix == ".py" else []), {str(place.parent): place.parent.stat().st_mtime_ns}
        return [], {}
    sources: list[str] = []
    folders: dict[str, int] = {}
    stack = [str(place)]
    while stack:
        folder = stack.pop()
        try:
            folders[folder] = Path(folder).stat().st_mtime_ns
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir():
                    if entry.name != "__pycache__" and not entry.is_symlink():  # as os.walk, links not followed
                        stack.append(entry.path)
                elif entry.name.endswith(".py"):
                    sources.append(entry.path)
            except OSError:
                continue
    return sorted(sources, key=Path), folders


def _sample(sources: list[str]) -> dict[str, Any]:
    """At most MAX_PYC_CHECKS of ``sources``, evenly spread (every k-th in path order)."""
    every = -(-len(sources) // MAX_PYC_CHECKS) or 1  # ceil: at most MAX_PYC_CHECKS headers read
    return {"modules": len(sources), "every": every, "checked": sources[::every]}


def pyc_fraction(place: Path, cache_tag: str, magic: bytes, prefix: str = "",
                 sample: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Modules under ``place`` (a package folder or one module), how many have a current .pyc, and
    why the others have none (``reasons``, counted like ``current``: scaled up when sampled).
    ``sample``: which modules to read (:func:`_sample`), an earlier trial's where the folders are unchanged."""
    check_hash = magic == importlib.util.MAGIC_NUMBER  # this interpreter's source hash is the engine's
    sample = sample if sample is not None else _sample(_listed(place)[0])
    every, checked = int(sample["every"]), [Path(p) for p in sample["checked"]]
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
    return {"path": str(place), "modules": sample["modules"], "checked": len(checked), "every": every,
            "current": current if every == 1 else round(fraction * sample["modules"]),
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


def _kept_file(keep: Path, python: str, env: Mapping[str, str], packages: list[str]) -> Path:
    """Where this interpreter's answer for these packages is kept: the key is all it depends on
    but the folders' contents (their mtimes are checked on reading)."""
    seen = {**os.environ, **env}
    key = json.dumps({"python": python, "packages": packages, "max_checks": MAX_PYC_CHECKS, "cwd": str(Path.cwd()),
                      "env": {k: v for k, v in sorted(seen.items()) if k.startswith("PYTHON")}}, sort_keys=True)
    return keep / f"bytecode-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _mtimes(paths: list[str]) -> list[int | None]:
    out: list[int | None] = []
    for path in paths:
        try:
            out.append(Path(path).stat().st_mtime_ns)
        except OSError:
            out.append(None)
    return out


def _located_and_samples(python: str, env: Mapping[str, str], packages: list[str], timeout_s: float,
                         keep: Path | None) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """``locate``'s answer and each package's sample of modules, and whether an earlier trial's were
    used: with ``keep``, they are kept there, valid while the interpreter, its ``sys.path`` folders
    and every package folder keep their mtimes (an install or a file added or removed changes one)."""
    binary = shutil.which(python) or python
    kept = _kept_file(keep, python, env, packages) if keep is not None else None
    if kept is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            earlier = json.loads(kept.read_text())
            if _mtimes(earlier["watched"]) == earlier["mtimes"]:
                return earlier["located"], earlier["samples"], True
    watched = [binary, str(Path(binary).parent.parent / "pyvenv.cfg")]
    mtimes = _mtimes(watched)  # read before what they guard: a change meanwhile is seen next time
    located = locate(python, env, packages, timeout_s)
    if "error" in located:
        return located, {}, False
    sites = [str(p) for p in located.get("site") or []]
    watched, mtimes = watched + sites, mtimes + _mtimes(sites)
    samples: dict[str, Any] = {}
    for name in packages:
        place = located["packages"].get(name) or ""
        if place:
            sources, folders = _listed(Path(place))
            samples[name] = _sample(sources)
            watched, mtimes = watched + list(folders), mtimes + list(folders.values())
    # A folder changed within the last RACY_S may change again within its mtime's clock tick
    # unseen (as git's racy-clean index entries): such an answer is not kept.
    racy = time.time_ns() - int(RACY_S * 1e9)
    if kept is not None and all(m is None or m < racy for m in mtimes):
        with contextlib.suppress(OSError):  # kept only to save the next trial's time
            kept.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(kept, {"python": python, "packages": packages, "located": located,
                                     "samples": samples, "watched": watched, "mtimes": mtimes})
    return located, samples, False


def bytecode_state(python: str, env: Mapping[str, str], packages: list[str], timeout_s: float = 60,
                   keep: Path | None = None) -> dict[str, Any]:
    """Warm ``.pyc`` fractions of ``packages`` as the engine's ``python`` (with ``env``) imports them
    (under its ``PYTHONPYCACHEPREFIX`` when it has one). With ``keep`` (a folder of the campaign's),
    where the packages are and which modules to read is kept there for the next trial (0.1-0.3 s
    of the engine's interpreter and the walk of its packages); the headers are read every time:
    a start, or a mode's compile, changes them."""
    started = time.monotonic()
    located, samples, reused = _located_and_samples(python, env, packages, timeout_s, keep)
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
        out["packages"][name] = (pyc_fraction(Path(place), located["cache_tag"], magic, prefix, samples.get(name))
                                 if place else {"error": f"{name} is not importable by {python}"})
    out["seconds"] = round(time.monotonic() - started, 3)
    if keep is not None:
        out["located_from_earlier_trial"] = reused
    return out
