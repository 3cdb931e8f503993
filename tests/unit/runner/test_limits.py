"""The node's measured limits read from a results folder's storage trials, and the offload report
putting each tier's achieved rate beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from runner.experiments.limits import Rate, host_limits, node_limits, transfer_limit
from runner.experiments.offload import report as offload_report

H200 = {"gpu": 0, "gpu_name": "NVIDIA H200", "pci_bus_id": "00000000:19:00.0"}


def _copy_metrics(h2d_pinned: float, d2h_pinned: float = 50.0) -> dict[str, Any]:
    return {**H200, "h2d_pinned_gb_s": h2d_pinned, "d2h_pinned_gb_s": d2h_pinned, "h2d_pageable_gb_s": 19.5,
            "d2h_pageable_gb_s": 17.0, "h2d_pinned_gb_s_max": h2d_pinned + 1, "h2d_pinned_s": 0.02, "size_bytes": 2**30}


def _trial(root: Path, trial_id: str, **record: Any) -> None:
    folder = root / "trials" / trial_id
    folder.mkdir(parents=True)
    (folder / "trial.json").write_text(json.dumps({"id": trial_id, "repeat": 1, "reason": "", **record}))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for i, rate in enumerate((54.0, 56.0, 55.2), 1):
        _trial(root, f"storage.h2d_copy.r{i}@h200", kind="storage", mode="h2d_copy", host="h200", status="ok",
               params={"size_mib": 1024, "repeats": 5, "gpu": 0}, metrics=_copy_metrics(rate))
    _trial(root, "storage.seq_read_direct.r1@h200", kind="storage", mode="seq_read_direct", host="h200",
           status="ok", params={"target": "/opt/data/fio"}, metrics={"gb_s": 1.75})
    _trial(root, "storage.buffered_read.r1@h200", kind="storage", mode="buffered_read", host="h200",
           status="ok", params={"target": "/opt/data/fio"}, metrics={"gb_s": 1.6})
    _trial(root, "storage.h2d_copy.r1@cpu-node", kind="storage", mode="h2d_copy", host="cpu-node", status="skipped",
           reason="cpu-node: no NVIDIA driver on this node: cannot load libcuda.so.1", params={"gpu": 0})
    _trial(root, "storage.seq_read_direct.r1@cpu-node", kind="storage", mode="seq_read_direct", host="cpu-node",
           status="failed", reason="fio ended with error 5", params={})
    # Neither an ok storage trial nor one at all: ignored.
    _trial(root, "offload.native_cpu.r1@h200", kind="offload", mode="native_cpu", host="h200", status="ok",
           metrics={"gb_s": 999.0})
    (root / "trials" / "storage.broken.r1@h200").mkdir()
    (root / "trials" / "storage.broken.r1@h200" / "trial.json").write_text("{half a record")
    return root


def test_rates_are_medians_of_the_ok_trials_with_their_source(results: Path) -> None:
    limits = node_limits(results)
    assert set(limits) == {"h200", "cpu-node"}
    h200 = limits["h200"]
    assert h200.copy("h2d", "pinned") == Rate(55.2, "h2d_copy h2d pinned, GPU 0 NVIDIA H200 (00000000:19:00.0)", 3)
    assert h200.copy("d2h", "pinned") is not None and h200.copy("d2h", "pinned").gb_s == 50.0
    assert h200.copy("h2d", "pageable") is not None and h200.copy("h2d", "pageable").gb_s == 19.5
    # Buffered reads first (a file read goes through the page cache), direct I/O where asked.
    assert h200.disk_read() == Rate(1.6, "fio buffered_read /opt/data/fio", 1)
    assert h200.disk_read(("seq_read_direct",)) == Rate(1.75, "fio seq_read_direct /opt/data/fio", 1)
    assert h200.not_measured == {}
    cpu = limits["cpu-node"]
    assert cpu.copy() is None and cpu.disk_read() is None
    assert cpu.not_measured == {
        "h2d_copy": "skipped: cpu-node: no NVIDIA driver on this node: cannot load libcuda.so.1",
        "seq_read_direct": "failed: fio ended with error 5"}


def test_a_folder_without_storage_trials_has_no_limits(tmp_path: Path) -> None:
    assert node_limits(tmp_path) == {}
    assert host_limits(tmp_path, "h200") is None


def test_each_transfer_maps_to_the_limit_that_bounds_it(results: Path) -> None:
    h200, cpu = node_limits(results)["h200"], node_limits(results)["cpu-node"]
    assert transfer_limit(h200, "cpu", "gpu") == (h200.copy("h2d", "pinned"), "pinned host → GPU copy")
    assert transfer_limit(h200, "GPU", "CPU") == (h200.copy("d2h", "pinned"), "pinned GPU → host copy")
    assert transfer_limit(h200, "fs", "cpu") == (h200.disk_read(), "disk read")
    assert transfer_limit(h200, "cpu", "fs") == (None, "a disk write: the storage kind measures reads only")
    assert transfer_limit(h200, "gpu", "gpu") == (None, "no measured limit for gpu → gpu")
    rate, why = transfer_limit(cpu, "cpu", "gpu")
    assert rate is None and why == ("no pinned host → GPU copy rate (skipped: cpu-node: no NVIDIA driver on this "
                                    "node: cannot load libcuda.so.1)")
    assert transfer_limit(cpu, "disk", "gpu") == (None, "no disk read rate (seq_read_direct failed: fio ended with "
                                                        "error 5)")


def _offload_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The frame runner.report hands a kind's section: the front columns, then the kind's rows."""
    rows = []
    for r in records:
        front = {"trial_id": r["id"], "host": r["host"], "mode": r["mode"], "repeat": r["repeat"],
                 "status": r["status"], "reason": ""}
        rows.extend({**front, **row} for row in offload_report.rows(r))
    return pd.DataFrame(rows).convert_dtypes()


def _offload(mode: str, repeat: int, host: str = "h200", **metrics: float) -> dict[str, Any]:
    return {"id": f"offload.{mode}.r{repeat}@{host}", "host": host, "mode": mode, "repeat": repeat, "status": "ok",
            "metrics": {"kv_transfer_source": "metrics", **metrics}}


def test_offload_report_puts_each_tiers_rate_beside_the_nodes_limits(results: Path) -> None:
    frame = _offload_frame([
        _offload("native_cpu", 1, kv_cpu_to_gpu_gb_s=36.0, kv_gpu_to_cpu_gb_s=49.0),
        _offload("native_cpu", 2, kv_cpu_to_gpu_gb_s=40.0, kv_gpu_to_cpu_gb_s=51.0),
        _offload("tiered", 1, kv_fs_to_cpu_gb_s=0.8, kv_cpu_to_fs_gb_s=1.1),
    ])
    text = offload_report.section(frame, results)
    assert ("- h200: host → GPU pinned 55.20 GB/s, GPU → host pinned 50.00 GB/s, host → GPU pageable 19.50 GB/s, "
            "disk read 1.60 GB/s (fio buffered_read /opt/data/fio)") in text
    table = text[text.index("| host | mode | transfer |"):]
    lines = table.splitlines()
    assert lines[0] == "| host | mode | transfer | achieved_gb_s | limit_gb_s | limit | achieved_pct_of_limit |"
    body = [line for line in lines[2:] if line.startswith("| h200")]
    # native_cpu: medians 38.0 and 50.0 GB/s against the pinned copies; tiered against the disk.
    assert body == [
        "| h200 | native_cpu | cpu → gpu | 38.0 | 55.2 | pinned host → GPU copy | 68.8 |",
        "| h200 | native_cpu | gpu → cpu | 50.0 | 50.0 | pinned GPU → host copy | 100.0 |",
        "| h200 | tiered | cpu → fs | 1.1 |  | a disk write: the storage kind measures reads only |  |",
        "| h200 | tiered | fs → cpu | 0.8 | 1.6 | disk read | 50.0 |",
    ]


def test_offload_report_without_storage_trials_or_transfer_bytes(results: Path, tmp_path: Path) -> None:
    standin = _offload_frame([_offload("native_cpu", 1, host="h200")])
    assert "measured limits" not in offload_report.section(standin, tmp_path / "elsewhere")
    text = offload_report.section(standin, results)
    assert "- h200: host → GPU pinned 55.20 GB/s" in text
    assert "The engine counted no KV transfer bytes (the stand-in counts tokens): nothing to compare." in text
    other = _offload_frame([_offload("native_cpu", 1, host="cpu-node", kv_cpu_to_gpu_gb_s=3.0)])
    text = offload_report.section(other, results)
    assert ("- cpu-node: host → GPU pinned not measured, GPU → host pinned not measured, host → GPU pageable not "
            "measured, disk read not measured (not measured: h2d_copy skipped: cpu-node: no NVIDIA driver on this "
            "node: cannot load libcuda.so.1; seq_read_direct failed: fio ended with error 5)") in text
    assert "| cpu-node | native_cpu | cpu → gpu | 3.0 |  | no pinned host → GPU copy rate (skipped:" in text
