# SPDX-License-Identifier: MIT
"""nvidia-smi output parsers (plugins/module_utils/node_facts/nvidia_smi.py) on real and written captures."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.module_utils.node_facts.nvidia_smi import (
    GPU_QUERY_FIELDS,
    first_line,
    parse_cuda_version,
    parse_gpu_csv,
    pci_sysfs_name,
)

SMI = Path(__file__).resolve().parents[2] / "fixtures" / "node_facts" / "nvidia_smi"
SHORT_FIELDS = ["name", "driver_version", "memory.total", "memory.used", "pci.bus_id", "compute_cap"]


def test_real_h200_short_capture_with_units() -> None:
    text = (SMI / "h200_short_units.csv").read_text()
    assert text.strip() == "NVIDIA H200, 580.159.04, 143771 MiB, 0 MiB, 00000000:00:06.0, 9.0"
    gpus = parse_gpu_csv(text, SHORT_FIELDS)
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


def test_real_h200_full_query_capture() -> None:
    gpus = parse_gpu_csv((SMI / "h200_1gpu_nounits.csv").read_text(), GPU_QUERY_FIELDS)
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


def test_eight_gpu_nounits_capture() -> None:
    gpus = parse_gpu_csv((SMI / "hgx_h200_8gpu_nounits.csv").read_text(), GPU_QUERY_FIELDS)
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


def test_gpu_name_with_a_comma_is_rejoined() -> None:
    gpus = parse_gpu_csv("0, Some GPU, Rev B, 81559, 3\n", ["index", "name", "memory.total", "memory.used"])
    assert gpus[0]["name"] == "Some GPU, Rev B"
    assert gpus[0]["memory_used_mib"] == 3


def test_gpu_line_with_wrong_field_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="unparsable"):
        parse_gpu_csv("0, 1\n", ["index", "memory.total", "memory.used"])
    with pytest.raises(ValueError, match="unsupported"):
        parse_gpu_csv("", ["index", "clocks.sm"])


def test_empty_gpu_output() -> None:
    assert parse_gpu_csv("\n\n", GPU_QUERY_FIELDS) == []


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
def test_pci_sysfs_name(bus_id: str, expected: str) -> None:
    assert pci_sysfs_name(bus_id) == expected


def test_cuda_version() -> None:
    assert parse_cuda_version((SMI / "plain_header.txt").read_text()) == "13.0"
    assert parse_cuda_version((SMI / "version.txt").read_text()) == "13.0"
    assert parse_cuda_version((SMI / "failed_driver.stdout").read_text()) is None
    assert parse_cuda_version(None) is None


def test_first_line_prefers_the_first_text_with_a_line() -> None:
    assert first_line("\n  \n", "  out line \nmore") == "out line"
    assert first_line("err\n", "out\n") == "err"
    assert first_line(None, "") is None
