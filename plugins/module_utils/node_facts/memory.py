# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""Memory and page cache (/proc/meminfo) and the NUMA nodes (/sys/devices/system/node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.module_utils.node_facts.files import parse_int, read_text

_MEMINFO_KEYS = (
    ("total_bytes", "MemTotal"),
    ("free_bytes", "MemFree"),
    ("available_bytes", "MemAvailable"),
    ("cached_bytes", "Cached"),
    ("buffers_bytes", "Buffers"),
    ("shmem_bytes", "Shmem"),
    ("dirty_bytes", "Dirty"),
    ("swap_total_bytes", "SwapTotal"),
    ("swap_free_bytes", "SwapFree"),
    ("hugepages_total", "HugePages_Total"),
    ("hugepages_free", "HugePages_Free"),
    ("hugepage_size_bytes", "Hugepagesize"),
)

_NODE_MEMINFO_KEYS = (
    ("mem_total_bytes", "MemTotal"),
    ("mem_free_bytes", "MemFree"),
    ("mem_used_bytes", "MemUsed"),
    ("file_pages_bytes", "FilePages"),
    ("shmem_bytes", "Shmem"),
    ("hugepages_total", "HugePages_Total"),
    ("hugepages_free", "HugePages_Free"),
)


def _kb_value(rest: str) -> int | None:
    """``'  123456 kB'`` -> 123456 * 1024; ``'  42'`` (a count) -> 42."""
    parts = rest.split()
    if not parts:
        return None
    try:
        number = int(parts[0])
    except ValueError:
        return None
    if len(parts) > 1 and parts[1].lower() == "kb":
        return number * 1024
    return number


def parse_meminfo_map(text: str) -> dict[str, int]:
    """``Key:   N kB`` lines (also ``Node 0 Key: N kB``) -> {Key: bytes or count}."""
    values = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, rest = line.split(":", 1)
        key = key.strip()
        if key.startswith("Node "):
            key = key.split(None, 2)[-1]
        value = _kb_value(rest)
        if value is not None:
            values[key] = value
    return values


def parse_meminfo(text: str) -> dict[str, int | None]:
    """/proc/meminfo -> the memory dict (bytes; hugepage counts are counts)."""
    values = parse_meminfo_map(text)
    return {key: values.get(src) for key, src in _MEMINFO_KEYS}


def parse_node_meminfo(text: str) -> dict[str, int | None]:
    """/sys/devices/system/node/nodeN/meminfo -> the per-node memory keys."""
    values = parse_meminfo_map(text)
    return {key: values.get(src) for key, src in _NODE_MEMINFO_KEYS}


def read_memory(procfs_root: str) -> dict[str, int | None]:
    return parse_meminfo(read_text(Path(procfs_root, "meminfo")) or "")


def read_numa(sysfs_root: str) -> list[dict[str, Any]]:
    """One entry per NUMA node, by node number; [] when the kernel has no node directory."""
    nodes = []
    for path in Path(sysfs_root, "sys/devices/system/node").glob("node[0-9]*"):
        node_id = parse_int(path.name[len("node") :])
        if node_id is None:
            continue
        entry: dict[str, Any] = {"node": node_id}
        entry.update(parse_node_meminfo(read_text(path / "meminfo") or ""))
        cpulist = read_text(path / "cpulist")
        entry["cpus"] = cpulist.strip() if cpulist is not None else None
        distance = read_text(path / "distance")
        entry["distance"] = [int(d) for d in distance.split()] if distance else None
        nodes.append(entry)
    return sorted(nodes, key=lambda n: n["node"])
