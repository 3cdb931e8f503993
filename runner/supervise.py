"""Find and stop the controller-side processes a run left behind.

Every process a phase starts carries ``GPU_CAMPAIGN_LEASE=<results id>:<runner pid>:<trial>`` in
its environment: ansible-playbook, its forked workers (which call ``setsid`` and so escape the
process group that ansible-runner kills on a cancel or timeout), ssh, and on a local connection
the node tools and engines. After a phase is cancelled the trial's lease is reaped; at the start
of a run (holding the results folder's lock, so nothing else can own them) every process with
the folder's id is an orphan of an earlier run that was killed, and is stopped before anything
new starts, so none of its events lands in the next attempt's folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import time
from pathlib import Path

__all__ = ["LEASE_VARIABLE", "lease_id", "reap", "results_id"]

LEASE_VARIABLE = "GPU_CAMPAIGN_LEASE"

logger = logging.getLogger(__name__)


def results_id(root: Path) -> str:
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]


def lease_id(root: Path, trial: str) -> str:
    return f"{results_id(root)}:{os.getpid()}:{trial}"


def _lease_of(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    key = LEASE_VARIABLE.encode() + b"="
    for item in environ.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None


def _holders(lease: str, exact: bool) -> list[int]:
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        value = _lease_of(int(entry.name))
        if value is not None and (value == lease if exact else value.startswith(lease)):
            out.append(int(entry.name))
    return out


def reap(lease: str, *, exact: bool = False, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process whose lease is ``lease`` (or starts with it), SIGKILL what is left
    after ``grace_s``; returns the pids that were found."""
    pids = _holders(lease, exact)
    if not pids:
        return []
    logger.info("stopping %d process(es) left by an earlier or cancelled run: %s", len(pids), pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)  # a stopped process must be able to die
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
