# SPDX-License-Identifier: MIT
"""The /proc and /sys readers of node_facts (plugins/module_utils/node_facts/) on fixture trees.

Memory and NUMA nodes, CPU topology, block devices, mounts and /dev/shm; sizes of real filesystems
come from this machine's tmp_path.
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.node_facts.cpu import parse_cpuinfo, read_cpu, read_cpu_topology
from ansible.module_utils.node_facts.disks import read_disks
from ansible.module_utils.node_facts.memory import parse_meminfo, read_memory, read_numa
from ansible.module_utils.node_facts.mounts import fs_sizes, parse_mounts, read_mounts
from ansible.module_utils.node_facts.shm import read_shm

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "node_facts"
SYSFS = str(FIXTURES / "sysfs")
PROCFS = str(FIXTURES / "proc")


def test_read_numa_two_nodes() -> None:
    numa = read_numa(SYSFS)
    assert [n["node"] for n in numa] == [0, 1]
    node0 = numa[0]
    assert node0["mem_total_bytes"] == 1056161244 * 1024
    assert node0["mem_free_bytes"] == 979665304 * 1024
    assert node0["mem_used_bytes"] == (1056161244 - 979665304) * 1024
    assert node0["file_pages_bytes"] == 40190196 * 1024
    assert node0["shmem_bytes"] == 16629 * 1024
    assert (node0["hugepages_total"], node0["hugepages_free"]) == (8, 4)
    assert node0["cpus"] == "0-1,4-5"
    assert node0["distance"] == [10, 21]
    assert numa[1]["cpus"] == "2-3,6-7"
    assert numa[1]["distance"] == [21, 10]


def test_read_numa_without_the_node_directory(tmp_path: Path) -> None:
    assert read_numa(str(tmp_path)) == []


def test_parse_meminfo() -> None:
    memory = parse_meminfo((FIXTURES / "proc" / "meminfo").read_text())
    assert memory == {
        "total_bytes": 2112322492 * 1024,
        "free_bytes": 1959330608 * 1024,
        "available_bytes": 2059588480 * 1024,
        "cached_bytes": 80380392 * 1024,
        "buffers_bytes": 1169772 * 1024,
        "shmem_bytes": 33258 * 1024,
        "dirty_bytes": 1024 * 1024,
        "swap_total_bytes": 0,
        "swap_free_bytes": 0,
        "hugepages_total": 16,
        "hugepages_free": 8,
        "hugepage_size_bytes": 2048 * 1024,
    }


def test_read_memory_without_meminfo_is_all_unknown(tmp_path: Path) -> None:
    assert set(read_memory(str(tmp_path)).values()) == {None}


def test_node_meminfo_sums_to_meminfo_total() -> None:
    total = read_memory(PROCFS)["total_bytes"]
    assert sum(n["mem_total_bytes"] for n in read_numa(SYSFS)) == total


def test_read_cpu_two_sockets() -> None:
    assert read_cpu(PROCFS, SYSFS) == {
        "model": "Intel(R) Xeon(R) Platinum 8480+",
        "sockets": 2,
        "cores": 4,
        "threads": 8,
    }


def test_cpu_topology_falls_back_to_sysfs_on_aarch64() -> None:
    cpu = parse_cpuinfo((FIXTURES / "proc" / "cpuinfo_aarch64").read_text())
    assert cpu == {"model": None, "sockets": None, "cores": None, "threads": 8}
    assert read_cpu_topology(SYSFS) == (2, 4)


def test_cpuinfo_without_core_id_uses_cpu_cores() -> None:
    text = "".join(
        f"processor\t: {n}\nmodel name\t: X\nphysical id\t: {n % 2}\ncpu cores\t: 3\n\n" for n in range(4)
    )
    assert parse_cpuinfo(text) == {"model": "X", "sockets": 2, "cores": 6, "threads": 4}


def test_read_disks() -> None:
    disks = {d["name"]: d for d in read_disks(SYSFS)}
    # empty loop0 / sr0 (size 0) and ram0 are skipped
    assert list(disks) == ["loop1", "md0", "nvme0n1", "nvme1n1", "sda"]
    assert disks["nvme0n1"] == {
        "name": "nvme0n1",
        "size_bytes": 7501476528 * 512,
        "rotational": False,
        "model": "SAMSUNG MZQL23T8HCLS-00A07",
        "nvme": True,
        "md_level": None,
    }
    assert disks["md0"]["md_level"] == "raid0"
    assert disks["md0"]["model"] is None
    assert not disks["md0"]["nvme"]
    assert disks["sda"]["rotational"] is True
    assert disks["sda"]["model"] == "ST2000NM000A-2J2"


def test_read_disks_in_natural_order(tmp_path: Path) -> None:
    for name in ("nvme10n1", "nvme2n1", "sdb"):
        (tmp_path / "sys/block" / name).mkdir(parents=True)
        (tmp_path / "sys/block" / name / "size").write_text("8\n")
    assert [d["name"] for d in read_disks(str(tmp_path))] == ["nvme2n1", "nvme10n1", "sdb"]
    assert read_disks(str(tmp_path))[0]["rotational"] is None  # no queue/rotational: unknown


def test_read_disks_without_sys_block(tmp_path: Path) -> None:
    assert read_disks(str(tmp_path)) == []


def test_parse_mounts_keeps_real_filesystems_and_dev_shm() -> None:
    mounts = parse_mounts((FIXTURES / "proc" / "self" / "mounts").read_text())
    assert [m["mountpoint"] for m in mounts] == ["/", "/dev/shm", "/boot/efi", "/data", "/mnt/model weights"]
    by_point = {m["mountpoint"]: m for m in mounts}
    assert by_point["/"] == {
        "device": "/dev/nvme0n1p2",
        "mountpoint": "/",
        "fstype": "ext4",
        "options": "rw,relatime",
    }
    assert by_point["/data"]["options"] == "rw,noatime,stripe=256"  # the later (visible) mount
    assert by_point["/mnt/model weights"]["fstype"] == "nfs4"
    assert by_point["/dev/shm"]["fstype"] == "tmpfs"


def test_parse_mounts_keeps_a_configured_shm_tmpfs() -> None:
    text = "tmpfs /dev/shm tmpfs rw 0 0\ntmpfs /run/shm2 tmpfs rw 0 0\ntmpfs /run tmpfs rw 0 0\n"
    assert [m["mountpoint"] for m in parse_mounts(text, shm_path="/run/shm2")] == ["/dev/shm", "/run/shm2"]


def test_read_mounts_sizes(tmp_path: Path) -> None:
    mounts = read_mounts(PROCFS, "/dev/shm", 0)
    assert all(m["size_bytes"] is None for m in mounts)  # timeout 0: statvfs skipped
    sizes = fs_sizes(str(tmp_path), 5)
    assert sizes["size_bytes"] is not None
    assert sizes["free_bytes"] is not None
    assert sizes["available_bytes"] is not None
    assert sizes["size_bytes"] > 0
    assert 0 <= sizes["available_bytes"] <= sizes["free_bytes"] <= sizes["size_bytes"]
    assert fs_sizes(str(tmp_path / "absent"), 5) == {
        "size_bytes": None,
        "free_bytes": None,
        "available_bytes": None,
    }


def test_read_mounts_falls_back_to_proc_mounts(tmp_path: Path) -> None:
    (tmp_path / "mounts").write_text(f"/dev/sda1 {tmp_path} ext4 rw 0 0\n")
    [mount] = read_mounts(str(tmp_path), "/dev/shm", 5)
    assert mount["mountpoint"] == str(tmp_path)
    assert mount["size_bytes"] is not None
    assert mount["size_bytes"] > 0


def test_read_shm_lists_vllm_offload_files(tmp_path: Path) -> None:
    (tmp_path / "vllm_offload_0_123").write_bytes(b"x" * 4096)
    (tmp_path / "vllm_offload_1_123").write_bytes(b"x" * 100)
    (tmp_path / "nccl-abc").write_bytes(b"x")
    shm = read_shm(str(tmp_path))
    assert shm["vllm_offload_files"] == [
        {"name": "vllm_offload_0_123", "size_bytes": 4096},
        {"name": "vllm_offload_1_123", "size_bytes": 100},
    ]
    assert shm["vllm_offload_bytes"] == 4196
    assert shm["size_bytes"] > 0
    assert shm["used_bytes"] >= 0
    assert shm["error"] is None


def test_read_shm_takes_a_path_with_glob_characters_literally(tmp_path: Path) -> None:
    shm_dir = tmp_path / "shm[1]"
    shm_dir.mkdir()
    (shm_dir / "vllm_offload_0").write_bytes(b"x" * 10)
    assert read_shm(str(shm_dir))["vllm_offload_files"] == [{"name": "vllm_offload_0", "size_bytes": 10}]


def test_read_shm_missing_path(tmp_path: Path) -> None:
    shm = read_shm(str(tmp_path / "absent"))
    assert shm["size_bytes"] is None
    assert shm["vllm_offload_files"] == []
    assert "absent" in shm["error"]
