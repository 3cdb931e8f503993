"""Tests for runner.parse.fio: real fio 3.33 JSON (tests/fixtures/fio) → rows and totals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.errors import ParseError
from runner.parse.fio import FIO_COLUMNS, parse_fio_json, parse_fio_text, summarize

FIO = Path(__file__).resolve().parents[2] / "fixtures" / "fio"


def test_direct_sequential_read_from_the_role_job_file() -> None:
    (row,) = parse_fio_json(FIO / "seq_read_direct.json")
    assert list(row) == list(FIO_COLUMNS)
    assert row["job"] == "seq_read_direct" and row["direction"] == "read"
    # Options come from the job file's [global] section, typed where fio means a number.
    assert (row["rw"], row["bs"], row["iodepth"], row["numjobs"], row["direct"], row["ioengine"], row["size"]) == (
        "read", "1M", 8, 2, 1, "libaio", "64M")
    assert row["bw_bytes"] == 1347722433 and row["iops"] == pytest.approx(1285.288)
    assert row["io_bytes"] == 2711617536 and row["runtime_ms"] == 2012
    # Nanoseconds in the JSON, microseconds in the row.
    assert row["clat_p50_us"] == pytest.approx(6586.368)
    assert row["clat_p99_us"] == pytest.approx(58982.4)
    assert row["clat_p99_9_us"] == pytest.approx(62652.416)
    assert row["lat_mean_us"] == pytest.approx(12407.195)
    assert row["error"] == 0 and row["fio_version"] == "fio-3.33"


def test_buffered_read_is_one_cold_pass() -> None:
    (row,) = parse_fio_json(FIO / "buffered_read.json")
    assert row["direct"] == 0 and row["ioengine"] == "psync"
    # Not time based: each of the 2 jobs read its 64 MiB file exactly once.
    assert row["io_bytes"] == 2 * 64 * 2**20


def test_clones_without_group_reporting_add_up() -> None:
    rows = parse_fio_json(FIO / "two_jobs_no_group_reporting.json")
    assert [r["bw_bytes"] for r in rows] == [600962529, 649615808]
    total = summarize(rows)
    assert total["bw_bytes"] == 600962529 + 649615808 and total["jobs"] == 2
    assert total["iops"] == pytest.approx(sum(r["iops"] for r in rows), abs=1e-3)
    assert min(r["clat_p99_us"] for r in rows) <= total["clat_p99_us"] <= max(r["clat_p99_us"] for r in rows)


def test_job_options_override_global_options_and_each_direction_is_a_row() -> None:
    rows = parse_fio_json(FIO / "randrw_job_options.json")
    assert [(r["direction"], r["rw"], r["bs"], r["iodepth"]) for r in rows] == [
        ("read", "randrw", "4k", 16), ("write", "randrw", "4k", 16)]
    assert summarize(rows, "write")["bw_bytes"] == 186415056
    assert summarize(rows, "trim") == {}


def test_text_before_the_json_is_ignored() -> None:
    text = (FIO / "stdout_with_note.txt").read_text()
    assert text.startswith("note: both iodepth")
    (row,) = parse_fio_text(text)
    assert row["job"] == "sync_note" and row["bw_bytes"] > 0


def test_a_failed_job_is_a_row_with_its_error() -> None:
    (row,) = parse_fio_json(FIO / "job_error.json")
    assert row["error"] == 28 and row["direction"] is None and row["bw_bytes"] is None
    assert summarize([row]) == {}


def test_legacy_microsecond_latencies_and_kib_bandwidth() -> None:
    doc = {"fio version": "fio-2.2.10", "jobs": [{
        "jobname": "old", "error": 0, "job options": {"rw": "read", "bs": "1M"},
        "read": {"io_kbytes": 1024, "bw": 2048, "iops": 2.0, "runtime": 500,
                 "clat": {"mean": 10.5, "percentile": {"50.000000": 9, "99.000000": 20}},
                 "lat": {"mean": 11.0}},
    }]}
    (row,) = parse_fio_text(json.dumps(doc))
    assert row["io_bytes"] == 1024 * 1024 and row["bw_bytes"] == 2048 * 1024
    assert (row["clat_p50_us"], row["clat_p99_us"], row["clat_p99_9_us"]) == (9.0, 20.0, None)
    assert row["lat_mean_us"] == 11.0 and row["clat_mean_us"] == 10.5


@pytest.mark.parametrize(("text", "reason"), [
    ("", "no JSON object found"),
    ("fio: failed to open job file\n", "no JSON object found"),
    ('{"fio version": "fio-3.33", "jobs": [', "invalid JSON at line 1"),
    ('{"hello": "world"}', "no 'jobs' list"),
    ('{"jobs": []}', "no 'jobs' list"),
    ('{"jobs": [{"error": 0}]}', "jobs[0]: not a fio job entry"),
    ('{"jobs": [{"jobname": "x", "error": 0, "read": {"io_bytes": 0}}]}', "no job moved any data"),
    ('{"jobs": [{"jobname": "x", "read": {"io_bytes": 5, "bw_bytes": "fast", "iops": 1}}]}',
     "jobs[0].read.bw_bytes: expected a number"),
    ("[1, 2]", "no JSON object found"),
])
def test_bad_input_is_a_parse_error_naming_the_problem(text: str, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_fio_text(text, "x.json")
    assert info.value.path == "x.json" and reason in info.value.reason


def test_truncated_real_output_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text((FIO / "seq_read_direct.json").read_text()[:1500])
    with pytest.raises(ParseError, match=r"cut\.json: invalid JSON"):
        parse_fio_json(path)


def test_missing_file_is_a_parse_error(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="cannot read"):
        parse_fio_json(tmp_path / "absent.json")
