"""What the kernel did while CRIU restored memory, and transparent huge pages for the restore.

CRIU's restorer reads a quiesced engine's memory in at 1-2 GB/s even from tmpfs (the H200's
restore logs): the time goes to faulting fresh pages in, 4 KiB at a time unless transparent huge
pages (THP) back them. So each restore records the ``/proc/vmstat`` counters that say how its pages
came in (faults, huge-page faults and fallbacks, shared-memory huge pages for the memfds a sleeping
engine's weights live in) as the difference across CRIU's restore call, and the THP settings it ran
under. ``--thp always|never`` sets THP for anonymous memory and for shared memory (``enabled`` and
``shmem_enabled``) for the restores, and puts the previous values back afterwards, also from the
reaper when the tool is killed (``restore_on_reap`` in its lease, as ``io_uring.py`` does).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nodetools.lease import Lease

__all__ = ["THP_CHOICES", "THP_DIR", "VMSTAT", "VMSTAT_KEYS", "ThpSetting", "read_thp", "read_vmstat", "vmstat_delta"]

VMSTAT = Path("/proc/vmstat")
THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")
# Faults and where their pages came from; thp_file_* count shared-memory (memfd, tmpfs) huge pages.
VMSTAT_KEYS = ("pgfault", "pgmajfault", "thp_fault_alloc", "thp_fault_fallback", "thp_file_alloc",
               "thp_file_fallback", "pgpgin", "pswpin", "compact_stall")
THP_FILES = ("enabled", "shmem_enabled", "defrag")
THP_CHOICES = ("leave", "always", "never")
_MAX_BYTES = 64 << 10  # /proc/vmstat is ~5 KB: read no more than this


def read_vmstat(path: Path = VMSTAT) -> dict[str, int]:
    """The counters of ``VMSTAT_KEYS`` this kernel has ({} when the file cannot be read)."""
    try:
        with path.open("rb") as fh:
            text = fh.read(_MAX_BYTES).decode("ascii", "replace")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in VMSTAT_KEYS and value.strip().isdigit():
            out[name] = int(value)
    return out


def vmstat_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Each counter's growth between two reads (the machine's, not only CRIU's: the node is the trial's)."""
    return {k: after[k] - before[k] for k in VMSTAT_KEYS if k in before and k in after}


def _chosen(text: str) -> str:
    """``always [madvise] never`` -> ``madvise``; a file without brackets is taken whole."""
    found = re.search(r"\[([^\]]+)\]", text)
    return found.group(1) if found else text.strip()


def read_thp(thp_dir: Path = THP_DIR) -> dict[str, str]:
    """The THP settings in force (``enabled``, ``shmem_enabled``, ``defrag``); absent files are left out."""
    out = {}
    for name in THP_FILES:
        try:
            out[name] = _chosen((thp_dir / name).read_text()[:512])
        except OSError:
            continue
    return out


class ThpSetting:
    """Set THP for anonymous and shared memory (``apply``) and put the previous values back (``restore``)."""

    def __init__(self, value: str, lease: Lease | None, thp_dir: Path = THP_DIR) -> None:
        if value not in THP_CHOICES:
            raise ValueError(f"thp must be one of {', '.join(THP_CHOICES)}, not {value!r}")
        self.value = value
        self.lease = lease
        self.thp_dir = thp_dir
        self.previous: dict[str, str] = {}
        self.record: dict[str, Any] = {"asked": value}

    def apply(self) -> str:
        """'' when set (or left alone), else why not (the trial then fails: it asked for a setting)."""
        if self.value == "leave":
            return ""
        for name in ("enabled", "shmem_enabled"):
            path = self.thp_dir / name
            try:
                previous = _chosen(path.read_text()[:512])
            except OSError as exc:
                self.restore()
                return f"cannot read {path} ({exc.strerror or exc}): this kernel has no THP setting to change"
            self.previous[name] = previous
            self._note_in_lease()
            try:
                path.write_text(f"{self.value}\n")
            except OSError as exc:
                self.restore()
                return f"cannot set {path} to {self.value} ({exc.strerror or exc}): thp needs root"
        self.record["during_restore"] = read_thp(self.thp_dir)
        self.record["previous"] = dict(self.previous)
        return ""

    def restore(self) -> None:
        """Put back what ``apply`` changed; a no-op when nothing was."""
        for name, value in list(self.previous.items()):
            try:
                (self.thp_dir / name).write_text(f"{value}\n")
            except OSError as exc:
                self.record.setdefault("restore_error", []).append(f"{name} left at {self.value}: {exc}")
                continue
            del self.previous[name]
        self._note_in_lease()

    def _note_in_lease(self) -> None:
        if self.lease is not None:
            self.lease.set_restore_on_reap(
                [str(self.thp_dir / name) for name in ("enabled", "shmem_enabled")],
                [{"path": str(self.thp_dir / name), "value": value, "what": f"transparent_hugepage/{name}"}
                 for name, value in self.previous.items()])
