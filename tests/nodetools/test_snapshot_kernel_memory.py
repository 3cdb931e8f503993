"""What the kernel did while CRIU restored memory, and THP set for the restores and put back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodetools.lease import Lease
from nodetools.reaper import restore_settings
from nodetools.snapshot.kernel_memory import ThpSetting, read_thp, read_vmstat, vmstat_delta


def test_vmstat_is_read_from_this_kernel_and_its_growth_is_the_difference() -> None:
    before = read_vmstat()
    assert before["pgfault"] > 0  # every kernel since 2.6 counts page faults
    data = bytearray(64 << 20)  # fault 64 MiB in
    data[::4096] = b"x" * len(data[::4096])
    after = read_vmstat()
    assert vmstat_delta(before, after)["pgfault"] > 0 and set(vmstat_delta(before, after)) <= set(after)
    assert vmstat_delta({"pgfault": 10}, {"pgfault": 25, "pgmajfault": 3}) == {"pgfault": 15}


def test_vmstat_of_a_missing_or_odd_file_is_empty_or_partial(tmp_path: Path) -> None:
    assert read_vmstat(tmp_path / "none") == {}
    odd = tmp_path / "vmstat"
    odd.write_text("pgfault 12\nthp_fault_alloc x\nnot_ours 5\n")
    assert read_vmstat(odd) == {"pgfault": 12}


def _thp_dir(tmp_path: Path) -> Path:
    thp = tmp_path / "transparent_hugepage"
    thp.mkdir()
    (thp / "enabled").write_text("always [madvise] never\n")
    (thp / "shmem_enabled").write_text("always within_size advise [never] deny force\n")
    (thp / "defrag").write_text("always defer defer+madvise [madvise] never\n")
    return thp


def _lease(tmp_path: Path) -> Lease:
    lease = Lease(tmp_path / "leases", "snapshot measure criu", "snapshot.criu.r1@node", tmp_path, [8000])
    lease.write()
    return lease


# A sysfs-shaped folder stands in for /sys/kernel/mm/transparent_hugepage: the files take a choice
# and show it bracketed; writing a word here keeps the word (the kernel would bracket it).
def test_thp_is_set_for_the_restores_noted_for_the_reaper_and_put_back(tmp_path: Path) -> None:
    thp, lease = _thp_dir(tmp_path), _lease(tmp_path)
    assert read_thp(thp) == {"enabled": "madvise", "shmem_enabled": "never", "defrag": "madvise"}
    setting = ThpSetting("always", lease, thp)
    assert setting.apply() == ""
    assert read_thp(thp)["enabled"] == "always" and read_thp(thp)["shmem_enabled"] == "always"
    assert setting.record["previous"] == {"enabled": "madvise", "shmem_enabled": "never"}
    noted = json.loads(lease.path.read_text())["restore_on_reap"]
    assert {(e["path"], e["value"]) for e in noted} == {(str(thp / "enabled"), "madvise"),
                                                         (str(thp / "shmem_enabled"), "never")}
    setting.restore()
    assert read_thp(thp) == {"enabled": "madvise", "shmem_enabled": "never", "defrag": "madvise"}
    assert json.loads(lease.path.read_text()).get("restore_on_reap") == []


def test_leave_changes_nothing_and_a_bad_value_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    thp = _thp_dir(tmp_path)
    assert ThpSetting("leave", None, thp).apply() == "" and read_thp(thp)["enabled"] == "madvise"
    with pytest.raises(ValueError, match="thp must be one of leave, always, never"):
        ThpSetting("sometimes", None, thp)
    why = ThpSetting("never", None, tmp_path / "absent").apply()
    assert why.startswith("cannot read ") and "no THP setting to change" in why


def test_the_reaper_puts_thp_back_only_under_the_kernels_own_folder(tmp_path: Path) -> None:
    lease = {"restore_on_reap": [{"path": str(tmp_path / "enabled"), "value": "madvise", "what": "x"},
                                 {"path": "/sys/kernel/mm/transparent_hugepage/../../../etc/x", "value": "1"}]}
    restored, refused = restore_settings(lease, "l.json")
    assert restored == [] and len(refused) == 2
