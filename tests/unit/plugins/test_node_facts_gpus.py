# SPDX-License-Identifier: MIT
"""Running nvidia-smi (plugins/module_utils/node_facts/gpus.py): errors as facts, timeouts, old drivers.

There is no GPU here, so nvidia-smi's answers are scripted (ScriptedNvidiaSmiMock); the NUMA nodes come
from the fixture sysfs tree.
"""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.node_facts.gpus import gather_gpus, read_pci_numa_node
from ansible.module_utils.node_facts.nvidia_smi import GPU_QUERY_FIELDS, parse_gpu_csv

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "node_facts"
SYSFS = str(FIXTURES / "sysfs")
SMI = FIXTURES / "nvidia_smi"


class ScriptedNvidiaSmiMock:
    """Just enough of AnsibleModule for gather_gpus: scripted run_command, a PATH lookup from a dict."""

    def __init__(self, responses: list[tuple[int, str, str]], binaries: dict[str, str] | None = None) -> None:
        self.responses = list(responses)
        self.binaries = binaries if binaries is not None else {"nvidia-smi": "/usr/bin/nvidia-smi"}
        self.calls: list[list[str]] = []

    def get_bin_path(self, arg: str, required: bool = False) -> str | None:
        assert not required
        return self.binaries.get(arg)

    def run_command(self, args: list[str], environ_update: dict[str, str] | None = None) -> tuple[int, str, str]:
        assert isinstance(args, list)
        assert environ_update == {"LC_ALL": "C"}
        self.calls.append(args)
        return self.responses.pop(0)


def test_numa_node_of_a_vm_gpu_without_numa_topology_is_none() -> None:
    gpus = parse_gpu_csv((SMI / "h200_1gpu_nounits.csv").read_text(), GPU_QUERY_FIELDS)
    # that VM's GPU has numa_node -1 in sysfs, as VMs without a NUMA topology do
    assert read_pci_numa_node(SYSFS, gpus[0]["pci_bus_id"]) is None
    assert read_pci_numa_node(SYSFS, "00000000:18:00.0") == 0
    assert read_pci_numa_node(SYSFS, None) is None
    assert read_pci_numa_node(SYSFS, "00000000:77:00.0") is None  # no such device


def test_gather_gpus_without_nvidia_smi() -> None:
    module = ScriptedNvidiaSmiMock([], binaries={})
    assert gather_gpus(module, SYSFS, None, 60) == ([], "nvidia-smi not found", None)
    assert module.calls == []


def test_gather_gpus_with_a_missing_override_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nvidia-smi")
    gpus, error, _cuda = gather_gpus(ScriptedNvidiaSmiMock([]), SYSFS, missing, 60)
    assert gpus == []
    assert error == f"nvidia-smi not found at {missing}"


def test_gather_gpus_when_the_driver_is_not_loaded() -> None:
    failed = (SMI / "failed_driver.stdout").read_text()
    module = ScriptedNvidiaSmiMock([(9, failed, "")], binaries={"nvidia-smi": "/usr/bin/nvidia-smi"})
    gpus, error, cuda = gather_gpus(module, SYSFS, None, 0)
    assert gpus == []
    assert error == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    assert cuda is None
    assert module.calls == [
        [
            "/usr/bin/nvidia-smi",
            "--query-gpu=" + ",".join(GPU_QUERY_FIELDS),
            "--format=csv,noheader,nounits",
        ]
    ]


def test_gather_gpus_prefers_stderr_and_has_a_fallback_message() -> None:
    module = ScriptedNvidiaSmiMock([(6, "", "No devices were found\n")], binaries={"nvidia-smi": "/x/nvidia-smi"})
    assert gather_gpus(module, SYSFS, None, 0)[1] == "No devices were found"
    module = ScriptedNvidiaSmiMock([(3, "", "")], binaries={"nvidia-smi": "/x/nvidia-smi"})
    assert gather_gpus(module, SYSFS, None, 0)[1] == "nvidia-smi failed with rc 3"


def test_gather_gpus_reports_an_unparsable_answer() -> None:
    module = ScriptedNvidiaSmiMock([(0, "0, NVIDIA H200\n", "")])
    gpus, error, cuda = gather_gpus(module, SYSFS, None, 0)
    assert (gpus, cuda) == ([], None)
    assert error is not None
    assert error.startswith("unparsable nvidia-smi line (2 fields, expected 9)")


def test_gather_gpus_success_fills_numa_nodes_and_cuda_version() -> None:
    out = (SMI / "hgx_h200_8gpu_nounits.csv").read_text()
    module = ScriptedNvidiaSmiMock(
        [(0, out, ""), (0, (SMI / "version.txt").read_text(), "")],
        binaries={"nvidia-smi": "/usr/bin/nvidia-smi", "timeout": "/usr/bin/timeout"},
    )
    gpus, error, cuda = gather_gpus(module, SYSFS, None, 60)
    assert error is None
    assert cuda == "13.0"
    # 0000:ba:00.0 has numa_node -1 -> None; 00000001:DB:00.0 is looked up as 0001:db:00.0
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, None, 1]
    assert module.calls[0][:3] == ["/usr/bin/timeout", "--kill-after=5", "60"]
    assert module.calls[1] == ["/usr/bin/timeout", "--kill-after=5", "60", "/usr/bin/nvidia-smi", "--version"]


def test_gather_gpus_timeout_is_reported() -> None:
    module = ScriptedNvidiaSmiMock([(124, "", "")], binaries={"nvidia-smi": "/usr/bin/nvidia-smi", "timeout": "/t"})
    assert gather_gpus(module, SYSFS, None, 30) == ([], "nvidia-smi timed out after 30s", None)


def test_gather_gpus_without_a_timeout_binary_runs_unlimited() -> None:
    module = ScriptedNvidiaSmiMock([(124, "", "killed\n")])  # rc 124 of nvidia-smi itself is no timeout
    assert gather_gpus(module, SYSFS, None, 30) == ([], "killed", None)
    assert module.calls[0][0] == "/usr/bin/nvidia-smi"


def test_gather_gpus_retries_without_compute_cap_on_old_drivers() -> None:
    old = 'Field "compute_cap" is not a valid field to query.\n'
    line = "0, Tesla V100-SXM2-32GB, GPU-1, 470.82.01, 32510, 0, Enabled, 00000000:18:00.0\n"
    plain = "| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: 11.4     |\n"
    module = ScriptedNvidiaSmiMock([(2, old, ""), (0, line, ""), (1, "", "bad option"), (0, plain, "")])
    gpus, error, cuda = gather_gpus(module, SYSFS, None, 0)
    assert error is None
    assert cuda == "11.4"
    assert gpus[0]["compute_cap"] is None
    assert gpus[0]["name"] == "Tesla V100-SXM2-32GB"
    assert gpus[0]["numa_node"] == 0
    assert "compute_cap" not in module.calls[1][1]
    assert module.calls[3] == ["/usr/bin/nvidia-smi"]
