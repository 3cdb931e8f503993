# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""The GPUs of a node: nvidia-smi run under a timeout, each GPU's NUMA node from sysfs.

An absent, failing or hanging nvidia-smi is a fact (no GPUs and an error message), never a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from ansible.module_utils.node_facts.files import parse_int, read_text
from ansible.module_utils.node_facts.nvidia_smi import (
    GPU_QUERY_FIELDS,
    first_line,
    parse_cuda_version,
    parse_gpu_csv,
    pci_sysfs_name,
)


class CommandRunner(Protocol):
    """The two AnsibleModule methods the GPU probe uses (tests give a scripted stand-in)."""

    def get_bin_path(self, arg: str, required: bool = False) -> str | None: ...

    def run_command(self, args: list[str], environ_update: dict[str, str] | None = None) -> tuple[int, str, str]: ...


class GpuProbe:
    """nvidia-smi calls, each under ``timeout`` when it is installed and ``timeout_s`` > 0."""

    def __init__(self, module: CommandRunner, binary: str, timeout_s: int | None) -> None:
        self.module = module
        self.binary = binary
        self.prefix: list[str] = []
        if timeout_s and timeout_s > 0:
            timeout_bin = module.get_bin_path("timeout")
            if timeout_bin:
                self.prefix = [timeout_bin, "--kill-after=5", str(timeout_s)]
        self.timeout_s = timeout_s

    def run(self, *args: str) -> tuple[int, str, str]:
        rc, out, err = self.module.run_command([*self.prefix, self.binary, *args], environ_update={"LC_ALL": "C"})
        if self.prefix and rc in (124, 137):
            err = f"nvidia-smi timed out after {self.timeout_s}s"
        return rc, out, err

    def query(self) -> tuple[list[dict[str, Any]], str | None, str | None]:
        """(gpus, error, cuda_version)."""
        fields = list(GPU_QUERY_FIELDS)
        rc, out, err = self._query(fields)
        if rc != 0 and "compute_cap" in (out + err) and "valid field" in (out + err):
            # drivers older than ~510 do not know compute_cap
            fields.remove("compute_cap")
            rc, out, err = self._query(fields)
        if rc != 0:
            return [], first_line(err, out) or f"nvidia-smi failed with rc {rc}", None
        try:
            gpus = parse_gpu_csv(out, fields)
        except ValueError as exc:
            return [], str(exc), None
        return gpus, None, self.cuda_version()

    def _query(self, fields: list[str]) -> tuple[int, str, str]:
        return self.run("--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")

    def cuda_version(self) -> str | None:
        rc, out, _err = self.run("--version")
        version = parse_cuda_version(out) if rc == 0 else None
        if version is None:  # some drivers do not know --version: the plain output has the header
            rc, out, _err = self.run()
            version = parse_cuda_version(out) if rc == 0 else None
        return version


def read_pci_numa_node(sysfs_root: str, bus_id: str | None) -> int | None:
    """NUMA node of a PCI device; None when unknown (sysfs says -1 on machines without NUMA)."""
    if not bus_id:
        return None
    node = parse_int(read_text(Path(sysfs_root, "sys/bus/pci/devices", pci_sysfs_name(bus_id), "numa_node")))
    if node is None or node < 0:
        return None
    return node


def gather_gpus(
    module: CommandRunner, sysfs_root: str, nvidia_smi_path: str | None, timeout_s: int | None
) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """(gpus, error, cuda_version); ``nvidia_smi_path`` None looks nvidia-smi up on PATH."""
    if nvidia_smi_path:
        if not (Path(nvidia_smi_path).is_file() and os.access(nvidia_smi_path, os.X_OK)):
            return [], f"nvidia-smi not found at {nvidia_smi_path}", None
        binary = nvidia_smi_path
    else:
        found = module.get_bin_path("nvidia-smi")
        if not found:
            return [], "nvidia-smi not found", None
        binary = found
    gpus, error, cuda_version = GpuProbe(module, binary, timeout_s).query()
    for gpu in gpus:
        gpu["numa_node"] = read_pci_numa_node(sysfs_root, gpu["pci_bus_id"])
    return gpus, error, cuda_version
