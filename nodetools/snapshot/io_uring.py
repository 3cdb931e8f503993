"""``kernel.io_uring_disabled=2`` for an engine's whole life, and put back afterwards whatever happens.

CRIU cannot dump io_uring, and vLLM's API server maps one when it may ("Unknown shit 600
(anon_inode:[io_uring])" in dump.log). With the sysctl at 2, ``io_uring_setup`` fails for every
process and the libraries fall back to epoll, so it must be set before the engine starts: an
engine started before keeps its ring. The previous value goes into the tool's lease
(``restore_on_reap``) before the sysctl is written, so ``python -m nodetools.reap`` puts it back
when the tool is killed; the tool itself puts it back after its engine has stopped, also after a
failure. Kernels before 6.6 have no such sysctl: that is recorded and the trial goes on (an
engine that maps io_uring then fails the dump, and the reason says so).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nodetools.lease import Lease

__all__ = ["DISABLED", "SYSCTL", "IoUringOff"]

SYSCTL = Path("/proc/sys/kernel/io_uring_disabled")
NAME = "kernel.io_uring_disabled"
DISABLED = "2"  # 1 would still let root (and the io_uring group) create rings: the engine runs as root


class IoUringOff:
    """Switch io_uring off (``disable``) and back (``restore``), recording both in ``record``."""

    def __init__(self, lease: Lease | None, sysctl: Path = SYSCTL) -> None:
        self.lease = lease
        self.sysctl = sysctl
        self.previous: str | None = None
        self.record: dict[str, Any] = {"sysctl": NAME}

    def disable(self) -> str:
        """Set the sysctl; '' when done or when this kernel has none (recorded), else why not."""
        if not self.sysctl.exists():
            self.record.update(available=False, why=f"kernel {os.uname().release} has no {NAME} (Linux >= 6.6): "
                                                    "io_uring cannot be switched off; an engine that maps one "
                                                    "fails the dump")
            return ""
        previous = self.sysctl.read_text().strip()
        self.record.update(available=True, previous=previous)
        if previous == DISABLED:
            self.record["during_engine"] = DISABLED
            return ""
        self._note_in_lease(previous)
        try:
            self.sysctl.write_text(f"{DISABLED}\n")
        except OSError as exc:
            self._note_in_lease(None)
            return f"cannot set {NAME}={DISABLED} ({exc}): the criu mode needs root"
        self.previous = previous
        self.record["during_engine"] = self.sysctl.read_text().strip()
        return ""

    def restore(self) -> None:
        """Put the previous value back (after the engine stopped); a no-op when nothing was changed."""
        if self.previous is None:
            return
        try:
            self.sysctl.write_text(f"{self.previous}\n")
            self.record["restored"] = self.sysctl.read_text().strip()
        except OSError as exc:
            self.record["restore_error"] = f"{NAME} left at {DISABLED}: {exc}"
            return
        self.previous = None
        self._note_in_lease(None)

    def _note_in_lease(self, previous: str | None) -> None:
        """What the reaper must put back if this tool is killed: ``restore_on_reap`` in the lease."""
        if self.lease is not None:
            entries = [] if previous is None else [{"path": str(self.sysctl), "value": previous, "what": NAME}]
            self.lease.set_restore_on_reap([str(self.sysctl)], entries)
