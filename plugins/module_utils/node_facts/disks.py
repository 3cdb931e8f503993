# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""Block devices from /sys/block: size, rotational, model, NVMe, md RAID level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.module_utils.node_facts.files import natural_key, parse_int, read_text


def _stripped(text: str | None) -> str | None:
    """A sysfs string attribute; absent or blank is None."""
    return (text.strip() or None) if text is not None else None


def read_disks(sysfs_root: str) -> list[dict[str, Any]]:
    """Block devices of non-zero size, except ``ram*``, in natural order (nvme2n1 before nvme10n1)."""
    base = Path(sysfs_root, "sys/block")
    try:
        names = [entry.name for entry in base.iterdir()]
    except OSError:
        return []
    disks = []
    for name in sorted(names, key=natural_key):
        if name.startswith("ram"):
            continue
        path = base / name
        sectors = parse_int(read_text(path / "size"))
        if not sectors:
            continue  # empty loop devices, empty CD drives, ...
        rotational = parse_int(read_text(path / "queue/rotational"))
        disks.append(
            {
                "name": name,
                "size_bytes": sectors * 512,  # /sys/block/*/size counts 512-byte sectors on every device
                "rotational": None if rotational is None else bool(rotational),
                "model": _stripped(read_text(path / "device/model")),
                "nvme": name.startswith("nvme"),
                "md_level": _stripped(read_text(path / "md/level")),
            }
        )
    return disks
