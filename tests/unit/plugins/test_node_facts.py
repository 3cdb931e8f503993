# SPDX-License-Identifier: MIT
"""Unit tests for plugins/modules/node_facts.py (pure parsers on fixtures + one end-to-end run)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MODULE_DIR = REPO / "plugins" / "modules"
FIXTURES = REPO / "tests" / "fixtures" / "node_facts"
SYSFS = FIXTURES / "sysfs"
PROCFS = FIXTURES / "proc"
SMI = FIXTURES / "nvidia_smi"


def _load_module():
    spec = importlib.util.spec_from_file_location("node_facts", MODULE_DIR / "node_facts.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nf = _load_module()

SHORT_FIELDS = ["name", "driver_version", "memory.total", "memory.used", "pci.bus_id", "compute_cap"]
GiB = 1024**3


# ------------------------------------------------------------------------------------------
# nvidia-smi parsing
# ------------------------------------------------------------------------------------------


def test_real_h200_short_capture_with_units():
    text = (SMI / "h200_short_units.csv").read_text()
    assert text.strip() == "NVIDIA H200, 580.159.04, 143771 MiB, 0 MiB, 00000000:00:06.0, 9.0"
    gpus = nf.parse_gpu_csv(text, SHORT_FIELDS)
    assert gpus == [
        {
            "index": 0,  # not queried: position in the output
            "name": "NVIDIA H200",
            "uuid": None,
            "driver_version": "580.159.04",
            "memory_total_mib": 143771,
            "memory_used_mib": 0,
            "persistence_mode": None,
            "pci_bus_id": "00000000:00:06.0",
            "compute_cap": "9.0",
            "numa_node": None,
        }
    ]


def test_real_h200_full_query_capture():
    gpus = nf.parse_gpu_csv((SMI / "h200_1gpu_nounits.csv").read_text(), nf.GPU_QUERY_FIELDS)
    assert gpus == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "uuid": "GPU-f8bd89d3-7157-0623-f6e1-d7ce19d87cce",
            "driver_version": "580.159.04",
            "memory_total_mib": 143771,
            "memory_used_mib": 0,
            "persistence_mode": True,
            "pci_bus_id": "00000000:00:06.0",
            "compute_cap": "9.0",
            "numa_node": None,
        }
    ]
    # that VM's GPU has numa_node -1 in sysfs, as VMs without a NUMA topology do
    assert nf.read_pci_numa_node(str(SYSFS), gpus[0]["pci_bus_id"]) is None


def test_eight_gpu_nounits_capture():
    gpus = nf.parse_gpu_csv((SMI / "hgx_h200_8gpu_nounits.csv").read_text(), nf.GPU_QUERY_FIELDS)
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["name"] for g in gpus} == {"NVIDIA H200"}
    assert {g["driver_version"] for g in gpus} == {"580.159.04"}
    assert all(g["memory_total_mib"] == 143771 for g in gpus)
    assert gpus[0]["uuid"] == "GPU-3f1c2a4e-6b7d-4e8f-9a0b-1c2d3e4f5a60"
    assert gpus[2]["memory_used_mib"] == 129305
    assert [g["persistence_mode"] for g in gpus] == [True, True, True, True, False, True, None, True]
    assert gpus[6]["memory_used_mib"] is None  # [N/A]
    assert gpus[7]["compute_cap"] is None  # [Not Supported]
    assert gpus[7]["pci_bus_id"] == "00000001:DB:00.0"
    assert all(g["numa_node"] is None for g in gpus)  # filled from sysfs by gather_gpus


def test_gpu_name_with_a_comma_is_rejoined():
    gpus = nf.parse_gpu_csv(
        "0, Some GPU, Rev B, 81559, 3\n", ["index", "name", "memory.total", "memory.used"]
    )
    assert gpus[0]["name"] == "Some GPU, Rev B"
    assert gpus[0]["memory_used_mib"] == 3


def test_gpu_line_with_wrong_field_count_is_an_error():
    with pytest.raises(ValueError, match="unparsable"):
        nf.parse_gpu_csv("0, 1\n", ["index", "memory.total", "memory.used"])
    with pytest.raises(ValueError, match="unsupported"):
        nf.parse_gpu_csv("", ["index", "clocks.sm"])


def test_empty_gpu_output():
    assert nf.parse_gpu_csv("\n\n", nf.GPU_QUERY_FIELDS) == []


@pytest.mark.parametrize(
    ("bus_id", "expected"),
    [
        ("00000000:00:06.0", "0000:00:06.0"),
        ("00000000:9A:00.0", "0000:9a:00.0"),
        ("00000001:DB:00.0", "0001:db:00.0"),
        ("0000:18:00.0", "0000:18:00.0"),
        ("18:00.0", "0000:18:00.0"),
    ],
)
def test_pci_sysfs_name(bus_id, expected):
    assert nf.pci_sysfs_name(bus_id) == expected


def test_cuda_version():
    assert nf.parse_cuda_version((SMI / "plain_header.txt").read_text()) == "13.0"
    assert nf.parse_cuda_version((SMI / "version.txt").read_text()) == "13.0"
    assert nf.parse_cuda_version((SMI / "failed_driver.stdout").read_text()) is None
    assert nf.parse_cuda_version(None) is None


class FakeModule:
    """Just enough of AnsibleModule for gather_gpus: scripted run_command, fake PATH lookup."""

    def __init__(self, responses, binaries=None):
        self.responses = list(responses)
        self.binaries = binaries if binaries is not None else {"nvidia-smi": "/usr/bin/nvidia-smi"}
        self.calls = []

    def get_bin_path(self, name, required=False):
        assert not required
        return self.binaries.get(name)

    def run_command(self, args, environ_update=None):
        assert isinstance(args, list)
        assert environ_update == {"LC_ALL": "C"}
        self.calls.append(args)
        return self.responses.pop(0)


def test_gather_gpus_without_nvidia_smi():
    module = FakeModule([], binaries={})
    assert nf.gather_gpus(module, str(SYSFS), None, 60) == ([], "nvidia-smi not found", None)
    assert module.calls == []


def test_gather_gpus_with_a_missing_override_path(tmp_path):
    missing = str(tmp_path / "nvidia-smi")
    gpus, error, _cuda = nf.gather_gpus(FakeModule([]), str(SYSFS), missing, 60)
    assert gpus == []
    assert error == f"nvidia-smi not found at {missing}"


def test_gather_gpus_when_the_driver_is_not_loaded():
    failed = (SMI / "failed_driver.stdout").read_text()
    module = FakeModule([(9, failed, "")], binaries={"nvidia-smi": "/usr/bin/nvidia-smi"})
    gpus, error, cuda = nf.gather_gpus(module, str(SYSFS), None, 0)
    assert gpus == []
    assert error == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    assert cuda is None
    assert module.calls == [
        [
            "/usr/bin/nvidia-smi",
            "--query-gpu=" + ",".join(nf.GPU_QUERY_FIELDS),
            "--format=csv,noheader,nounits",
        ]
    ]


def test_gather_gpus_prefers_stderr_and_has_a_fallback_message():
    module = FakeModule([(6, "", "No devices were found\n")], binaries={"nvidia-smi": "/x/nvidia-smi"})
    assert nf.gather_gpus(module, str(SYSFS), None, 0)[1] == "No devices were found"
    module = FakeModule([(3, "", "")], binaries={"nvidia-smi": "/x/nvidia-smi"})
    assert nf.gather_gpus(module, str(SYSFS), None, 0)[1] == "nvidia-smi failed with rc 3"


def test_gather_gpus_success_fills_numa_nodes_and_cuda_version():
    out = (SMI / "hgx_h200_8gpu_nounits.csv").read_text()
    module = FakeModule(
        [(0, out, ""), (0, (SMI / "version.txt").read_text(), "")],
        binaries={"nvidia-smi": "/usr/bin/nvidia-smi", "timeout": "/usr/bin/timeout"},
    )
    gpus, error, cuda = nf.gather_gpus(module, str(SYSFS), None, 60)
    assert error is None
    assert cuda == "13.0"
    # 0000:ba:00.0 has numa_node -1 -> None; 00000001:DB:00.0 is looked up as 0001:db:00.0
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, None, 1]
    assert module.calls[0][:3] == ["/usr/bin/timeout", "--kill-after=5", "60"]
    assert module.calls[1] == ["/usr/bin/timeout", "--kill-after=5", "60", "/usr/bin/nvidia-smi", "--version"]


def test_gather_gpus_timeout_is_reported():
    module = FakeModule([(124, "", "")], binaries={"nvidia-smi": "/usr/bin/nvidia-smi", "timeout": "/t"})
    assert nf.gather_gpus(module, str(SYSFS), None, 30) == ([], "nvidia-smi timed out after 30s", None)


def test_gather_gpus_retries_without_compute_cap_on_old_drivers():
    old = 'Field "compute_cap" is not a valid field to query.\n'
    line = "0, Tesla V100-SXM2-32GB, GPU-1, 470.82.01, 32510, 0, Enabled, 00000000:18:00.0\n"
    plain = "| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: 11.4     |\n"
    module = FakeModule([(2, old, ""), (0, line, ""), (1, "", "bad option"), (0, plain, "")])
    gpus, error, cuda = nf.gather_gpus(module, str(SYSFS), None, 0)
    assert error is None
    assert cuda == "11.4"
    assert gpus[0]["compute_cap"] is None
    assert gpus[0]["name"] == "Tesla V100-SXM2-32GB"
    assert gpus[0]["numa_node"] == 0
    assert "compute_cap" not in module.calls[1][1]
    assert module.calls[3] == ["/usr/bin/nvidia-smi"]


# ------------------------------------------------------------------------------------------
# /proc and /sys
# ------------------------------------------------------------------------------------------


def test_read_numa_two_nodes():
    numa = nf.read_numa(str(SYSFS))
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


def test_read_numa_without_the_node_directory(tmp_path):
    assert nf.read_numa(str(tmp_path)) == []


def test_parse_meminfo():
    memory = nf.parse_meminfo((PROCFS / "meminfo").read_text())
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


def test_node_meminfo_sums_to_meminfo_total():
    numa = nf.read_numa(str(SYSFS))
    total = nf.parse_meminfo((PROCFS / "meminfo").read_text())["total_bytes"]
    assert sum(n["mem_total_bytes"] for n in numa) == total


def test_read_cpu_two_sockets():
    assert nf.read_cpu(str(PROCFS), str(SYSFS)) == {
        "model": "Intel(R) Xeon(R) Platinum 8480+",
        "sockets": 2,
        "cores": 4,
        "threads": 8,
    }


def test_cpu_topology_falls_back_to_sysfs_on_aarch64():
    cpu = nf.parse_cpuinfo((PROCFS / "cpuinfo_aarch64").read_text())
    assert cpu == {"model": None, "sockets": None, "cores": None, "threads": 8}
    assert nf.read_cpu_topology(str(SYSFS)) == (2, 4)


def test_cpuinfo_without_core_id_uses_cpu_cores():
    text = "".join(
        f"processor\t: {n}\nmodel name\t: X\nphysical id\t: {n % 2}\ncpu cores\t: 3\n\n" for n in range(4)
    )
    assert nf.parse_cpuinfo(text) == {"model": "X", "sockets": 2, "cores": 6, "threads": 4}


def test_read_disks():
    disks = {d["name"]: d for d in nf.read_disks(str(SYSFS))}
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


def test_read_disks_without_sys_block(tmp_path):
    assert nf.read_disks(str(tmp_path)) == []


def test_parse_mounts_keeps_real_filesystems_and_dev_shm():
    mounts = nf.parse_mounts((PROCFS / "self" / "mounts").read_text())
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


def test_parse_mounts_keeps_a_configured_shm_tmpfs():
    text = "tmpfs /dev/shm tmpfs rw 0 0\ntmpfs /run/shm2 tmpfs rw 0 0\ntmpfs /run tmpfs rw 0 0\n"
    assert [m["mountpoint"] for m in nf.parse_mounts(text, shm_path="/run/shm2")] == ["/dev/shm", "/run/shm2"]


def test_read_mounts_sizes(tmp_path):
    mounts = nf.read_mounts(str(PROCFS), "/dev/shm", 0)
    assert all(m["size_bytes"] is None for m in mounts)  # timeout 0: statvfs skipped
    sizes = nf.fs_sizes(str(tmp_path), 5)
    assert sizes["size_bytes"] > 0
    assert 0 <= sizes["available_bytes"] <= sizes["free_bytes"] <= sizes["size_bytes"]
    assert nf.fs_sizes(str(tmp_path / "absent"), 5) == {
        "size_bytes": None,
        "free_bytes": None,
        "available_bytes": None,
    }


def test_read_shm_lists_vllm_offload_files(tmp_path):
    (tmp_path / "vllm_offload_0_123").write_bytes(b"x" * 4096)
    (tmp_path / "vllm_offload_1_123").write_bytes(b"x" * 100)
    (tmp_path / "nccl-abc").write_bytes(b"x")
    shm = nf.read_shm(str(tmp_path))
    assert shm["vllm_offload_files"] == [
        {"name": "vllm_offload_0_123", "size_bytes": 4096},
        {"name": "vllm_offload_1_123", "size_bytes": 100},
    ]
    assert shm["vllm_offload_bytes"] == 4196
    assert shm["size_bytes"] > 0
    assert shm["used_bytes"] >= 0
    assert shm["error"] is None


def test_read_shm_missing_path(tmp_path):
    shm = nf.read_shm(str(tmp_path / "absent"))
    assert shm["size_bytes"] is None
    assert shm["vllm_offload_files"] == []
    assert "absent" in shm["error"]


# ------------------------------------------------------------------------------------------
# end to end through ansible-playbook on this machine
# ------------------------------------------------------------------------------------------

VENV_BIN = Path(sys.executable).parent
ANSIBLE_PLAYBOOK = VENV_BIN / "ansible-playbook"


def _run_playbook(tmp_path, module_args, check=False):
    """Run node_facts on localhost through ansible-playbook; return the task result dict."""
    playbook = tmp_path / "play.yml"
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"name": "node facts", "node_facts": module_args}],
    }
    playbook.write_text(json.dumps([play]))  # JSON is YAML
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")  # isolate from any project ansible.cfg
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
        ANSIBLE_HOME=str(tmp_path / "ansible_home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible_tmp"),
        ANSIBLE_LIBRARY=str(MODULE_DIR),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_NOCOLOR="1",
    )
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(playbook)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["stats"]["localhost"]["failures"] == 0
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


needs_ansible = pytest.mark.skipif(
    not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not next to python"
)


@needs_ansible
@pytest.mark.parametrize("check", [False, True], ids=["normal", "check_mode"])
def test_end_to_end_on_this_machine(tmp_path, check):
    args = {}
    if shutil.which("nvidia-smi"):  # a GPU machine: force the no-GPU path this test is about
        args["nvidia_smi_path"] = str(tmp_path / "no-nvidia-smi")
    result = _run_playbook(tmp_path, args, check=check)
    assert result["changed"] is False
    facts = result["ansible_facts"]["node_facts"]
    assert result["node_facts"] == facts
    assert facts["gpus"] == []
    assert facts["gpu_count"] == 0
    assert facts["gpu_error"].startswith("nvidia-smi not found")
    assert facts["driver_version"] is None
    assert facts["memory"]["total_bytes"] > 0
    assert facts["page_cache_bytes"] == facts["memory"]["cached_bytes"]
    assert isinstance(facts["numa"], list)
    assert facts["mounts"]
    assert any(m["mountpoint"] == "/" for m in facts["mounts"])
    assert facts["cpu"]["threads"] >= 1
    assert facts["kernel"] == os.uname().release
    assert isinstance(facts["disks"], list)
    assert facts["shm"]["path"] == "/dev/shm"


@needs_ansible
def test_end_to_end_with_fixture_trees_and_a_fake_nvidia_smi(tmp_path):
    envlog = tmp_path / "lc_all.txt"
    stub = tmp_path / "nvidia-smi"
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "$LC_ALL" > "{envlog}"\n'
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{SMI / "hgx_h200_8gpu_nounits.csv"}" ;;\n'
        f'  --version) cat "{SMI / "version.txt"}" ;;\n'
        f'  *) cat "{SMI / "plain_header.txt"}" ;;\n'
        "esac\n"
    )
    stub.chmod(0o755)
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "vllm_offload_7").write_bytes(b"\0" * 1000)
    args = {
        "sysfs_root": str(SYSFS),
        "procfs_root": str(PROCFS),
        "shm_path": str(shm),
        "nvidia_smi_path": str(stub),
        "mount_timeout": 0,
    }
    result = _run_playbook(tmp_path, args, check=True)
    facts = result["node_facts"]
    assert result["changed"] is False
    assert envlog.read_text().strip() == "C"
    assert facts["gpu_error"] is None
    assert facts["gpu_count"] == 8
    assert facts["driver_version"] == "580.159.04"
    assert facts["cuda_version"] == "13.0"
    assert [g["numa_node"] for g in facts["gpus"]] == [0, 0, 0, 0, 1, 1, None, 1]
    assert [n["node"] for n in facts["numa"]] == [0, 1]
    assert facts["memory"]["total_bytes"] == 2112322492 * 1024
    assert facts["page_cache_bytes"] == 80380392 * 1024
    assert facts["cpu"]["sockets"] == 2
    assert [d["name"] for d in facts["disks"]] == ["loop1", "md0", "nvme0n1", "nvme1n1", "sda"]
    assert facts["shm"]["vllm_offload_files"] == [{"name": "vllm_offload_7", "size_bytes": 1000}]
    assert facts["shm"]["vllm_offload_bytes"] == 1000
    assert [m["mountpoint"] for m in facts["mounts"]] == [
        "/",
        "/dev/shm",
        "/boot/efi",
        "/data",
        "/mnt/model weights",
    ]
    assert all(m["size_bytes"] is None for m in facts["mounts"])  # mount_timeout 0
