"""A persistent bytecode cache for an engine: every module it can import compiled once into the
folder its ``PYTHONPYCACHEPREFIX`` names (the cache volume), so a start reads bytecode from there
instead of compiling, or finding a stale or missing ``__pycache__``, wherever the packages live.

:func:`compile_into_prefix` runs ``python -m compileall`` with the engine's own interpreter and
environment over its standard library, the folders of the packages named (``vllm``, ``torch``...)
and every folder on its ``PYTHONPATH`` (a ``--target`` install of vLLM and what it brought); not the
base interpreter's own site-packages. With a
prefix, CPython looks for every module's bytecode under it, its standard library's too. A marker
in the prefix says what was compiled for which interpreter: the same set again is not compiled
again. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodetools.startstate import locate

__all__ = ["MARKER", "compile_into_prefix"]

MARKER = ".gpu-campaign-compiled.json"


def _folders(located: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """Each named package's folder and each PYTHONPATH entry (the standard library apart)."""
    folders = []
    for place in (located.get("packages") or {}).values():
        if place:
            folders.append(str(Path(place) if Path(place).is_dir() else Path(place).parent))
    folders += [p for p in str(env.get("PYTHONPATH") or "").split(os.pathsep) if p and Path(p).is_dir()]
    return list(dict.fromkeys(folders))


def compile_into_prefix(python: str, env: Mapping[str, str], packages: list[str],
                        timeout_s: float = 1800) -> dict[str, Any]:
    """Compile what the engine imports into its ``PYTHONPYCACHEPREFIX`` (once: a marker says what
    was); returns what it did: ``prefix``, ``folders``, ``seconds``, ``compiled`` or ``kept``."""
    prefix = str(env.get("PYTHONPYCACHEPREFIX") or "")
    if not prefix:
        return {"error": "the engine's environment names no PYTHONPYCACHEPREFIX"}
    started = time.monotonic()
    located = locate(python, env, packages)
    if "error" in located:
        return located
    folders = _folders(located, env)
    wanted = {"python": python, "cache_tag": located["cache_tag"], "stdlib": located["stdlib"], "folders": folders}
    marker = Path(prefix) / MARKER
    try:
        if json.loads(marker.read_text()) == wanted:
            return {"prefix": prefix, "folders": folders, "kept": True,
                    "seconds": round(time.monotonic() - started, 3)}
    except (OSError, ValueError):
        pass
    Path(prefix).mkdir(parents=True, exist_ok=True)
    # -q: errors only; -j 0: every CPU; a module that does not compile (a test fixture, a py2 file)
    # is left to fail at import, as it would anyway: the rest still gets its bytecode. The standard
    # library's folder holds the base interpreter's site-packages too: those are not the engine's.
    runs = [["-x", r"[\\/](site|dist)-packages[\\/]", str(located["stdlib"])]]
    runs += [folders] if folders else []
    errors, rc = 0, 0
    for args in runs:
        done = subprocess.run([python, "-m", "compileall", "-q", "-j", "0", *args], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        errors += len([line for line in done.stdout.splitlines() if line.startswith("***")])
        rc = rc or done.returncode
    marker.write_text(json.dumps(wanted, indent=2) + "\n")
    return {"prefix": prefix, "folders": [str(located["stdlib"]), *folders], "compiled": True, "rc": rc,
            "errors": errors, "seconds": round(time.monotonic() - started, 3)}
