"""Which copy path LMCache ran in the engine: its compiled CUDA extension, or the torch-ops fallback.

LMCache binds its compiled CUDA extension when it starts inside the engine. When the extension
cannot be imported (a wheel built for another torch), it logs one warning and runs every copy as
torch ops: on the H200 its retrievals then moved 2.08 GB/s, 26x slower than vLLM's native tier on
the same machine, and a tier at that speed measures LMCache's packaging, not LMCache. LMCache
0.5.6's words (``lmcache/v1/platform/devices/cuda/device_ops.py``, as its log on the H200 gave them):

    lmcache.cuda_ops compiled extension not found; CudaDeviceOps stays on the torch baseline for all ops.

Earlier releases name ``lmcache.c_ops``, and another accelerator's backend says ``native ops not
found``. When the extension binds, LMCache logs nothing, so the CUDA path is a log in which the
LMCache connector started and that warning is absent. Stdlib only: the node's run refuses a trial
on the fallback, and the runner records which path ran.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

__all__ = ["CUDA_EXTENSION", "FIX", "TORCH_OPS", "extension_reasons", "fallback_line", "first_fallback",
           "lmcache_path", "refusal", "scan_logs"]

CUDA_EXTENSION, TORCH_OPS = "cuda_extension", "torch_ops"
FALLBACK = re.compile(r"\S+ (?:compiled extension|native ops) not found; \w+ stays on the torch baseline"
                      r"(?: for all ops)?\.?")
# LMCache started in this engine: vLLM created its connector, or LMCache logged its own lines.
_STARTED = re.compile(r"Creating v1 connector with name: LMCache|LMCache (?:INFO|WARNING|ERROR)|LMCacheEngine")
FIX = ("build LMCache's CUDA extension for this node's torch (docs/offload.md, 'LMCache at its real speed'), "
       "or set allow_torch_fallback: true in the mode to measure the fallback on purpose")
_MAX_SCAN = 64 << 20  # LMCache's startup lines come first; a log of LMCache's per-copy lines can be 21 MB
# LMCache's compiled extension by the names its releases gave it (0.5.6: cuda_ops). Importing it is
# what LMCache does at its start; the error says why (an undefined symbol: built for another torch).
_PROBE = """
import importlib, sys
errors = []
for name in ("lmcache.cuda_ops", "lmcache.c_ops"):
    try:
        importlib.import_module(name)
        sys.exit(0)
    except Exception as exc:
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
print("; ".join(errors)[:600])
sys.exit(1)
"""
PROBE_TIMEOUT_S = 180  # torch and LMCache import in tens of seconds on a cold page cache


def fallback_line(text: str) -> str | None:
    """LMCache's torch-ops warning in ``text``, or None."""
    found = FALLBACK.search(text)
    return found.group(0) if found else None


def lmcache_path(text: str) -> str:
    """``torch_ops`` when LMCache said it fell back, ``cuda_extension`` when it started without
    saying so, "" when no LMCache started in this log."""
    if fallback_line(text):
        return TORCH_OPS
    return CUDA_EXTENSION if _STARTED.search(text) else ""


def refusal(line: str) -> str:
    """Why the run stops, with the fix, in one line."""
    return f"LMCache runs its KV copies as torch ops, not its CUDA extension: its log says {line!r}; {FIX}"


def _scan(path: Path, limit: int) -> str:
    """The log's first ``limit`` bytes, decoded (what is missing is missing)."""
    try:
        with path.open("rb") as fh:
            return fh.read(limit).decode(errors="replace")
    except OSError:
        return ""


def scan_logs(paths: Iterable[Path], limit: int = _MAX_SCAN) -> str:
    """The path every engine copy's log shows: ``torch_ops`` if any copy fell back, else
    ``cuda_extension`` if any copy started LMCache, else ""."""
    paths = [Path(p) for p in paths]
    found = [lmcache_path(_scan(p, limit)) for p in paths]
    if TORCH_OPS in found:
        return TORCH_OPS
    return CUDA_EXTENSION if CUDA_EXTENSION in found else ""


def first_fallback(paths: Iterable[Path], limit: int = _MAX_SCAN) -> str | None:
    """The first copy's torch-ops warning, or None."""
    for path in paths:
        line = fallback_line(_scan(Path(path), limit))
        if line:
            return line
    return None


def extension_reasons(python: str, pythonpath: str = "") -> list[str]:
    """Why LMCache's compiled extension does not import in the engine's Python, or nothing: the
    preflight refuses such a trial in seconds instead of after an engine start of minutes."""
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    try:
        done = subprocess.run([python, "-c", _PROBE], check=False, capture_output=True, text=True, env=env,
                              timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"LMCache's CUDA extension: could not ask {python} ({exc})"]
    if done.returncode == 0:
        return []
    why = done.stdout.strip() or (done.stderr.strip().splitlines() or ["no output"])[-1]
    return [f"LMCache's CUDA extension does not import beside the engine, so LMCache would run on torch ops "
            f"({why}); {FIX}"]
