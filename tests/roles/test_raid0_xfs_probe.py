"""The decisions of the raid0_xfs probe module (``plan_array``): what to do and what must stop the
role before anything is written. The module's reading of a real system is exercised in the VM
scenario (roles/raid0_xfs/molecule/default); these cases cover every branch without one.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

MODULE = Path(__file__).resolve().parents[2] / "roles" / "raid0_xfs" / "library" / "raid0_xfs_probe.py"
_spec = importlib.util.spec_from_file_location("raid0_xfs_probe", MODULE)
assert _spec is not None and _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def dev(name: str, *, path: str | None = None, exists: bool = True, block: bool = True, **kw: Any) -> dict[str, Any]:
    d = {"path": path or f"/dev/disk/by-id/nvme-{name}", "real": f"/dev/{name}", "name": name, "exists": exists,
         "block": block, "signature": {}, "partitions": [], "holders": [], "mounts": [], "examine": {}}
    d.update(kw)
    return d


def md(*, active: bool = False, exists: bool | None = None, level: str | None = "raid0",
       members: list[str] | None = None) -> dict[str, Any]:
    return {"path": "/dev/md0", "real": "/dev/md0", "name": "md0", "exists": active if exists is None else exists,
            "active": active, "level": level, "chunk_kib": 512, "members": members or []}


def kinds(errors: list[dict[str, str]]) -> list[str]:
    return [e["kind"] for e in errors]


def test_blank_members_are_created() -> None:
    plan, errors, signatures = probe.plan_array(md(), [dev("nvme0n1"), dev("nvme1n1")])
    assert (plan, errors, signatures) == ("create", [], {})


def test_running_array_with_the_same_members_is_left_alone() -> None:
    devices = [dev("nvme1n1", holders=["md0"]), dev("nvme0n1", holders=["md0"])]
    assert probe.plan_array(md(active=True, members=["/dev/nvme0n1", "/dev/nvme1n1"]), devices) == ("none", [], {})


def test_missing_not_block_and_duplicate_devices() -> None:
    devices = [dev("nvme0n1"), dev("nvme9n1", exists=False), dev("null", block=False),
               dev("nvme0n1", path="/dev/nvme0n1")]
    _plan, errors, _sig = probe.plan_array(md(), devices)
    assert kinds(errors) == ["missing", "not_block", "duplicate"]
    assert errors[0]["msg"] == "/dev/disk/by-id/nvme-nvme9n1 does not exist"
    assert errors[2]["msg"] == "/dev/disk/by-id/nvme-nvme0n1 and /dev/nvme0n1 are the same device /dev/nvme0n1"


def test_member_of_another_array_or_lvm_or_mounted_is_an_error() -> None:
    devices = [dev("nvme0n1", holders=["md1"]), dev("nvme1n1", holders=["dm-0"]), dev("nvme2n1", mounts=["/srv"])]
    _plan, errors, _sig = probe.plan_array(md(), devices)
    assert [(e["kind"], e["msg"]) for e in errors] == [
        ("foreign_array", "/dev/disk/by-id/nvme-nvme0n1 is already in array /dev/md1"),
        ("busy", "/dev/disk/by-id/nvme-nvme1n1 is held by dm-0 (LVM or device-mapper?)"),
        ("busy", "/dev/disk/by-id/nvme-nvme2n1 is mounted at /srv"),
    ]


def test_existing_array_with_other_members_or_level_is_never_recreated() -> None:
    devices = [dev("nvme0n1", holders=["md0"]), dev("nvme2n1")]
    plan, errors, _sig = probe.plan_array(md(active=True, members=["/dev/nvme0n1", "/dev/nvme1n1"]), devices)
    assert plan == "none" and kinds(errors) == ["mismatch"]
    assert "exists with members /dev/nvme0n1, /dev/nvme1n1, not /dev/nvme0n1, /dev/nvme2n1" in errors[0]["msg"]
    _plan, errors, _sig = probe.plan_array(md(active=True, level="raid1", members=["/dev/nvme0n1"]),
                                           [dev("nvme0n1", holders=["md0"])])
    assert "exists as raid1, not raid0" in errors[0]["msg"]


def test_stopped_array_node_is_an_error() -> None:
    plan, errors, _sig = probe.plan_array(md(exists=True, members=["/dev/nvme0n1"]), [dev("nvme0n1", holders=["md0"])])
    assert plan == "none" and kinds(errors) == ["mismatch"] and "is not running" in errors[0]["msg"]


def test_signatures_are_reported_for_safe_mode() -> None:
    devices = [dev("nvme0n1", signature={"TYPE": "xfs"}), dev("nvme1n1", signature={"PTTYPE": "gpt"}),
               dev("nvme2n1", partitions=["nvme2n1p1"]), dev("nvme3n1")]
    plan, errors, signatures = probe.plan_array(md(), devices)
    assert plan == "create" and errors == []
    assert signatures == {"/dev/disk/by-id/nvme-nvme0n1": "xfs", "/dev/disk/by-id/nvme-nvme1n1": "gpt",
                          "/dev/disk/by-id/nvme-nvme2n1": "partitions"}


@pytest.mark.parametrize(("examine", "plan"), [
    ({"MD_UUID": "a", "MD_LEVEL": "raid0", "MD_DEVICES": "2"}, "assemble"),
    ({"MD_UUID": "a", "MD_LEVEL": "raid1", "MD_DEVICES": "2"}, "create"),  # another level: a signature
    ({"MD_UUID": "a", "MD_LEVEL": "raid0", "MD_DEVICES": "3"}, "create"),  # a member is not listed
])
def test_stopped_raid0_with_matching_superblocks_is_assembled(examine: dict[str, str], plan: str) -> None:
    sig = {"TYPE": "linux_raid_member"}
    devices = [dev("nvme0n1", signature=sig, examine=examine), dev("nvme1n1", signature=sig, examine=examine)]
    got, errors, signatures = probe.plan_array(md(), devices)
    assert got == plan and errors == []
    assert signatures == ({} if plan == "assemble" else dict.fromkeys((d["path"] for d in devices),
                                                                     "linux_raid_member"))
