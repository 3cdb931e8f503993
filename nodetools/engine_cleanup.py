"""Stop what a killed engine timer left behind: the trial's leases, the engine's recorded group, its container.

The collect phases run it after every startup and offload trial (``coldstart cleanup``,
``offload_run cleanup``): a timer that ended normally left nothing, one that was killed may have
left its engine running. The group in ``engine.pgid`` (``PGID START``, written by
:class:`nodetools.timer.Timer`) is only stopped once its start time proves it is the engine's: a
reused pid is never signalled. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from nodetools.lease import default_lease_dir, default_trial
from nodetools.proc import group_is_ours, port_open, signal_group
from nodetools.reaper import reap, remove_container

__all__ = ["cleanup"]

PORT_FREE_WAIT_S = 30


def _recorded_group(pgid_file: Path) -> tuple[int, int | None] | None:
    """(group id, its leader's start time or None in an old one-number file) from ``engine.pgid``."""
    try:
        words = pgid_file.read_text().split()
        return int(words[0]), (int(words[1]) if len(words) > 1 else None)
    except (OSError, IndexError, ValueError):
        return None


def cleanup(workdir: Path, port: int, container: str = "", trial: str | None = None,
            lease_dir: Path | None = None, grace_s: float = 30) -> dict[str, Any]:
    """Stop what a killed timer left behind (the trial's leases, the engine group, the container);
    report the port. ``trial`` defaults to the folder's name, ``lease_dir`` to ``.leases`` beside it."""
    reaped = reap(lease_dir or default_lease_dir(workdir), trial or default_trial(workdir), grace_s)
    stopped = list(reaped["stopped"]) + [f"still running: {what}" for what in reaped["still_running"]]
    recorded = _recorded_group(workdir / "engine.pgid")
    if recorded is not None:
        pgid, start = recorded
        # Only a group whose leader is gone or started when recorded: a reused pid is never signalled.
        if start is not None and group_is_ours(pgid, start)[0]:
            signal_group(pgid, signal.SIGKILL)
            stopped.append(f"process group {pgid}")
    if remove_container(container):
        stopped.append(f"container {container}")
    deadline = time.monotonic() + PORT_FREE_WAIT_S
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"stopped": stopped, "port_free": not port_open(port)}
