"""kernel.io_uring_disabled for the engine's life: the lease carries the value to put back, the reaper puts
it back, and a kernel without the setting is said so. The sysctl here is a file standing for it
(``IoUringOff(sysctl=...)``); the real one is exercised in test_snapshot_criu_lessons.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodetools.lease import Lease
from nodetools.reaper import reap, restore_settings
from nodetools.snapshot.io_uring import IoUringOff


def lease_in(tmp_path: Path) -> Lease:
    lease = Lease(tmp_path / "leases", "snapshot measure criu", "snapshot.criu.r1@node", tmp_path, [8000])
    lease.write()
    return lease


def test_the_previous_value_is_in_the_lease_while_the_setting_is_changed(tmp_path: Path) -> None:
    sysctl = tmp_path / "io_uring_disabled"
    sysctl.write_text("0\n")
    lease = lease_in(tmp_path)
    guard = IoUringOff(lease, sysctl)
    assert guard.disable() == ""
    assert sysctl.read_text() == "2\n"
    on_disk = json.loads(lease.path.read_text())
    assert on_disk["restore_on_reap"] == [{"path": str(sysctl), "value": "0", "what": "kernel.io_uring_disabled"}]
    guard.restore()
    assert sysctl.read_text() == "0\n"
    assert json.loads(lease.path.read_text())["restore_on_reap"] == []
    assert guard.record == {"sysctl": "kernel.io_uring_disabled", "available": True, "previous": "0",
                            "during_engine": "2", "restored": "0"}
    guard.restore()  # twice (a second SIGTERM while stopping) changes nothing
    assert sysctl.read_text() == "0\n"


def test_a_kernel_without_the_setting_is_said_so_and_the_trial_goes_on(tmp_path: Path) -> None:
    guard = IoUringOff(None, tmp_path / "absent")
    assert guard.disable() == ""
    assert guard.record["available"] is False
    assert guard.record["why"].startswith(f"kernel {os.uname().release} has no kernel.io_uring_disabled (Linux >= 6.6)")


def test_already_disabled_is_left_as_it_is(tmp_path: Path) -> None:
    sysctl = tmp_path / "io_uring_disabled"
    sysctl.write_text("2\n")
    lease = lease_in(tmp_path)
    guard = IoUringOff(lease, sysctl)
    assert guard.disable() == ""
    assert "restore_on_reap" not in json.loads(lease.path.read_text())
    guard.restore()
    assert sysctl.read_text() == "2\n" and guard.record["during_engine"] == "2"


def test_a_setting_that_cannot_be_written_is_the_reason(tmp_path: Path) -> None:
    read_only = Path("/proc/sys/kernel/osrelease")  # 0444: refused to root as well
    lease = lease_in(tmp_path)
    guard = IoUringOff(lease, read_only)
    why = guard.disable()
    assert why.startswith("cannot set kernel.io_uring_disabled=2 (") and why.endswith("): the criu mode needs root")
    assert json.loads(lease.path.read_text())["restore_on_reap"] == []  # nothing was changed: nothing to put back
    guard.restore()  # nothing to do


def test_the_reaper_writes_back_only_proc_sys(tmp_path: Path) -> None:
    victim = tmp_path / "not-a-sysctl"
    victim.write_text("keep\n")
    lease = {"restore_on_reap": [{"path": str(victim), "value": "0", "what": "x"},
                                 {"path": "/proc/sys/../../etc/passwd", "value": "0", "what": "y"},
                                 {"path": "/proc/sys/kernel/io_uring_disabled", "value": "", "what": "z"}]}
    restored, refused = restore_settings(lease, "l.json")
    assert restored == [] and len(refused) == 3
    assert refused[0] == (f"l.json: restore_on_reap '{victim}': not a kernel setting (/proc/sys, "
                          "transparent_hugepage) with a value: left alone")
    assert victim.read_text() == "keep\n"


def test_a_lease_whose_tool_is_gone_has_its_setting_put_back(tmp_path: Path) -> None:
    """Nothing of the lease runs any more (its tool was killed, its engine died with it)."""
    sysctl = Path("/proc/sys/kernel/io_uring_disabled")
    if not sysctl.exists() or not os.access(sysctl, os.W_OK):
        pytest.skip("needs a writable kernel.io_uring_disabled (root, Linux >= 6.6)")
    before = sysctl.read_text().strip()
    leases = tmp_path / "leases"
    leases.mkdir()
    (leases / "t.snapshot-measure-criu.1.json").write_text(json.dumps({
        "tool": "snapshot measure criu", "trial": "t", "owner": {"pid": 2**22 + 7, "start": 1}, "groups": [],
        "restore_on_reap": [{"path": str(sysctl), "value": before, "what": "kernel.io_uring_disabled"}]}))
    try:
        sysctl.write_text("2\n" if before != "2" else "1\n")
        out = reap(leases)
        assert out["restored"] == [f"kernel.io_uring_disabled = {before}"]
        assert sysctl.read_text().strip() == before and list(leases.iterdir()) == []
    finally:
        sysctl.write_text(f"{before}\n")
