"""Run one playbook for one trial phase through ansible-runner and describe what happened.

The only module that imports ``ansible_runner``. An Ansible failure, an unreachable host, a phase
timeout or a cancel is returned as data (``PhaseResult`` with ``Failure`` records), never raised.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from runner.supervise import LEASE_VARIABLE, reap

__all__ = ["Failure", "PhaseResult", "run_phase"]

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Failure:
    """Why a phase failed: ``kind`` is failed | unreachable | timeout | canceled | error."""

    kind: str
    phase: str
    host: str = ""
    task: str = ""
    message: str = ""
    rc: int | None = None

    def one_line(self) -> str:
        where = f"{self.host}: " if self.host else ""
        task = f"task '{self.task}': " if self.task else ""
        rc = f" (rc={self.rc})" if self.rc is not None else ""
        return f"{self.kind} in phase {self.phase}: {where}{task}{self.message}{rc}".strip()


@dataclass(frozen=True)
class PhaseResult:
    name: str
    status: str  # successful | failed | timeout | canceled
    rc: int | None
    started: float
    ended: float
    artifact_dir: str
    failures: list[Failure] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "successful"

    @property
    def duration_s(self) -> float:
        return round(self.ended - self.started, 3)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["duration_s"] = self.duration_s
        return d


def _message_of(res: dict[str, Any]) -> tuple[str, int | None]:
    msg = str(res.get("msg") or "").strip()
    rc = res.get("rc")
    stderr = str(res.get("stderr") or "").strip()
    if stderr:
        last = stderr.splitlines()[-1]
        msg = f"{msg}: {last}" if msg and last not in msg else (msg or last)
    if not msg:
        lines = str(res.get("stdout") or "").strip().splitlines()
        msg = lines[-1] if lines else ""
    return (msg or "no message"), (rc if isinstance(rc, int) else None)


# Environment variables whose values may stay in the ``command`` artifact; every other value is
# replaced (a controller's DB_PASS or CI token must not land in a results folder).
_ENV_KEPT = ("PATH", "PYTHONPATH", "HOME", "USER", "LANG", "LC_ALL", "PWD", "SHELL", "TERM", LEASE_VARIABLE)


def _scrub_command_artifact(artifact_dir: Path) -> None:
    """ansible-runner dumps the whole environment into ``command``: keep names, drop values."""
    path = artifact_dir / "command"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    env = data.get("env")
    if isinstance(env, dict):
        data["env"] = {k: (v if k in _ENV_KEPT or k.startswith("ANSIBLE_") else "***") for k, v in env.items()}
        path.write_text(json.dumps(data))


class _UnsafeDumper(yaml.SafeDumper):
    """Every string as ``!unsafe``: Ansible never templates a value that came from a campaign file."""


def _unsafe_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "{" not in value and "%" not in value:  # nothing Jinja could start with: plain (Ansible
        return dumper.represent_str(value)       # reads an empty !unsafe scalar as null)
    return dumper.represent_scalar("!unsafe", value, style="'")


def _plain_keys(dumper: yaml.SafeDumper, value: dict[Any, Any]) -> yaml.MappingNode:
    # Keys are never templated; the values under them are tagged one by one.
    pairs = [(dumper.represent_str(k) if isinstance(k, str) else dumper.represent_data(k), dumper.represent_data(v))
             for k, v in value.items()]
    return yaml.MappingNode("tag:yaml.org,2002:map", pairs)


_UnsafeDumper.add_representer(str, _unsafe_str)
_UnsafeDumper.add_representer(dict, _plain_keys)


def write_extravars(private_data_dir: Path, extravars: dict[str, Any]) -> Path:
    """Extra vars go to ``env/extravars`` (ansible-runner passes ``-e @file``), never on a command
    line that ``ps`` shows, each string tagged ``!unsafe`` so a ``{{ lookup('pipe', ...) }}`` in a
    campaign arrives as text and is never run."""
    path = private_data_dir / "env" / "extravars"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.dump(extravars, fh, Dumper=_UnsafeDumper, default_flow_style=False, sort_keys=True)
    return path


def host_key_checking(project_dir: Path) -> str:
    """The host-key rule the run must keep: the environment's ``ANSIBLE_HOST_KEY_CHECKING``, else
    ``host_key_checking`` of the project's ansible.cfg, else Ansible's default (check).

    ansible-runner sets ``ANSIBLE_HOST_KEY_CHECKING=False`` whenever the environment lacks it,
    which would silently override ansible.cfg and trust any host key: the runner passes it always."""
    if os.environ.get("ANSIBLE_HOST_KEY_CHECKING"):
        return os.environ["ANSIBLE_HOST_KEY_CHECKING"]
    cfg = configparser.ConfigParser(interpolation=None)
    with contextlib.suppress(OSError, configparser.Error):
        cfg.read(project_dir / "ansible.cfg")
    return cfg.get("defaults", "host_key_checking", fallback="True").strip() or "True"


def _envvars(project_dir: Path, lease: str = "") -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    # Node-side programs (python -m nodetools.*) on a local connection import this checkout even
    # where it is not pip-installed (the borrowed H200 runs the runner from a copied tree).
    pythonpath = [str(project_dir), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {"PATH": path if path.split(os.pathsep)[:1] == [bindir] else f"{bindir}{os.pathsep}{path}",
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(pythonpath)),
            LEASE_VARIABLE: lease, "ANSIBLE_HOST_KEY_CHECKING": host_key_checking(project_dir)}


def run_phase(
    *,
    phase: str,
    playbook: Path,
    project_dir: Path,
    private_data_dir: Path,
    inventory: Path,
    limit: str,
    extravars: dict[str, Any],
    timeout_s: float,
    cancel: threading.Event,
    lease: str = "",
    on_task: Callable[[str], None] | None = None,
) -> PhaseResult:
    """Run ``playbook`` against ``limit``; every outcome comes back as a ``PhaseResult``.

    ``lease`` marks every process of the run (ansible-playbook, its forked workers, which leave its
    process group, and what they start on a local connection), so ``supervise.reap`` finds them."""
    private_data_dir.mkdir(parents=True, exist_ok=True)
    write_extravars(private_data_dir, extravars)
    failures: list[Failure] = []

    def on_event(event: dict[str, Any]) -> bool:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_task_start" and on_task is not None:
            on_task(str(data.get("task", "")))
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            msg, rc = _message_of(data.get("res") or {})
            failures.append(Failure("failed", phase, data.get("host", ""), data.get("task", ""), msg, rc))
        elif kind == "runner_on_unreachable":
            msg, _ = _message_of(data.get("res") or {})
            failures.append(Failure("unreachable", phase, data.get("host", ""), data.get("task", ""), msg))
        return True

    started = time.time()
    logger.debug("phase %s: %s on %s", phase, playbook, limit)
    try:
        r = ansible_runner.run(
            private_data_dir=str(private_data_dir),
            project_dir=str(project_dir),
            playbook=str(playbook),
            inventory=str(inventory),
            limit=limit,
            ident=phase,
            envvars=_envvars(project_dir, lease),
            quiet=True,
            timeout=max(1, round(timeout_s)),
            event_handler=on_event,
            cancel_callback=cancel.is_set,
        )
    except Exception as exc:  # a broken run is a recorded failure, not a crash (logged with its traceback)
        logger.exception("ansible-runner could not run phase %s", phase)
        return PhaseResult(phase, "failed", None, started, time.time(), "",
                           [Failure("error", phase, limit, "", f"ansible-runner: {exc}")])
    ended = time.time()
    if lease and str(r.status) in ("timeout", "canceled", "failed"):
        # ansible-runner kills ansible-playbook's process group, but its workers called setsid:
        # without this their task (and what it started) runs on, orphaned, for the task's length.
        reap(lease, exact=True)
    artifact_dir = Path(r.config.artifact_dir)
    _scrub_command_artifact(artifact_dir)
    status = str(r.status)
    if status == "timeout":
        failures.append(Failure("timeout", phase, limit, "", f"phase ran past its {timeout_s:g} s limit"))
    elif status == "canceled":
        failures.append(Failure("canceled", phase, limit, "", "stopped by the user"))
    elif status != "successful" and not failures:
        tail = (artifact_dir / "stdout").read_text(errors="replace").strip().splitlines()[-3:]
        failures.append(Failure("failed", phase, limit, "", " | ".join(tail) or "ansible-playbook failed", r.rc))
    return PhaseResult(phase, status, r.rc, started, ended, str(artifact_dir), failures, dict(r.stats or {}))
