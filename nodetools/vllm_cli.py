"""vLLM's command line as a launch file holds it: the command before ``serve``, and whether that
vLLM has another subcommand (``preload``, ``snapshot``) — run it with ``--help`` and the engine's
environment, since a vLLM installed with ``--target`` is only found on the engine's PYTHONPATH.

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from nodetools.proc import launch_env, run_captured

__all__ = ["HELP_TIMEOUT_S", "serve_split", "subcommand_reasons"]

HELP_TIMEOUT_S = 300  # `vllm X --help` imports vLLM (and torch): tens of seconds on a cold node


def serve_split(launch: dict[str, Any], mode: str) -> tuple[list[str], list[str], str]:
    """(the vLLM command before ``serve``, the model and flags after it, why there is none)."""
    argv = [str(a) for a in launch.get("argv") or []]
    if launch.get("container"):
        return [], [], f"{mode} runs vLLM as a process on the node (runtime: process), not in a container"
    if "serve" not in argv[:4]:
        return [], [], f"{mode} needs a vLLM serve command line (vllm serve MODEL ...), not {argv[:3]}"
    at = argv.index("serve")
    if at + 1 >= len(argv):
        return [], [], f"{mode} needs the model after serve, not {argv}"
    return argv[:at], argv[at + 1:], ""


def subcommand_reasons(launch: dict[str, Any], subcommand: str, mode: str) -> list[str]:
    """Why the launch's vLLM cannot run ``subcommand`` (each reason names the command), or nothing."""
    vllm, _, why = serve_split(launch, mode)
    if why:
        return [why]
    shown = f"'{' '.join(vllm)} {subcommand}'"
    if shutil.which(vllm[0]) is None:
        return [f"{shown} is not available: {vllm[0]} not found"]
    try:
        done = run_captured([*vllm, subcommand, "--help"], HELP_TIMEOUT_S, launch_env(launch))
    except subprocess.TimeoutExpired:
        return [f"{shown} did not answer --help within {HELP_TIMEOUT_S} s"]
    if done.returncode == 0:
        return []
    said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return [f"{shown} is not available (this vLLM has no {subcommand} command): "
            f"{said[-1] if said else f'exit {done.returncode}'}"]
