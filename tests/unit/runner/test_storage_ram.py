"""The storage kind's ``ram_read`` mode: its bounded parameters, the node program's argv, the
collect's parser on the tool's real output (tests/fixtures/ram_read) and on what is not its output,
its row in storage.csv and its table in the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pydantic import ValidationError

from runner.errors import ParseError
from runner.experiments.base import TrialContext
from runner.experiments.storage import KIND, RamReadParams
from runner.experiments.storage_ram import ram_read_metrics

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "ram_read" / "dev_shm_256m_2_threads.json"


def test_parameters_are_bounded_and_a_thread_needs_a_block() -> None:
    params = RamReadParams()
    assert (params.target, params.size_mib, params.threads, params.repeats) == (
        "/dev/shm/gpu-campaign-ram-read", 4096, 4, 5)
    for bad in ({"size_mib": 0}, {"size_mib": 65537}, {"threads": 0}, {"threads": 65}, {"repeats": 51},
                {"target": "shm/relative"}, {"target": "/" + "x" * 1024}, {"block_kib": 4}):
        with pytest.raises(ValidationError):
            RamReadParams(**bad)
    with pytest.raises(ValidationError, match="threads 8 need at least 8 MiB"):
        RamReadParams(size_mib=4, threads=8)
    assert KIND.modes["ram_read"] is RamReadParams


def test_the_node_runs_the_reader_with_the_planned_values_and_the_trial_holds_the_ram() -> None:
    params = RamReadParams(size_mib=2048, threads=8, repeats=3).model_dump()
    ctx = TrialContext("ram_read", params, {}, host="h200", trial_id="limits_ram.ram_read.r1@h200",
                       remote_dir="/w/t", node_python="/usr/bin/python3")
    plan = KIND.node_plan(ctx)
    assert plan.commands["ram_read"] == [
        "/usr/bin/python3", "-m", "nodetools.ram_read", "--target", "/dev/shm/gpu-campaign-ram-read",
        "--size-mib", "2048", "--threads", "8", "--repeats", "3", "--out", "/w/t/ram_read.json"]
    assert "reap" in plan.commands and "h2d_copy" not in plan.commands
    res = KIND.resources(ctx)
    assert (res.gpus, res.exclusive, res.host_ram_gib) == ((), True, 2.0)


def _raw(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "trial" / "raw" / "h200" / "ram_read.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_the_tools_output_gives_the_rate_and_what_was_read(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, _raw(tmp_path, ""))
    metrics = KIND.collect(TrialContext("ram_read", RamReadParams().model_dump(), {}, tmp_path / "trial", "h200"))
    assert metrics == {"gb_s": 2.577, "gb_s_max": 2.691, "seconds_median": 0.10415, "size_bytes": 256 * 2**20,
                       "threads": 2, "fs_type": "tmpfs", "target": "/dev/shm/gpu-campaign-ram-read", "in_ram": True,
                       "resident_fraction": 1.0}


def _good() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize(("content", "reason"), [
    (FIXTURE.read_text()[:200], "not JSON (truncated?)"),
    ("", "not JSON (truncated?)"),
    (json.dumps([_good()]), "not ram_read's output (no 'tool': 'nodetools.ram_read')"),
    (json.dumps({**_good(), "tool": "nodetools.h2d_copy"}), "not ram_read's output"),
    (json.dumps({**_good(), "verified": False}), "the bytes read back were not verified"),
    (json.dumps({k: v for k, v in _good().items() if k != "gb_s"}), "no positive number for gb_s"),
    (json.dumps({**_good(), "gb_s": "fast", "seconds_median": 0}), "no positive number for gb_s, seconds_median"),
    (json.dumps({**_good(), "gb_s_max": True}), "no positive number for gb_s_max"),
    (json.dumps({**_good(), "gb_s": 1e9, "gb_s_max": 1e9}), "a rate above 10000 GB/s"),
    (json.dumps({**_good(), "size_bytes": -1}), "size_bytes -1 is not 1 byte to 65536 MiB"),
    (json.dumps({**_good(), "threads": 0}), "threads 0 is not 1-64"),
    (json.dumps({**_good(), "threads": "4"}), "threads '4' is not 1-64"),
    (json.dumps({**_good(), "fs_type": ["tmpfs"]}), "fs_type and target must be short strings"),
    (json.dumps({**_good(), "target": "x" * 5000}), "fs_type and target must be short strings"),
])
def test_what_is_not_the_tools_output_fails_with_the_reason(tmp_path: Path, content: str, reason: str) -> None:
    path = _raw(tmp_path, content)
    with pytest.raises(ParseError) as caught:
        ram_read_metrics(path)
    assert caught.value.path == str(path) and reason in caught.value.reason


def test_a_huge_or_missing_file_is_refused_unread(tmp_path: Path) -> None:
    path = _raw(tmp_path, b" " * (1 << 20) + FIXTURE.read_bytes())
    with pytest.raises(ParseError, match="larger than 1048576 bytes: not ram_read's output"):
        ram_read_metrics(path)
    with pytest.raises(ParseError, match="cannot read it: No such file or directory"):
        ram_read_metrics(tmp_path / "absent.json")


def _record(status: str, repeat: int, metrics: dict[str, Any] | None = None, reason: str = "") -> dict[str, Any]:
    params = RamReadParams(size_mib=256, threads=2, repeats=3).model_dump()
    return {"id": f"limits_ram.ram_read.r{repeat}@h200", "host": "h200", "mode": "ram_read", "repeat": repeat,
            "status": status, "reason": reason, "params": params, "metrics": metrics or {}}


def _frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The frame runner.report hands a kind's section: the front columns, then the kind's rows."""
    rows = []
    for r in records:
        front = {k: r[k] for k in ("host", "mode", "repeat", "status", "reason")}
        rows.extend({"trial_id": r["id"], **front, **row} for row in KIND.report.rows(r))
    return pd.DataFrame(rows).convert_dtypes()


def test_a_row_in_storage_csv_and_a_table_in_the_report(tmp_path: Path) -> None:
    metrics = ram_read_metrics(shutil.copy(FIXTURE, tmp_path / "r.json"))
    ok = _record("ok", 1, metrics)
    [row] = KIND.report.rows(ok)
    assert {k: row[k] for k in ("target", "fs_type", "direction", "memory", "size", "bs", "iodepth", "numjobs",
                                "passes", "gb_s", "gb_s_max", "seconds_median", "io_bytes", "bw_bytes")} == {
        "target": "/dev/shm/gpu-campaign-ram-read", "fs_type": "tmpfs", "direction": "read", "memory": "ram",
        "size": "256M", "bs": "1M", "iodepth": 1, "numjobs": 2, "passes": 3, "gb_s": 2.577, "gb_s_max": 2.691,
        "seconds_median": 0.10415, "io_bytes": 256 * 2**20, "bw_bytes": round(256 * 2**20 / 0.10415)}
    # The fio and copy columns stay: one storage.csv for every mode.
    assert {"iops", "clat_p99_us", "fio_version", "gpu_name", "copy_repeats"} <= set(row)
    # On a disk's filesystem the file read back is the page cache's.
    [cached] = KIND.report.rows(_record("ok", 2, {**metrics, "fs_type": "ext4", "in_ram": False, "gb_s": 3.0}))
    assert cached["memory"] == "page_cache"
    [failed] = KIND.report.rows(_record("failed", 3, reason="ram_read: --size-mib 256: ..."))
    assert (failed["gb_s"], failed["numjobs"], failed["direction"], failed["memory"]) == (None, 2, "read", None)

    text = KIND.report.section(_frame([ok, _record("ok", 2, {**metrics, "gb_s": 3.0, "gb_s_max": 3.5}),
                                       _record("failed", 3, reason="no room")]), tmp_path)
    assert text.startswith("\n## Storage: RAM reads\n") and "### RAM reads (`ram_read`)" in text
    assert "| h200 | /dev/shm/gpu-campaign-ram-read (tmpfs) | ram | 256M | 2 | 2 x 3 | 2.79 | 3.50 |" in text
    assert "- h200 ram_read r3: failed: no room" in text and "13.5 GB/s" not in text  # no fio: no fio reference
    none_ok = KIND.report.section(_frame([_record("failed", 3, reason="no room")]), tmp_path)
    assert "_no ram_read trial finished ok_" in none_ok
