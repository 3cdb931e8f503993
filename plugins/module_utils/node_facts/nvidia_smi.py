# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""nvidia-smi output -> data (pure: text in, data out; running nvidia-smi is gpus.py's job)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

GPU_QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "driver_version",
    "memory.total",
    "memory.used",
    "persistence_mode",
    "pci.bus_id",
    "compute_cap",
)

# nvidia-smi field -> (result key, kind)
_GPU_FIELD_MAP = {
    "index": ("index", "int"),
    "name": ("name", "str"),
    "uuid": ("uuid", "str"),
    "driver_version": ("driver_version", "str"),
    "memory.total": ("memory_total_mib", "mib"),
    "memory.used": ("memory_used_mib", "mib"),
    "persistence_mode": ("persistence_mode", "bool"),
    "pci.bus_id": ("pci_bus_id", "str"),
    "compute_cap": ("compute_cap", "str"),
}

GPU_KEYS = (
    "index",
    "name",
    "uuid",
    "driver_version",
    "memory_total_mib",
    "memory_used_mib",
    "persistence_mode",
    "pci_bus_id",
    "compute_cap",
    "numa_node",
)

_NA_VALUES = frozenset(
    (
        "",
        "n/a",
        "[n/a]",
        "[not supported]",
        "not supported",
        "[unknown error]",
        "[insufficient permissions]",
        "[gpu is lost]",
        "[requested functionality has been deprecated]",
    )
)

_MIB_RE = re.compile(r"^(\d+)(?:\s*MiB)?$")
_CUDA_RE = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")


def _to_int(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def _to_mib(value: str) -> int | None:
    match = _MIB_RE.match(value)
    return int(match.group(1)) if match else None


def _to_bool(value: str) -> bool | None:
    return {"enabled": True, "disabled": False}.get(value.lower())


_CONVERTERS = {"int": _to_int, "mib": _to_mib, "bool": _to_bool, "str": str}


def _gpu_value(raw: str, kind: str) -> Any:
    """Convert one nvidia-smi CSV cell; unavailable values become None."""
    value = raw.strip()
    if value.lower() in _NA_VALUES:
        return None
    return _CONVERTERS[kind](value)


def parse_gpu_csv(text: str, fields: Sequence[str] = GPU_QUERY_FIELDS) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv,noheader[,nounits]`` output.

    ``fields`` is the list given to ``--query-gpu``, in order. Units (`` MiB``) are stripped when
    present. Every GPU dict carries all of GPU_KEYS; keys not queried are None, except ``index``,
    which defaults to the line's position (nvidia-smi lists GPUs in index order). ``numa_node`` is
    left None here (it comes from sysfs). Raises ValueError on a line with the wrong number of cells.
    """
    fields = [f.strip() for f in fields]
    unknown = [f for f in fields if f not in _GPU_FIELD_MAP]
    if unknown:
        raise ValueError("unsupported nvidia-smi fields: " + ", ".join(unknown))
    gpus: list[dict[str, Any]] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > len(fields) and "name" in fields:
            # a marketing name with a comma in it: give the surplus cells back to the name
            extra = len(cells) - len(fields)
            pos = fields.index("name")
            cells[pos : pos + extra + 1] = [", ".join(cells[pos : pos + extra + 1])]
        if len(cells) != len(fields):
            raise ValueError(
                f"unparsable nvidia-smi line ({len(cells)} fields, expected {len(fields)}): {line}"
            )
        gpu: dict[str, Any] = dict.fromkeys(GPU_KEYS)
        for pos, field in enumerate(fields):
            key, kind = _GPU_FIELD_MAP[field]
            gpu[key] = _gpu_value(cells[pos], kind)
        if "index" not in fields:
            gpu["index"] = len(gpus)
        gpus.append(gpu)
    return gpus


def parse_cuda_version(text: str | None) -> str | None:
    """CUDA version from the plain ``nvidia-smi`` header or ``nvidia-smi --version``; None if absent."""
    match = _CUDA_RE.search(text or "")
    return match.group(1) if match else None


def first_line(*texts: str | None) -> str | None:
    """First non-empty line of the first text that has one (stderr before stdout)."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return None


def pci_sysfs_name(bus_id: str) -> str:
    """nvidia-smi bus id -> /sys/bus/pci/devices entry: ``00000000:18:00.0`` -> ``0000:18:00.0``."""
    bus_id = bus_id.strip().lower()
    parts = bus_id.split(":")
    if len(parts) == 3:
        try:
            domain = int(parts[0], 16)
        except ValueError:
            return bus_id
        return f"{domain:04x}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:  # no domain at all
        return "0000:" + bus_id
    return bus_id
