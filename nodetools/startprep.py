"""``nodetools.coldstart prepare``: put the node in a startup mode's state, in one step.

One node program for everything before the start, because every program a playbook runs costs a
module run and a Python start (0.4-0.8 s each on the H200, where a trial ran five before the
timer): :func:`before_prepare` first stops what an earlier, killed attempt left (the stale leases
of the host's campaign folder, ``nodetools.reap``) and empties the trial's folder, makes the model
when its folder has no ``config.json``, and checks the mode's preconditions (``nodetools.preflight``,
from the launch itself: its port, GPUs, PYTHONPATH and vLLM command); an unmet one is a reason to
skip and nothing more changes. Then :func:`prepare`: an emptied trial folder and fresh cache, the
persistent caches emptied when the mode starts from nothing (``first_start``), the cache folders,
``launch.json``; then what the start begins from is read from disk (:mod:`nodetools.startstate`:
the caches' state, the engine's bytecode) into ``prepare.json`` (the timer copies it into
timings.json), and only then the page cache is dropped or the weights read into it. Each step's
seconds go to ``prepare_steps_s`` there. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodetools.import_profile import PROFILE_FILE
from nodetools.node_checks import check
from nodetools.proc import write_json_atomic
from nodetools.pycache import compile_into_prefix
from nodetools.reaper import reap
from nodetools.residency import drop, evict, warm
from nodetools.startstate import bytecode_state, cache_state
from nodetools.vllm_cli import subcommand_reasons

__all__ = ["LAUNCH", "PREPARED", "Checks", "PrepareError", "before_prepare", "drop_scope", "prepare"]

LAUNCH = "launch.json"  # the engine's launch, rendered by the playbook, written by prepare
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


class PrepareError(Exception):
    """Something before the start could not be done (a leftover that outlived SIGKILL, a model that
    could not be made): the trial fails with this message."""


@dataclass(frozen=True)
class Checks:
    """The mode's preconditions beyond what the launch says (its port, GPUs and PYTHONPATH): the
    engine's Python and a module the mode needs in it (or in ``docker_image``), paths that must
    exist, a vLLM subcommand the mode runs (``preload``)."""

    engine_python: str = ""
    python_module: str = ""
    exists: tuple[str, ...] = ()
    docker_image: str = ""
    vllm_subcommand: str = ""
    answers: Path | None = None  # where the vLLM subcommand's answer is kept (nodetools/vllm_cli.py)

    def reasons(self, launch: dict[str, Any]) -> list[str]:
        """Why the mode cannot start here, in words a user can act on (empty: it can)."""
        gpus = [int(g) for g in launch.get("gpus") or []]
        in_docker = bool(self.docker_image)
        pythonpath = str((launch.get("env") or {}).get("PYTHONPATH") or "")
        reasons = check(int(launch["port"]), gpus, 2048, list(self.exists), self.engine_python,
                        "" if in_docker else self.python_module, self.docker_image,
                        self.python_module if in_docker else "", pythonpath)
        if self.vllm_subcommand:
            reasons += subcommand_reasons(launch, self.vllm_subcommand, self.vllm_subcommand, self.answers)
        return reasons


def _make_model(model: str, argv: list[str]) -> list[str]:
    """Run ``argv`` (the model maker) when ``model`` has no config.json; what changed."""
    if not model or not argv or (Path(model) / "config.json").is_file():
        return []
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise PrepareError(f"could not make the model {model}: {said[0]}")
    return [f"made the model {model}"]


def before_prepare(launch: dict[str, Any], workdir: Path, leases: Path | None, model: str, make_model: list[str],
                   checks: Checks | None) -> tuple[list[str], list[str], dict[str, float]]:
    """Stop leftovers (``leases``) and empty the trial's folder, make the model, check the
    preconditions (``checks``), each only when given: (what changed, reasons to skip, seconds per
    step). The folder goes before any check, so a skip or a failure never fetches an earlier
    attempt's files as its own."""
    changed: list[str] = []
    steps: dict[str, float] = {}
    started = time.monotonic()
    if leases is not None:
        reaped = reap(leases)
        if reaped["still_running"]:
            raise PrepareError(f"an earlier attempt's processes outlived SIGKILL: {', '.join(reaped['still_running'])}")
        changed += [f"stopped {what}" for what in reaped["stopped"]]
        if workdir.exists() and len(workdir.resolve().parts) >= 3:  # <remote_dir>/<campaign>/<host>/<trial>
            shutil.rmtree(workdir)
            changed.append(f"emptied {workdir}")
        steps["reap_s"] = round(time.monotonic() - started, 3)
    if make_model:
        started = time.monotonic()
        changed += _make_model(model, make_model)
        steps["model_s"] = round(time.monotonic() - started, 3)
    reasons: list[str] = []
    if checks is not None:
        started = time.monotonic()
        reasons = checks.reasons(launch)
        steps["preconditions_s"] = round(time.monotonic() - started, 3)
    return changed, reasons, steps


def drop_scope(asked: str, engine_kind: str) -> str:
    """``auto``: a rehearsal (the stand-in, often on a shared machine) evicts only its model's files;
    a real engine's node is the campaign's alone, so the whole page cache goes, as the reference
    campaign dropped it."""
    if asked != "auto":
        return asked
    return "files" if engine_kind == "stand-in" else "global"


def prepare(workdir: Path, launch: dict[str, Any], fresh_cache: str, page_cache: str, model: str,
            empty_cache: bool = False, engine_python: str = "", bytecode_packages: tuple[str, ...] = (),
            drop_scope: str = "global", compile_bytecode: bool = False,
            keep: Path | None = None) -> tuple[list[str], dict[str, Any]]:
    """Put the node in the mode's state; returns what changed and what the start begins from
    (also written to ``prepare.json`` in ``workdir``). A page-cache drop is ``global`` (the whole
    machine's cache: right where the node is the campaign's alone) or ``files`` (only the model's
    files, evicted one by one: polite on a shared machine); ``before["page_cache"]`` says which ran.
    With ``compile_bytecode`` what the engine imports is compiled into its ``PYTHONPYCACHEPREFIX``
    first, once (``before["bytecode_compiled"]``: what, how long; not part of the start). ``keep``:
    the campaign's folder on the node where the bytecode state's look-up is kept across trials."""
    changed = []
    steps: dict[str, float] = {}
    started = time.monotonic()
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
    (workdir / LAUNCH).write_text(json.dumps(launch, indent=2, sort_keys=True) + "\n")
    changed.append("wrote launch.json")
    steps["folders_s"] = round(time.monotonic() - started, 3)
    started = time.monotonic()
    # Read before the page cache is dropped: these reads must not warm what the start reads.
    env = {str(k): str(v) for k, v in (launch.get("env") or {}).items()}
    compiled = None
    if compile_bytecode and engine_python:
        # What the campaign's earlier starts on this node imported (their profiles, beside this trial's folder).
        compiled = compile_into_prefix(engine_python, env, list(bytecode_packages),
                                       sorted(workdir.parent.glob(f"*/{PROFILE_FILE}")))
    if compiled is not None:
        steps["compile_bytecode_s"] = compiled.get("seconds", 0.0)
        started = time.monotonic()
        if compiled.get("compiled"):
            changed.append(f"compiled the engine's bytecode into {compiled['prefix']}")
    before = cache_state(caches, fresh_cache, container=bool(launch.get("container")))
    if compiled is not None:
        before["bytecode_compiled"] = compiled
    if engine_python and bytecode_packages:
        before["bytecode"] = bytecode_state(engine_python, env, list(bytecode_packages), keep=keep)
    steps["read_state_s"] = round(time.monotonic() - started, 3)
    started = time.monotonic()
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
    steps["page_cache_s"] = round(time.monotonic() - started, 3)
    before["prepare_steps_s"] = steps  # where the time before the start went (benchmarks/bench_trial_overhead.py)
    write_json_atomic(workdir / PREPARED, before)
    return changed, before
