"""What a trial runs on its node, planned in Python before anything runs.

A kind's ``node_plan`` turns a trial into a :class:`NodePlan`: the engine's launch (the exact argv
and environment the node will exec, rendered by :mod:`runner.experiments.launch`), the node-tool
command of each playbook task, and a reason to skip where one is known before the node is asked.
``--plan --json`` shows it (``launch`` and ``node`` of every trial); the runner passes it to the
playbooks as ``exp_node``, which only run what it holds. One place for every default: the kinds'
parameter models and the functions here, never the playbooks.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NODE_WAIT_MARGIN_S", "NodePaths", "NodePlan", "cleanup_argv", "engine_python", "launch_spec",
           "make_model_argv", "node_wait_s", "reap_argv", "to_json"]

# A node program's own wait ends this long before its phase's limit, so it always stops the engine
# and writes its record before Ansible's timeout would kill it (never below 10 s).
NODE_WAIT_MARGIN_S = 30.0
_MIN_NODE_WAIT_S = 10.0
_CONTAINER_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def to_json(value: Any) -> str:
    """The compact JSON a node tool's option takes (what ``--plan`` shows is what the node parses)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def node_wait_s(timeout_s: float) -> float:
    return max(float(timeout_s) - NODE_WAIT_MARGIN_S, _MIN_NODE_WAIT_S)


@dataclass(frozen=True)
class NodePaths:
    """The names a trial uses on its node, from its folder (``remote_dir``) and the node's Python."""

    work_dir: str
    python: str  # a Python with this repository's nodetools
    trial_id: str

    @property
    def lease_dir(self) -> str:
        # The node tools' leases: one folder per campaign and host, beside the trials' folders.
        return posixpath.join(posixpath.dirname(self.work_dir), ".leases")

    @property
    def answers_dir(self) -> str:
        # Answers a node tool keeps for the campaign's later trials on this host (nodetools/vllm_cli.py).
        return posixpath.join(posixpath.dirname(self.work_dir), ".answers")

    def file(self, name: str) -> str:
        return posixpath.join(self.work_dir, name)

    @property
    def container(self) -> str:
        return "gpu-campaign-" + _CONTAINER_UNSAFE.sub("-", self.trial_id)


@dataclass(frozen=True)
class NodePlan:
    """``launch``: the engine's (or the first copy's) argv, env, stop_argv, container, caches, port,
    model and gpus, plus ``secret_env``, the names whose values the node gets from the controller
    (never the values); ``copies``: every copy's launch where a trial starts several engines;
    ``commands``: the argv of each node program, by the step that runs it; ``skip``: why the trial
    is skipped before anything runs on the node ("" when it is not)."""

    launch: Mapping[str, Any] | None = None
    copies: tuple[Mapping[str, Any], ...] = ()
    commands: Mapping[str, Sequence[str]] = field(default_factory=dict)
    skip: str = ""
    files: tuple[str, ...] = ()  # the trial's files on the node that the collect fetches

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"launch": dict(self.launch) if self.launch else None,
                               "commands": {k: list(v) for k, v in self.commands.items()}, "skip": self.skip,
                               "files": list(self.files)}
        if self.copies:
            out["copies"] = [dict(c) for c in self.copies]
        return out


def engine_python(engine: Mapping[str, Any], node_python: str) -> str:
    """The Python that runs the engine: the campaign's ``engine.python``, its venv's, else the node tools'."""
    if engine.get("python"):
        return str(engine["python"])
    if engine.get("venv"):
        return f"{str(engine['venv']).rstrip('/')}/bin/python"
    return node_python


def launch_spec(launch: Mapping[str, Any], engine: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The launch file's content: the rendered launch plus the port, the served model and the GPUs
    the timer waits on, and the names of the secrets the node adds to its environment."""
    return {**launch, "port": int(engine["port"]),
            "model": str(engine.get("served_model_name") or engine.get("model") or ""),
            "gpus": list(engine.get("gpus") or []), "secret_env": sorted(engine.get("env_from_controller") or []),
            **extra}


def reap_argv(paths: NodePaths, clear_users: bool = False) -> list[str]:
    """Stop what an earlier, killed attempt left running (its leases) and empty the trial's folder."""
    argv = [paths.python, "-m", "nodetools.reap", "--root", paths.lease_dir, "--clear", paths.work_dir]
    return [*argv, "--clear-users"] if clear_users else argv


def cleanup_argv(paths: NodePaths, port: int) -> list[str]:
    """Stop an engine group or container a killed timer left behind; say whether the port is free."""
    return [paths.python, "-m", "nodetools.coldstart", "cleanup", "--dir", paths.work_dir, "--port", str(port),
            "--container", paths.container, "--trial", paths.trial_id, "--lease-dir", paths.lease_dir]


def make_model_argv(paths: NodePaths, engine: Mapping[str, Any], extra: Sequence[str] = ()) -> list[str]:
    """The program that makes ``engine.model`` where no model is there ([] when none is made): the
    stand-in's random-weights model, or a rehearsal model for vLLM."""
    model = str(engine.get("model") or "")
    if (engine.get("kind") or "stand-in") == "stand-in":
        return [paths.python, "-m", "nodetools.standin", "make-model", model,
                "--size-mib", str(engine["standin_model_mib"])]
    if engine.get("rehearsal_model"):
        return [paths.python, "-m", "nodetools.model_maker", model, "--preset", str(engine["rehearsal_model"]),
                *extra]
    return []
