# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""CPU model and topology: /proc/cpuinfo, and sysfs where cpuinfo lacks the topology (aarch64)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ansible.module_utils.node_facts.files import parse_int, read_text


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """/proc/cpuinfo -> {model, sockets, cores, threads}; sockets/cores None when cpuinfo lacks them."""
    processors = []
    current: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if current:
                processors.append(current)
                current = {}
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            current[key.strip()] = value.strip()
    cpus = [p for p in processors if "processor" in p]
    model = None
    for proc in cpus or processors:
        for key in ("model name", "Model", "cpu model", "Processor"):
            if proc.get(key):
                model = proc[key]
                break
        if model:
            break
    sockets = cores = None
    if cpus and all("physical id" in p for p in cpus):
        sockets = len({p["physical id"] for p in cpus})
        if all("core id" in p for p in cpus):
            cores = len({(p["physical id"], p["core id"]) for p in cpus})
        else:
            per_socket = {}
            for proc in cpus:
                with contextlib.suppress(ValueError):
                    per_socket[proc["physical id"]] = int(proc.get("cpu cores", ""))
            cores = sum(per_socket.values()) or None
    return {"model": model, "sockets": sockets, "cores": cores, "threads": len(cpus) or None}


def read_cpu_topology(sysfs_root: str) -> tuple[int | None, int | None]:
    """(sockets, cores) from /sys/devices/system/cpu/cpuN/topology, or (None, None)."""
    packages = set()
    cores = set()
    for path in Path(sysfs_root, "sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        package = parse_int(read_text(path / "physical_package_id"))
        core = parse_int(read_text(path / "core_id"))
        if package is None:
            continue
        packages.add(package)
        if core is not None:
            cores.add((package, core))
    return (len(packages) or None, len(cores) or None)


def read_cpu(procfs_root: str, sysfs_root: str) -> dict[str, Any]:
    cpu = parse_cpuinfo(read_text(Path(procfs_root, "cpuinfo")) or "")
    if cpu["sockets"] is None or cpu["cores"] is None:
        sockets, cores = read_cpu_topology(sysfs_root)
        if cpu["sockets"] is None:
            cpu["sockets"] = sockets
        if cpu["cores"] is None:
            cpu["cores"] = cores
    return cpu
