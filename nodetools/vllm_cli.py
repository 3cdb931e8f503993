"""vLLM's command line as a launch file holds it: the command before ``serve``, and whether that
vLLM has another subcommand (``preload``, ``snapshot``) — run it with ``--help`` and the engine's
environment, since a vLLM installed with ``--target`` is only found on the engine's PYTHONPATH.

Asking costs vLLM's imports (28 s on the H200, once per trial), so two cheaper answers come first:
vLLM's CLI defines its subcommands in ``vllm/entrypoints/cli/`` (``name = "serve"``, ...), so a
name quoted in none of those files is no subcommand of that install (read in milliseconds, and as
definite as its parser's refusal); and with ``answers`` (a folder of the campaign's on the node) an
answer once asked is kept there, keyed by the command, the engine's PYTHONPATH and the modification
times of those paths (an install or upgrade of vLLM changes them), so a mode's later repeats do not
ask again.

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from nodetools.proc import launch_env, run_captured, write_json_atomic

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


def _python_folders(command: str, env: dict[str, str]) -> list[str]:
    """Where the command's Python finds vLLM, in its order: the engine's PYTHONPATH folders, then
    the site folders beside the interpreter (or beside a venv's ``vllm`` script)."""
    roots = [Path(command).parent.parent, Path(os.path.realpath(command)).parent.parent]
    sites = sorted({str(p) for root in roots for p in root.glob("lib/python3*/site-packages")})
    return [*(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p), *sites]


def _install_paths(vllm: list[str], env: dict[str, str]) -> list[str]:
    """Paths whose modification times change when vLLM is installed, upgraded or removed: the
    command (a venv's ``vllm`` script is rewritten), the interpreter and the site folders beside
    it, every PYTHONPATH folder (``pip --target`` replaces entries there), and vLLM's CLI folder
    in each of them."""
    command = shutil.which(vllm[0]) or vllm[0]
    folders = _python_folders(command, env)
    return [command, os.path.realpath(command), *folders,
            *(str(Path(f) / "vllm" / "entrypoints" / "cli") for f in folders)]


def _answer_file(answers: Path, vllm: list[str], env: dict[str, str], subcommand: str) -> Path:
    """Where the answer for this command and install is kept: the key changes with either."""
    paths = _install_paths(vllm, env)
    stamps = []
    for path in paths:
        try:
            stamps.append(Path(path).stat().st_mtime_ns)
        except OSError:
            stamps.append(None)
    key = json.dumps({"argv": vllm, "pythonpath": env.get("PYTHONPATH", ""), "paths": paths, "mtimes": stamps})
    return answers / f"vllm-{subcommand}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def subcommand_reasons(launch: dict[str, Any], subcommand: str, mode: str, answers: Path | None = None) -> list[str]:
    """Why the launch's vLLM cannot run ``subcommand`` (each reason names the command), or nothing;
    with ``answers``, asked once per install and kept in that folder."""
    vllm, _, why = serve_split(launch, mode)
    if why:
        return [why]
    shown = f"'{' '.join(vllm)} {subcommand}'"
    if shutil.which(vllm[0]) is None:
        return [f"{shown} is not available: {vllm[0]} not found"]
    env = launch_env(launch)
    unknown = _not_in_cli_source(vllm, env, subcommand)
    if unknown:
        return [f"{shown} is not available (this vLLM has no {subcommand} command): {unknown}"]
    kept = _answer_file(answers, vllm, env, subcommand) if answers is not None else None
    if kept is not None:
        try:
            return [str(r) for r in json.loads(kept.read_text())["reasons"]]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    reasons, definite = _ask(vllm, subcommand, shown, env)
    if kept is not None and definite:
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(kept, {"command": [*vllm, subcommand, "--help"], "reasons": reasons, "asked": time.time()})
    return reasons


_LOCATE_VLLM = ("import importlib.util as u; s = u.find_spec('vllm'); "
                "print((s.submodule_search_locations or [''])[0] if s else '')")


def _engine_python(vllm: list[str]) -> str:
    """The interpreter the command runs: ``PYTHON -m vllm...``, or a ``vllm`` script's shebang."""
    if len(vllm) >= 2 and vllm[1] == "-m":
        return vllm[0]
    script = shutil.which(vllm[0])
    try:
        with Path(script or vllm[0]).open("rb") as fh:
            first = fh.readline(512).decode(errors="replace")
    except OSError:
        return ""
    words = first[2:].split() if first.startswith("#!") else []
    if words and Path(words[0]).name == "env":
        words = words[1:]
    return words[0] if words else ""


def _cli_folder(vllm: list[str], env: dict[str, str]) -> Path | None:
    """The ``vllm/entrypoints/cli`` folder the command imports, as its own interpreter finds the
    package with the engine's environment (``find_spec`` of a top-level name imports nothing: tens
    of milliseconds); None when it cannot say (then vLLM is asked)."""
    python = _engine_python(vllm)
    if not python:
        return None
    try:
        done = run_captured([python, "-c", _LOCATE_VLLM], 60, env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    cli = Path(done.stdout.strip()) / "entrypoints" / "cli" if done.returncode == 0 and done.stdout.strip() else None
    return cli if cli is not None and (cli / "main.py").is_file() else None


def _not_in_cli_source(vllm: list[str], env: dict[str, str], subcommand: str) -> str:
    """Why ``subcommand`` is certainly no subcommand of this vLLM, read from its CLI's source: its
    name quoted in none of the files there; empty when it may be one (or the source was not found)."""
    cli = _cli_folder(vllm, env)
    if cli is None:
        return ""
    quoted = (f'"{subcommand}"', f"'{subcommand}'")
    for source in sorted(cli.rglob("*.py")):
        try:
            text = source.read_text(errors="replace")
        except OSError:
            return ""
        if any(q in text for q in quoted):
            return ""
    versions = sorted(p.name[len("vllm-"):-len(".dist-info")] for p in cli.parents[2].glob("vllm-*.dist-info"))
    version = f"vLLM {versions[-1]}, " if versions else ""
    return f"no '{subcommand}' in its command line's source ({version}{cli})"


def _ask(vllm: list[str], subcommand: str, shown: str, env: dict[str, str]) -> tuple[list[str], bool]:
    """``VLLM SUBCOMMAND --help`` with the engine's environment: (reasons, empty when it answers;
    whether the answer is definite: it answered, or its argument parser refused the subcommand,
    never a crash or a time-out, which are kept for no later trial)."""
    try:
        done = run_captured([*vllm, subcommand, "--help"], HELP_TIMEOUT_S, env)
    except subprocess.TimeoutExpired:
        return [f"{shown} did not answer --help within {HELP_TIMEOUT_S} s"], False
    if done.returncode == 0:
        return [], True
    said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    last = said[-1] if said else f"exit {done.returncode}"
    return [f"{shown} is not available (this vLLM has no {subcommand} command): {last}"], "invalid choice" in last
