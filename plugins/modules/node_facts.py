#!/usr/bin/python
# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Report the facts a GPU-serving experiment needs about a node
description:
  - Reads GPUs (through C(nvidia-smi)), NUMA nodes, memory and page cache, C(/dev/shm) (with stale
    C(vllm_offload_*) files), CPU topology, the kernel release, block devices and mounted filesystems.
  - It only reads, so it runs the same in check mode and reports O(changed=false), unless O(dest)
    is given, in which case it also writes the facts to that file (not in check mode).
  - An absent or failing C(nvidia-smi) is a fact (RV(node_facts.gpus=[]) and RV(node_facts.gpu_error)),
    never a module failure.
  - The result is returned both as C(ansible_facts.node_facts) and as the top-level C(node_facts) key.
version_added: "0.1.0"
author:
  - The project contributors
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing) in diff mode.
    support: none
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
    support: full
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
options:
  sysfs_root:
    description:
      - Directory under which C(sys/) is looked up (C(sys/devices/system/node), C(sys/bus/pci/devices),
        C(sys/block), C(sys/devices/system/cpu)).
      - Meant for tests that point the module at a fixture tree.
    type: path
    default: /
  procfs_root:
    description:
      - The proc filesystem; C(meminfo), C(cpuinfo) and C(self/mounts) are read under it.
    type: path
    default: /proc
  shm_path:
    description:
      - The shared-memory filesystem whose size is reported and where C(vllm_offload_*) files are listed.
    type: path
    default: /dev/shm
  nvidia_smi_path:
    description:
      - Path of the C(nvidia-smi) binary.
      - When omitted it is looked up on E(PATH) and in the usual system directories.
    type: path
  nvidia_smi_timeout:
    description:
      - Seconds after which an C(nvidia-smi) call is abandoned (a wedged GPU can make it hang).
      - Uses the C(timeout) binary; when that is absent, or this is V(0), calls are not limited.
    type: int
    default: 60
  dest:
    description:
      - Also write the facts as indented JSON to this file on the node (atomically, mode 0644; its
        folder is made if missing), so that one task does what gathering here and writing on the
        controller did in two. Reported as changed when the file's content changed.
    type: path
  mount_timeout:
    description:
      - Seconds allowed for each C(statvfs) of a mount point (a dead network filesystem can hang it).
      - V(0) skips the size of mounts altogether.
    type: float
    default: 5
notes:
  - Linux only.
  - NUMA node of each GPU comes from C(/sys/bus/pci/devices/<bus id>/numa_node); V(-1) becomes V(null).
  - Sizes are bytes unless the key says otherwise (C(*_mib) keys are MiB as nvidia-smi reports them).
"""

EXAMPLES = r"""
- name: Gather node facts
  node_facts:

- name: Refuse to run on a node without GPUs
  ansible.builtin.assert:
    that:
      - ansible_facts.node_facts.gpu_count > 0
    fail_msg: "{{ ansible_facts.node_facts.gpu_error }}"

- name: Warn about stale vLLM offload files in /dev/shm
  ansible.builtin.debug:
    msg: "{{ ansible_facts.node_facts.shm.vllm_offload_files | map(attribute='name') | list }}"
  when: ansible_facts.node_facts.shm.vllm_offload_files | length > 0

- name: Keep the facts after a trial beside its other files
  node_facts:
    dest: /var/tmp/trial/facts_after.json

- name: Point the module at a captured tree (tests)
  node_facts:
    sysfs_root: /srv/capture
    procfs_root: /srv/capture/proc
    shm_path: /srv/capture/shm
    nvidia_smi_path: /srv/capture/bin/nvidia-smi
"""

RETURN = r"""
node_facts:
  description: The facts (also returned as C(ansible_facts.node_facts)).
  returned: always
  type: dict
  contains:
    gpus:
      description:
        - One entry per GPU, in nvidia-smi order. Fields nvidia-smi reports as C([N/A]) or
          C([Not Supported]) are V(null).
      type: list
      elements: dict
      sample:
        - index: 0
          name: NVIDIA H200
          uuid: GPU-3f1c2a4e-6b7d-4e8f-9a0b-1c2d3e4f5a60
          driver_version: "580.159.04"
          memory_total_mib: 143771
          memory_used_mib: 0
          persistence_mode: true
          pci_bus_id: "00000000:18:00.0"
          compute_cap: "9.0"
          numa_node: 0
    gpu_count:
      description: Number of GPUs in RV(node_facts.gpus).
      type: int
      sample: 8
    gpu_error:
      description: Why RV(node_facts.gpus) is empty or incomplete; V(null) when nvidia-smi worked.
      type: str
      sample: nvidia-smi not found
    driver_version:
      description: Driver version of the first GPU; V(null) without GPUs.
      type: str
      sample: "580.159.04"
    cuda_version:
      description: CUDA version the driver supports, from the nvidia-smi header; V(null) when unknown.
      type: str
      sample: "13.0"
    numa:
      description: One entry per NUMA node; empty when C(/sys/devices/system/node) is absent.
      type: list
      elements: dict
      sample:
        - node: 0
          cpus: "0-55,112-167"
          mem_total_bytes: 1081509117952
          mem_free_bytes: 1003177271296
          mem_used_bytes: 78331846656
          file_pages_bytes: 41154760704
          shmem_bytes: 17028096
          hugepages_total: 0
          hugepages_free: 0
          distance: [10, 21]
    memory:
      description: From C(/proc/meminfo).
      type: dict
      sample:
        total_bytes: 2163018235904
        free_bytes: 2006354542592
        available_bytes: 2109018603520
        cached_bytes: 82309521408
        buffers_bytes: 1197846528
        shmem_bytes: 34056192
        dirty_bytes: 1048576
        swap_total_bytes: 0
        swap_free_bytes: 0
        hugepages_total: 0
        hugepages_free: 0
        hugepage_size_bytes: 2097152
    page_cache_bytes:
      description: Same as RV(node_facts.memory.cached_bytes).
      type: int
    shm:
      description: The shared-memory filesystem. Sizes are V(null) (and C(error) set) when it cannot be read.
      type: dict
      sample:
        path: /dev/shm
        size_bytes: 1081509117952
        free_bytes: 1081509117952
        used_bytes: 0
        vllm_offload_files: [{name: vllm_offload_0_1234, size_bytes: 68719476736}]
        vllm_offload_bytes: 68719476736
        error: null
    cpu:
      description: From C(/proc/cpuinfo), with C(/sys/devices/system/cpu/*/topology) when cpuinfo lacks it.
      type: dict
      sample:
        model: "Intel(R) Xeon(R) Platinum 8480+"
        sockets: 2
        cores: 112
        threads: 224
    kernel:
      description: Kernel release (C(uname -r)).
      type: str
      sample: 6.8.0-60-generic
    hostname:
      description: Node name (C(uname -n)).
      type: str
    disks:
      description: Block devices from C(/sys/block) of non-zero size, except C(ram*) devices.
      type: list
      elements: dict
      sample:
        - name: nvme0n1
          size_bytes: 3840755982336
          rotational: false
          model: SAMSUNG MZQL23T8HCLS-00A07
          nvme: true
          md_level: null
        - name: md0
          size_bytes: 15363023929344
          rotational: false
          model: null
          nvme: false
          md_level: raid0
    mounts:
      description:
        - Real filesystems from C(/proc/self/mounts) (pseudo filesystems and C(tmpfs) other than
          C(/dev/shm) and O(shm_path) are left out), one entry per mount point (the last mount on it wins).
        - Sizes are V(null) when C(statvfs) fails or exceeds O(mount_timeout).
      type: list
      elements: dict
      sample:
        - device: /dev/md0
          mountpoint: /data
          fstype: ext4
          options: rw,relatime,stripe=256
          size_bytes: 15118487863296
          free_bytes: 14350000000000
          available_bytes: 13581000000000
"""

# Ansible modules keep the documentation blocks above the imports (ansible-test validate-modules).
# The readers live in plugins/module_utils/node_facts/ (ansible.cfg's module_utils path); Ansible
# ships the ones imported here to the node together with this module.
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.node_facts.cpu import read_cpu  # noqa: E402
from ansible.module_utils.node_facts.disks import read_disks  # noqa: E402
from ansible.module_utils.node_facts.gpus import gather_gpus  # noqa: E402
from ansible.module_utils.node_facts.memory import read_memory, read_numa  # noqa: E402
from ansible.module_utils.node_facts.mounts import read_mounts  # noqa: E402
from ansible.module_utils.node_facts.shm import read_shm  # noqa: E402

ARGUMENT_SPEC = dict(
    sysfs_root=dict(type="path", default="/"),
    procfs_root=dict(type="path", default="/proc"),
    shm_path=dict(type="path", default="/dev/shm"),
    nvidia_smi_path=dict(type="path"),
    nvidia_smi_timeout=dict(type="int", default=60),
    mount_timeout=dict(type="float", default=5),
    dest=dict(type="path"),
)


def gather(module):
    """The node_facts dict (RETURN above), read with the module's parameters."""
    params = module.params
    sysfs_root = params["sysfs_root"]
    procfs_root = params["procfs_root"]
    shm_path = params["shm_path"]

    gpus, gpu_error, cuda_version = gather_gpus(
        module, sysfs_root, params["nvidia_smi_path"], params["nvidia_smi_timeout"]
    )
    memory = read_memory(procfs_root)
    uname = os.uname()
    return {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "gpu_error": gpu_error,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "cuda_version": cuda_version,
        "numa": read_numa(sysfs_root),
        "memory": memory,
        "page_cache_bytes": memory["cached_bytes"],
        "shm": read_shm(shm_path),
        "cpu": read_cpu(procfs_root, sysfs_root),
        "kernel": uname.release,
        "hostname": uname.nodename,
        "disks": read_disks(sysfs_root),
        "mounts": read_mounts(procfs_root, shm_path, params["mount_timeout"]),
    }


def write_facts(module, dest, facts):
    """Write ``facts`` to ``dest`` atomically; whether the content changed (nothing in check mode)."""
    text = json.dumps(facts, indent=2, sort_keys=True) + "\n"
    try:
        with open(dest, encoding="utf-8") as fh:
            if fh.read() == text:
                return False
    except OSError:
        pass
    if module.check_mode:
        return True
    tmp = f"{dest}.tmp.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)  # a skipped trial made no folder
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError as exc:
        module.fail_json(msg=f"node_facts: cannot write {dest}: {exc}")
    return True


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    # Reading is the same in check mode; only dest is ever written (and not in check mode).
    facts = gather(module)
    changed = write_facts(module, module.params["dest"], facts) if module.params["dest"] else False
    module.exit_json(changed=changed, ansible_facts={"node_facts": facts}, node_facts=facts)


if __name__ == "__main__":
    main()
