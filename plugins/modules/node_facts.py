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
  - It only reads, so it runs the same in check mode and always reports O(changed=false).
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
import contextlib  # noqa: E402
import glob  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import threading  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

# --------------------------------------------------------------------------------------------
# nvidia-smi
# --------------------------------------------------------------------------------------------

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


def _to_int(value):
    return int(value) if value.isdigit() else None


def _to_mib(value):
    match = _MIB_RE.match(value)
    return int(match.group(1)) if match else None


def _to_bool(value):
    return {"enabled": True, "disabled": False}.get(value.lower())


_CONVERTERS = {"int": _to_int, "mib": _to_mib, "bool": _to_bool, "str": str}


def _gpu_value(raw, kind):
    """Convert one nvidia-smi CSV cell; unavailable values become None."""
    value = raw.strip()
    if value.lower() in _NA_VALUES:
        return None
    return _CONVERTERS[kind](value)


def parse_gpu_csv(text, fields=GPU_QUERY_FIELDS):
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
    gpus = []
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
        gpu = dict.fromkeys(GPU_KEYS)
        for pos, field in enumerate(fields):
            key, kind = _GPU_FIELD_MAP[field]
            gpu[key] = _gpu_value(cells[pos], kind)
        if "index" not in fields:
            gpu["index"] = len(gpus)
        gpus.append(gpu)
    return gpus


_CUDA_RE = re.compile(r"CUDA Version\s*:\s*([0-9][0-9.]*)")


def parse_cuda_version(text):
    """CUDA version from the plain ``nvidia-smi`` header or ``nvidia-smi --version``; None if absent."""
    match = _CUDA_RE.search(text or "")
    return match.group(1) if match else None


def first_line(*texts):
    """First non-empty line of the first text that has one (stderr before stdout)."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return None


def pci_sysfs_name(bus_id):
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


# --------------------------------------------------------------------------------------------
# /proc and /sys parsers (pure: text in, data out)
# --------------------------------------------------------------------------------------------


def _kb_value(rest):
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


def parse_meminfo_map(text):
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


def parse_meminfo(text):
    """/proc/meminfo -> the memory dict (bytes; hugepage counts are counts)."""
    values = parse_meminfo_map(text)
    return {key: values.get(src) for key, src in _MEMINFO_KEYS}


_NODE_MEMINFO_KEYS = (
    ("mem_total_bytes", "MemTotal"),
    ("mem_free_bytes", "MemFree"),
    ("mem_used_bytes", "MemUsed"),
    ("file_pages_bytes", "FilePages"),
    ("shmem_bytes", "Shmem"),
    ("hugepages_total", "HugePages_Total"),
    ("hugepages_free", "HugePages_Free"),
)


def parse_node_meminfo(text):
    """/sys/devices/system/node/nodeN/meminfo -> the per-node memory keys."""
    values = parse_meminfo_map(text)
    return {key: values.get(src) for key, src in _NODE_MEMINFO_KEYS}


def parse_cpuinfo(text):
    """/proc/cpuinfo -> {model, sockets, cores, threads}; sockets/cores None when cpuinfo lacks them."""
    processors = []
    current = {}
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


def parse_mount_field(value):
    """Undo the octal escapes of /proc/mounts (``\\040`` is a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), value)


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


def parse_mounts(text, shm_path="/dev/shm"):
    """/proc/self/mounts -> [{device, mountpoint, fstype, options}] for real filesystems.

    Pseudo filesystems are dropped, and tmpfs except on /dev/shm and ``shm_path``. A mount point mounted more
    than once keeps its place in the list and the last mount's values (that is the visible one).
    """
    mounts = {}
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


def parse_int(text):
    try:
        return int(text.strip())
    except (AttributeError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# readers (files on the node)
# --------------------------------------------------------------------------------------------


def read_text(path):
    """File content, or None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _natural_key(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def read_pci_numa_node(sysfs_root, bus_id):
    if not bus_id:
        return None
    path = os.path.join(sysfs_root, "sys/bus/pci/devices", pci_sysfs_name(bus_id), "numa_node")
    node = parse_int(read_text(path))
    if node is None or node < 0:
        return None
    return node


def read_numa(sysfs_root):
    base = os.path.join(sysfs_root, "sys/devices/system/node")
    nodes = []
    for path in glob.glob(os.path.join(base, "node[0-9]*")):
        name = os.path.basename(path)
        node_id = parse_int(name[len("node") :])
        if node_id is None:
            continue
        entry = {"node": node_id}
        entry.update(parse_node_meminfo(read_text(os.path.join(path, "meminfo")) or ""))
        cpulist = read_text(os.path.join(path, "cpulist"))
        entry["cpus"] = cpulist.strip() if cpulist is not None else None
        distance = read_text(os.path.join(path, "distance"))
        entry["distance"] = [int(d) for d in distance.split()] if distance else None
        nodes.append(entry)
    return sorted(nodes, key=lambda n: n["node"])


def read_cpu_topology(sysfs_root):
    """(sockets, cores) from /sys/devices/system/cpu/cpuN/topology, or (None, None)."""
    packages = set()
    cores = set()
    for path in glob.glob(os.path.join(sysfs_root, "sys/devices/system/cpu/cpu[0-9]*/topology")):
        package = parse_int(read_text(os.path.join(path, "physical_package_id")))
        core = parse_int(read_text(os.path.join(path, "core_id")))
        if package is None:
            continue
        packages.add(package)
        if core is not None:
            cores.add((package, core))
    return (len(packages) or None, len(cores) or None)


def read_cpu(procfs_root, sysfs_root):
    cpu = parse_cpuinfo(read_text(os.path.join(procfs_root, "cpuinfo")) or "")
    if cpu["sockets"] is None or cpu["cores"] is None:
        sockets, cores = read_cpu_topology(sysfs_root)
        if cpu["sockets"] is None:
            cpu["sockets"] = sockets
        if cpu["cores"] is None:
            cpu["cores"] = cores
    return cpu


def read_disks(sysfs_root):
    base = os.path.join(sysfs_root, "sys/block")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    disks = []
    for name in sorted(names, key=_natural_key):
        if name.startswith("ram"):
            continue
        path = os.path.join(base, name)
        sectors = parse_int(read_text(os.path.join(path, "size")))
        if not sectors:
            continue  # empty loop devices, empty CD drives, ...
        rotational = parse_int(read_text(os.path.join(path, "queue/rotational")))
        model = read_text(os.path.join(path, "device/model"))
        md_level = read_text(os.path.join(path, "md/level"))
        disks.append(
            {
                "name": name,
                "size_bytes": sectors * 512,
                "rotational": None if rotational is None else bool(rotational),
                "model": (model.strip() or None) if model is not None else None,
                "nvme": name.startswith("nvme"),
                "md_level": (md_level.strip() or None) if md_level is not None else None,
            }
        )
    return disks


def statvfs_with_timeout(path, timeout):
    """os.statvfs in a daemon thread, so a hung network filesystem cannot hang the module."""
    result = {}

    def target():
        try:
            result["st"] = os.statvfs(path)
        except OSError as exc:
            result["error"] = exc

    worker = threading.Thread(target=target)
    worker.daemon = True
    worker.start()
    worker.join(timeout)
    return result.get("st")


def fs_sizes(path, timeout):
    """{size_bytes, free_bytes, available_bytes} of the filesystem holding path (None when unknown)."""
    sizes = {"size_bytes": None, "free_bytes": None, "available_bytes": None}
    if timeout is not None and timeout <= 0:
        return sizes
    st = statvfs_with_timeout(path, timeout)
    if st is not None:
        sizes["size_bytes"] = st.f_blocks * st.f_frsize
        sizes["free_bytes"] = st.f_bfree * st.f_frsize
        sizes["available_bytes"] = st.f_bavail * st.f_frsize
    return sizes


def read_mounts(procfs_root, shm_path, timeout):
    text = read_text(os.path.join(procfs_root, "self/mounts"))
    if text is None:
        text = read_text(os.path.join(procfs_root, "mounts")) or ""
    mounts = parse_mounts(text, shm_path=shm_path)
    for mount in mounts:
        mount.update(fs_sizes(mount["mountpoint"], timeout))
    return mounts


def read_shm(shm_path):
    shm = {
        "path": shm_path,
        "size_bytes": None,
        "free_bytes": None,
        "used_bytes": None,
        "vllm_offload_files": [],
        "vllm_offload_bytes": 0,
        "error": None,
    }
    try:
        st = os.statvfs(shm_path)
    except OSError as exc:
        shm["error"] = f"{shm_path}: {exc.strerror or exc}"
        return shm
    shm["size_bytes"] = st.f_blocks * st.f_frsize
    shm["free_bytes"] = st.f_bavail * st.f_frsize
    shm["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    files = []
    for path in sorted(glob.glob(os.path.join(glob.escape(shm_path), "vllm_offload_*"))):
        try:
            size = os.lstat(path).st_size
        except OSError:
            continue
        files.append({"name": os.path.basename(path), "size_bytes": size})
    shm["vllm_offload_files"] = files
    shm["vllm_offload_bytes"] = sum(f["size_bytes"] for f in files)
    return shm


# --------------------------------------------------------------------------------------------
# nvidia-smi runner
# --------------------------------------------------------------------------------------------


class GpuProbe:
    def __init__(self, module, binary, timeout):
        self.module = module
        self.binary = binary
        self.prefix = []
        if timeout and timeout > 0:
            timeout_bin = module.get_bin_path("timeout")
            if timeout_bin:
                self.prefix = [timeout_bin, "--kill-after=5", str(timeout)]
        self.timeout = timeout

    def run(self, *args):
        rc, out, err = self.module.run_command(
            [*self.prefix, self.binary, *args], environ_update={"LC_ALL": "C"}
        )
        if self.prefix and rc in (124, 137):
            err = f"nvidia-smi timed out after {self.timeout}s"
        return rc, out, err

    def query(self):
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

    def _query(self, fields):
        return self.run("--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits")

    def cuda_version(self):
        rc, out, _err = self.run("--version")
        version = parse_cuda_version(out) if rc == 0 else None
        if version is None:
            rc, out, _err = self.run()
            version = parse_cuda_version(out) if rc == 0 else None
        return version


def gather_gpus(module, sysfs_root, nvidia_smi_path, timeout):
    """(gpus, error, cuda_version)."""
    if nvidia_smi_path:
        if not (os.path.isfile(nvidia_smi_path) and os.access(nvidia_smi_path, os.X_OK)):
            return [], f"nvidia-smi not found at {nvidia_smi_path}", None
        binary = nvidia_smi_path
    else:
        binary = module.get_bin_path("nvidia-smi")
        if not binary:
            return [], "nvidia-smi not found", None
    gpus, error, cuda_version = GpuProbe(module, binary, timeout).query()
    for gpu in gpus:
        gpu["numa_node"] = read_pci_numa_node(sysfs_root, gpu["pci_bus_id"])
    return gpus, error, cuda_version


def gather(module):
    params = module.params
    sysfs_root = params["sysfs_root"]
    procfs_root = params["procfs_root"]
    shm_path = params["shm_path"]

    gpus, gpu_error, cuda_version = gather_gpus(
        module, sysfs_root, params["nvidia_smi_path"], params["nvidia_smi_timeout"]
    )
    memory = parse_meminfo(read_text(os.path.join(procfs_root, "meminfo")) or "")
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/"),
            procfs_root=dict(type="path", default="/proc"),
            shm_path=dict(type="path", default="/dev/shm"),
            nvidia_smi_path=dict(type="path"),
            nvidia_smi_timeout=dict(type="int", default=60),
            mount_timeout=dict(type="float", default=5),
        ),
        supports_check_mode=True,
    )
    # Read-only: check mode runs exactly the same code and nothing ever changes.
    facts = gather(module)
    module.exit_json(changed=False, ansible_facts={"node_facts": facts}, node_facts=facts)


if __name__ == "__main__":
    main()
