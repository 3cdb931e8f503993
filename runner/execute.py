"""Run one playbook for one trial phase through ansible-runner and describe what happened.

The only module that imports ``ansible_runner``. An Ansible failure, an unreachable host, a phase
timeout or a cancel is returned as data (``PhaseResult`` with ``Failure`` records), never raised.
ansible-runner writes the whole environment it runs ansible-playbook with (the engine's secrets
included: runner/secrets.py) to ``artifacts/<phase>/command``: its values are dropped the moment
the file is written, before ansible-playbook starts, and again by :func:`scrub_command_artifacts`
when a run begins (a runner killed in between). The artefacts get the results folder's modes when
the phase ends.
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
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from runner.errors import ResultsWriteError
from runner.files import atomic_write_text, share_tree
from runner.inventory import InventorySources
from runner.supervise import LEASE_VARIABLE, reap

__all__ = ["Failure", "PhaseResult", "RunningPhase", "run_phase", "scrub_command_artifacts", "start_phase"]

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


_DROPPED = "***"
_MAX_COMMAND_BYTES = 16 * 1024 * 1024


def _scrub_command_file(path: Path) -> bool:
    """ansible-runner dumps the whole environment into ``command``: keep names, drop values (a
    value already dropped stays so). True when it held a value to drop."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _MAX_COMMAND_BYTES:
            return False
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        return False
    scrubbed = {k: (v if k in _ENV_KEPT or str(k).startswith("ANSIBLE_") else _DROPPED) for k, v in env.items()}
    if scrubbed == env:
        return False
    data["env"] = scrubbed
    try:
        atomic_write_text(path, json.dumps(data))
    except ResultsWriteError:  # a full disk: the file is scrubbed again when the run resumes
        logger.warning("could not rewrite %s without its environment's values", path)
        return False
    return True


def _scrub_command_artifact(artifact_dir: Path) -> None:
    _scrub_command_file(artifact_dir / "command")


# Where a results folder keeps ansible-runner's private data dirs: trials/<id>/ansible, previous/<id>.<stamp>/ansible,
# hosts/<host>/ansible (the facts, where an older runner read them in a run of their own) and
# hosts/<host>/probe (the liveness probe).
_PRIVATE_DATA_DIRS = ("trials/*/ansible", "previous/*/ansible", "hosts/*/ansible", "hosts/*/probe")


def scrub_command_artifacts(root: Path) -> list[Path]:
    """Drop the environment's values from every ``command`` artifact of the results folder ``root``:
    what a runner killed while a phase ran (or an older runner) left behind. The files it changed."""
    changed = []
    for pattern in _PRIVATE_DATA_DIRS:
        for path in root.glob(f"{pattern}/artifacts/*/command"):
            if _scrub_command_file(path):
                changed.append(path)
    return changed


def _on_status(data: dict[str, Any], runner_config: Any = None) -> None:
    """ansible-runner's status handler: "running" comes right after it wrote ``command`` and before
    it starts ansible-playbook, so the environment's values are gone before the playbook's first task."""
    if data.get("status") == "running" and runner_config is not None:
        _scrub_command_artifact(Path(runner_config.artifact_dir))


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


def write_playbook_chain(private_data_dir: Path, phase: str, playbooks: list[Path]) -> Path:
    """A playbook that imports ``playbooks`` in order, so one ansible-playbook runs them all (its
    start, 1-2 s of CPU, paid once); a host that fails one is left out of the ones after it. The
    paths are written as the extra vars are (``!unsafe`` where Jinja could start): a folder's name is
    never templated."""
    path = private_data_dir / f"{phase}-playbooks.yml"
    text = yaml.dump([{"ansible.builtin.import_playbook": str(p)} for p in playbooks], Dumper=_UnsafeDumper,
                     default_flow_style=False, sort_keys=False)
    atomic_write_text(path, "---\n" + text)
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


class RunningPhase:
    """A phase whose ansible-playbook runs in the background (:func:`start_phase`); :meth:`wait`
    returns its ``PhaseResult``. The runner starts the next trial's run this way while the current
    one collects (its first task waits for its turn: runner/overlap.py)."""

    def __init__(self, phase: str, limit: str, timeout_s: float, lease: str, started: float) -> None:
        self.phase, self.limit, self.timeout_s, self.lease, self.started = phase, limit, timeout_s, lease, started
        self.failures: list[Failure] = []
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._error = ""

    def on_event(self, event: dict[str, Any], on_task: Callable[[str], None] | None) -> bool:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_task_start" and on_task is not None:
            on_task(str(data.get("task", "")))
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            msg, rc = _message_of(data.get("res") or {})
            self.failures.append(Failure("failed", self.phase, data.get("host", ""), data.get("task", ""), msg, rc))
        elif kind == "runner_on_unreachable":
            msg, _ = _message_of(data.get("res") or {})
            self.failures.append(Failure("unreachable", self.phase, data.get("host", ""), data.get("task", ""), msg))
        return True

    def wait(self) -> PhaseResult:
        """Block until the run ends; every outcome comes back as a ``PhaseResult``."""
        if self._thread is not None:
            self._thread.join()
        r = self._runner
        if self._error or r is None or r.status is None:
            error = self._error or "ansible-runner did not start the playbook"
            return PhaseResult(self.phase, "failed", None, self.started, time.time(), "",
                               [Failure("error", self.phase, self.limit, "", f"ansible-runner: {error}")])
        ended = time.time()
        if self.lease and str(r.status) in ("timeout", "canceled", "failed"):
            # ansible-runner kills ansible-playbook's process group, but its workers called setsid:
            # without this their task (and what it started) runs on, orphaned, for the task's length.
            reap(self.lease, exact=True)
        artifact_dir = Path(r.config.artifact_dir)
        _scrub_command_artifact(artifact_dir)  # already done at its start: a guard
        share_tree(artifact_dir.parent.parent)  # the private data dir: shared as the results folder is
        status = str(r.status)
        failures = list(self.failures)
        if status == "timeout":
            failures.append(Failure("timeout", self.phase, self.limit, "",
                                    f"phase ran past its {self.timeout_s:g} s limit"))
        elif status == "canceled":
            failures.append(Failure("canceled", self.phase, self.limit, "", "stopped by the user"))
        elif status != "successful" and not failures:
            tail = (artifact_dir / "stdout").read_text(errors="replace").strip().splitlines()[-3:]
            failures.append(Failure("failed", self.phase, self.limit, "", " | ".join(tail) or "ansible-playbook failed",
                                    r.rc))
        return PhaseResult(self.phase, status, r.rc, self.started, ended, str(artifact_dir), failures,
                           dict(r.stats or {}))


def start_phase(
    *,
    phase: str,
    playbook: Path,
    project_dir: Path,
    private_data_dir: Path,
    inventory: Path | InventorySources,
    limit: str,
    extravars: dict[str, Any],
    timeout_s: float,
    cancel: Callable[[], bool],
    lease: str = "",
    on_task: Callable[[str], None] | None = None,
    before: Path | None = None,
) -> RunningPhase:
    """Start ``playbook`` against ``limit`` in the background; ``wait()`` on the result. ``before``:
    a playbook run first in the same ansible-playbook (:func:`write_playbook_chain`).

    ``lease`` marks every process of the run (ansible-playbook, its forked workers, which leave its
    process group, and what they start on a local connection), so ``supervise.reap`` finds them; a
    run given none gets one of its own, so a cancel or a timeout still stops all of it."""
    lease = lease or f"phase:{os.getpid()}:{uuid.uuid4().hex}"
    private_data_dir.mkdir(parents=True, exist_ok=True)
    write_extravars(private_data_dir, extravars)
    if before is not None:
        playbook = write_playbook_chain(private_data_dir, phase, [before, playbook])
    running = RunningPhase(phase, limit, timeout_s, lease, time.time())
    logger.debug("phase %s: %s on %s", phase, playbook, limit)
    if isinstance(inventory, Path):
        inventory = InventorySources((str(inventory),))
    # A list, never a str: ansible-runner writes a str that is not a path ("h1,h2,") into an INI file.
    kwargs = dict(
        private_data_dir=str(private_data_dir), project_dir=str(project_dir), playbook=str(playbook),
        inventory=list(inventory.sources), limit=limit, ident=phase, quiet=True,
        envvars={**_envvars(project_dir, lease), **inventory.ansible_env()},
        timeout=max(1, round(timeout_s)), event_handler=lambda event: running.on_event(event, on_task),
        cancel_callback=cancel, status_handler=_on_status,
    )

    def run() -> None:
        try:
            running._runner = ansible_runner.run(**kwargs)
        except Exception as exc:  # a broken run is a recorded failure, not a crash (its traceback with -v)
            logger.debug("ansible-runner could not run phase %s", phase, exc_info=True)
            running._error = str(exc)

    # ansible_runner.run in a thread of ours, not run_async: an exception it raises (a full disk)
    # must end the run as a failure, where run_async's thread would die and leave its status pending.
    running._thread = threading.Thread(target=run, name=f"phase-{phase}", daemon=True)
    running._thread.start()
    return running


def run_phase(*, cancel: threading.Event, **kwargs: Any) -> PhaseResult:
    """``start_phase`` and wait for it: every outcome comes back as a ``PhaseResult``."""
    return start_phase(cancel=cancel.is_set, **kwargs).wait()
