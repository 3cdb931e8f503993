# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""Mounted real filesystems (/proc/self/mounts) and their sizes, each statvfs under a time limit."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

from ansible.module_utils.node_facts.files import read_text

PSEUDO_FSTYPES = frozenset(
    (
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "devpts",
        "devtmpfs",
        "efivarfs",
        "fuse.gvfsd-fuse",
        "fuse.lxcfs",
        "fuse.portal",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "ramfs",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "squashfs",
        "sysfs",
        "tracefs",
    )
)


def parse_mount_field(value: str) -> str:
    """Undo the octal escapes of /proc/mounts (``\\040`` is a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


def parse_mounts(text: str, shm_path: str = "/dev/shm") -> list[dict[str, Any]]:
    """/proc/self/mounts -> [{device, mountpoint, fstype, options}] for real filesystems.

    Pseudo filesystems are dropped, and tmpfs except on /dev/shm and ``shm_path``. A mount point mounted more
    than once keeps its place in the list and the last mount's values (that is the visible one).
    """
    mounts: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        device, mountpoint, fstype, options = (parse_mount_field(p) for p in parts[:4])
        if fstype in PSEUDO_FSTYPES:
            continue
        if fstype == "tmpfs" and mountpoint not in ("/dev/shm", shm_path):
            continue
        mounts[mountpoint] = {
            "device": device,
            "mountpoint": mountpoint,
            "fstype": fstype,
            "options": options,
        }
    return list(mounts.values())


def statvfs_with_timeout(path: str, timeout_s: float | None) -> os.statvfs_result | None:
    """os.statvfs in a daemon thread, so a hung network filesystem cannot hang the module."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["st"] = os.statvfs(path)
        except OSError as exc:
            result["error"] = exc

    worker = threading.Thread(target=target)
    worker.daemon = True
    worker.start()
    worker.join(timeout_s)
    return result.get("st")


def fs_sizes(path: str, timeout_s: float | None) -> dict[str, int | None]:
    """{size_bytes, free_bytes, available_bytes} of the filesystem holding path (None when unknown).

    ``timeout_s`` 0 or less skips the statvfs; None waits as long as it takes.
    """
    sizes: dict[str, int | None] = {"size_bytes": None, "free_bytes": None, "available_bytes": None}
    if timeout_s is not None and timeout_s <= 0:
        return sizes
    st = statvfs_with_timeout(path, timeout_s)
    if st is not None:
        sizes["size_bytes"] = st.f_blocks * st.f_frsize
        sizes["free_bytes"] = st.f_bfree * st.f_frsize
        sizes["available_bytes"] = st.f_bavail * st.f_frsize
    return sizes


def read_mounts(procfs_root: str, shm_path: str, timeout_s: float | None) -> list[dict[str, Any]]:
    """The mounts with their sizes; /proc/mounts where there is no /proc/self/mounts."""
    text = read_text(Path(procfs_root, "self/mounts"))
    if text is None:
        text = read_text(Path(procfs_root, "mounts")) or ""
    mounts = parse_mounts(text, shm_path=shm_path)
    for mount in mounts:
        mount.update(fs_sizes(mount["mountpoint"], timeout_s))
    return mounts
