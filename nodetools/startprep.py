"""``nodetools.coldstart prepare``: put the node in a startup mode's state, in one step.

An emptied trial folder and fresh cache, the persistent caches emptied when the mode starts from
nothing (``first_start``), the cache folders, ``launch.json``; then what the start begins from is
read from disk (:mod:`nodetools.startstate`: the caches' state, the engine's bytecode) into
``prepare.json`` (the timer copies it into timings.json), and only then the page cache is
dropped or the weights read into it. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from nodetools.pagecache import drop, evict, warm
from nodetools.proc import write_json_atomic
from nodetools.startstate import bytecode_state, cache_state

__all__ = ["PREPARED", "drop_scope", "prepare"]

PREPARED = "prepare.json"  # what the start begins from, written by prepare, copied into timings.json


def _empty_folder(folder: Path) -> bool:
    """Remove what ``folder`` holds (the folder stays). Refuses a folder near the root: a cache
    folder is ``<cache_root>/<name>``."""
    if len(folder.resolve().parts) < 3:
        raise ValueError(f"refusing to empty {folder}: not a cache folder (<cache_root>/<name>)")
    if not folder.is_dir() or not any(folder.iterdir()):
        return False
    shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return True


def drop_scope(asked: str, engine_kind: str) -> str:
    """``auto``: a rehearsal (the stand-in, often on a shared machine) evicts only its model's files;
    a real engine's node is the campaign's alone, so the whole page cache goes, as the reference
    campaign dropped it."""
    if asked != "auto":
        return asked
    return "files" if engine_kind == "stand-in" else "global"


def prepare(workdir: Path, launch: dict[str, Any], fresh_cache: str, page_cache: str, model: str,
            empty_cache: bool = False, engine_python: str = "", bytecode_packages: tuple[str, ...] = (),
            drop_scope: str = "global") -> tuple[list[str], dict[str, Any]]:
    """Put the node in the mode's state; returns what changed and what the start begins from
    (also written to ``prepare.json`` in ``workdir``). A page-cache drop is ``global`` (the whole
    machine's cache: right where the node is the campaign's alone) or ``files`` (only the model's
    files, evicted one by one: polite on a shared machine); ``before["page_cache"]`` says which ran."""
    changed = []
    if workdir.exists():  # an earlier attempt's log must not mix into this one's
        shutil.rmtree(workdir)
        changed.append(f"emptied {workdir}")
    workdir.mkdir(parents=True)
    if fresh_cache and Path(fresh_cache).exists():
        shutil.rmtree(fresh_cache)
        changed.append(f"emptied {fresh_cache}")
    caches = {str(k): str(v) for k, v in (launch.get("caches") or {}).items()}
    for name, cache in sorted(caches.items()):
        if empty_cache and _empty_folder(Path(cache)):
            changed.append(f"emptied the persistent {name} cache {cache}")
        Path(cache).mkdir(parents=True, exist_ok=True)
    (workdir / "launch.json").write_text(json.dumps(launch, indent=2, sort_keys=True) + "\n")
    changed.append("wrote launch.json")
    # Read before the page cache is dropped: these reads must not warm what the start reads.
    before = cache_state(caches, fresh_cache, container=bool(launch.get("container")))
    if engine_python and bytecode_packages:
        env = {str(k): str(v) for k, v in (launch.get("env") or {}).items()}
        before["bytecode"] = bytecode_state(engine_python, env, list(bytecode_packages))
    if page_cache == "drop" and drop_scope == "files":
        evicted = evict([model]) if model else {"method": "files", "files": 0, "bytes": 0, "resident_after": None}
        before["page_cache"] = {"action": "drop", **evicted}
        changed.append(f"evicted {evicted['files']} model files from the page cache")
    elif page_cache == "drop":
        drop()
        before["page_cache"] = {"action": "drop", "method": "global"}
        changed.append("dropped the page cache")
    elif page_cache == "warm":
        before["page_cache"] = {"action": "warm", "bytes": warm([model])}
        changed.append(f"read {before['page_cache']['bytes']} bytes of {model} into the page cache")
    else:
        before["page_cache"] = {"action": "keep"}
    write_json_atomic(workdir / PREPARED, before)
    return changed, before
