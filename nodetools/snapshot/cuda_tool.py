"""Which cuda-checkpoint acts: NVIDIA's binary or this project's ``cuda_checkpoint_api.py``.

Every snapshot result records it (``cuda_checkpoint_tool``): the two implement the same command
line, but only one of them is NVIDIA's. The ``cuda_checkpoint`` role writes a marker of what it
installs, ``cuda_checkpoint_marker_path`` (by default ``/usr/local/lib/cuda-checkpoint.json``; a
``<path>.json`` beside the tool is read first), with ``tool`` ("nvidia" or "cuda_checkpoint_api"),
``sha256`` (hex, "sha256:" in front or not) and ``version``; it is believed only when that is the
sha256 of the file found (symbolic links followed), so a marker about another file is ignored.
Without one (or with a stale one) the file's content tells: an ELF binary whose ``--help`` speaks
of checkpoints is NVIDIA's (its version from that help), a text file naming ``cuda_checkpoint_api``
is ours, anything else is "unknown".

In the ``criu`` mode the tool that acts is the one CRIU's CUDA plugin runs, ``cuda-checkpoint``
from CRIU's PATH: a mode parameter naming another file puts it first on that PATH
(``plugin_path``).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from nodetools.proc import run_captured

__all__ = ["PLUGIN_RUNS", "argv", "found", "identify", "plugin_path"]

PLUGIN_RUNS = "cuda-checkpoint"  # the name CRIU's CUDA plugin executes from its PATH
OURS = "cuda_checkpoint_api"
# Where the cuda_checkpoint role writes its marker by default (cuda_checkpoint_marker_path).
ROLE_MARKER = Path("/usr/local/lib/cuda-checkpoint.json")


def argv(tool: str) -> list[str]:
    """How to run the tool: itself, or a ``.py`` (cuda_checkpoint_api.py) without its executable bit
    (a wheel may drop it) with this Python."""
    if tool.endswith(".py") and Path(tool).is_file() and not os.access(tool, os.X_OK):
        return [sys.executable, tool]
    return [tool]


def found(tool: str) -> bool:
    return shutil.which(tool) is not None or (tool.endswith(".py") and Path(tool).is_file())


def _where(tool: str) -> Path | None:
    path = shutil.which(tool)
    if path:
        return Path(path)
    return Path(tool) if Path(tool).is_file() else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _by_content(path: Path) -> tuple[str, str | None]:
    """(tool, version) from the file itself."""
    head = path.read_bytes()[:1 << 20]
    if head.startswith(b"\x7fELF"):  # NVIDIA's: "CUDA checkpoint and restore utility. Version 580.159.04. ..."
        done = run_captured([str(path), "--help"], 30)
        said = done.stdout + done.stderr
        if "checkpoint" not in said.lower():
            return "unknown binary", None
        match = re.search(r"Version\s+(\d+(?:\.\d+)+)", said)
        return "nvidia", match.group(1) if match else None
    if OURS.encode() in head:
        return OURS, None
    return "unknown", None


def identify(tool: str) -> dict[str, Any]:
    """What ``tool`` (a name on the PATH or a path) is: path, tool, sha256, version, and where that
    came from (``marker`` or ``content``)."""
    path = _where(tool)
    if path is None:
        return {"asked": tool, "path": None, "tool": None, "source": "not found"}
    real = path.resolve()
    out: dict[str, Any] = {"asked": tool, "path": str(path), "sha256": _sha256(real)}
    if real != path:
        out["resolves_to"] = str(real)
    for marker in (Path(f"{path}.json"), ROLE_MARKER):
        if not marker.is_file():
            continue
        out["marker"] = str(marker)
        try:
            claim = json.loads(marker.read_text())
        except (OSError, ValueError) as exc:
            claim, out["marker_problem"] = {}, f"unreadable: {exc}"
        claimed = str(claim.get("sha256") or "") if isinstance(claim, dict) else ""
        claimed = claimed[len("sha256:"):] if claimed.startswith("sha256:") else claimed
        if claimed == out["sha256"] and claim.get("tool"):
            out.pop("marker_problem", None)
            return {**out, "tool": claim["tool"], "version": claim.get("version"), "source": "marker"}
        out.setdefault("marker_problem", f"its sha256 {claim.get('sha256') if isinstance(claim, dict) else None} "
                                         "is not the file's: identified by content")
    name, version = _by_content(real)
    return {**out, "tool": name, "version": version, "source": "content"}


def plugin_path(tool: str, shim_dir: Path) -> str | None:
    """The PATH under which CRIU's CUDA plugin finds ``tool`` as ``cuda-checkpoint``: None (CRIU's own
    PATH) for the plain name, else ``shim_dir`` (a ``cuda-checkpoint`` that runs ``tool``) first."""
    if tool == PLUGIN_RUNS:
        return None
    target = _where(tool)
    if target is None:
        return None
    shim_dir.mkdir(parents=True, exist_ok=True)
    shim = shim_dir / PLUGIN_RUNS
    command = " ".join(f"'{part}'" for part in argv(str(target.resolve())))
    shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    shim.chmod(0o755)
    return f"{shim_dir}{os.pathsep}{os.environ.get('PATH', '')}"
