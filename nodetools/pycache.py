"""A persistent bytecode cache for an engine: every module it can import compiled once into the
folder its ``PYTHONPYCACHEPREFIX`` names (the cache volume), so a start reads bytecode from there
instead of compiling, or finding a stale or missing ``__pycache__``, wherever the packages live.

:func:`compile_into_prefix` runs ``python -m compileall`` with the engine's own interpreter and
environment over what it imports: its standard library (not the base interpreter's own
site-packages inside it), the folder of every top-level package the profiles of its earlier starts
name (``importtime.txt`` of the campaign's earlier trials on this node: nodetools/import_profile),
the packages named, and every folder on its launch's ``PYTHONPATH`` (a ``--target`` install of vLLM
and what it brought). All it imports, because with a prefix CPython looks for every module's
bytecode there and nowhere else: a package left out compiles at every import where the engine's
Python does not write bytecode (on the H200, scipy, pandas and transformers outside the compiled
folders took 1.4-4x their import time: docs/startup.md). A marker in the prefix says what was
compiled for which interpreter: the same set again is not compiled again. Stdlib only: this runs
on the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nodetools.import_profile import imported_packages
from nodetools.startstate import locate

__all__ = ["MARKER", "compile_into_prefix"]

MARKER = ".gpu-campaign-compiled.json"


def _folders(located: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """Each located package's folder (a module: the module) and each PYTHONPATH entry of the launch;
    the standard library's modules are compiled apart."""
    stdlib = str(located["stdlib"]).rstrip(os.sep) + os.sep
    folders = []
    for place in (located.get("packages") or {}).values():
        if place and str(place).startswith(stdlib) and "-packages" not in str(place):
            continue  # the standard library's own module: compiled with it
        if place and Path(place).exists():  # not a built-in or frozen module
            folders.append(str(place))
    folders += [p for p in str(env.get("PYTHONPATH") or "").split(os.pathsep) if p and Path(p).is_dir()]
    # A folder inside another is compiled with it.
    unique = sorted(dict.fromkeys(str(Path(f)) for f in folders))
    return [f for f in unique if not any(f != o and f.startswith(o.rstrip(os.sep) + os.sep) for o in unique)]


def compile_into_prefix(python: str, env: Mapping[str, str], packages: list[str], profiles: Iterable[Path] = (),
                        timeout_s: float = 1800) -> dict[str, Any]:
    """Compile what the engine imports (``packages``, and what ``profiles`` of its earlier starts
    name) into its ``PYTHONPYCACHEPREFIX``, once (a marker says what was); returns what it did:
    ``prefix``, ``folders``, ``seconds``, ``compiled`` or ``kept``."""
    prefix = str(env.get("PYTHONPYCACHEPREFIX") or "")
    if not prefix:
        return {"error": "the engine's environment names no PYTHONPYCACHEPREFIX"}
    started = time.monotonic()
    names = sorted({*packages, *imported_packages(profiles)} - {"sitecustomize", "usercustomize", "__main__"})
    located = locate(python, env, names)
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
