"""The ``storage`` kind end to end on the local inventory: real fio, the fio role's ``run`` entry
point through ansible-runner, the JSON fetched and parsed into ``storage.csv``; the ``ram_read``
mode of campaigns/storage-local.yaml (no fio: a file in /dev/shm read back by threads); and the
``h2d_copy`` mode, skipped with its reason on this machine without a GPU, and run over the FAKE
libcuda of tests/nodetools/fake_libcuda.c.

fio must be installed on this machine (``apt-get install fio``; scripts/test-roles.sh installs
it). Without it the trials are skipped by design, and the test checks that instead.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodetools import h2d_copy
from runner.cli import main
from runner.experiments import KINDS, storage
from runner.experiments.limits import node_limits
from tests.nodetools.fake_cuda import compile_fake

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _storage_kind_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Until runner/experiments/__init__.py lists the kind; harmless once it does.
    monkeypatch.setitem(KINDS, "storage", storage.KIND)
    yield


def _campaign(tmp_path: Path, target: Path) -> str:
    return f"""\
name: storage-local
inventory: inventory
remote_dir: {tmp_path / "remote"}
experiments:
  - kind: storage
    modes:
      seq_read_direct: {{target: {target}, size: 16M, numjobs: 2, iodepth: 4, runtime_s: 2}}
      buffered_read: {{target: {target}, size: 16M, numjobs: 1, runtime_s: 2, keep_files: false}}
    timeout_s: 120
"""


def _read_csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as fh:
        return {row["mode"]: row for row in csv.DictReader(fh)}


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio (apt-get install fio)")
def test_storage_trials_measure_parse_and_report(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    target = tmp_path / "data" / "fio"
    results = tmp_path / "results"
    assert main([str(write_campaign(_campaign(tmp_path, target))), "--quiet", "--results", str(results)]) == 0

    summary = _read_csv(results / "summary.csv")
    assert {m: r["status"] for m, r in summary.items()} == {"seq_read_direct": "ok", "buffered_read": "ok"}
    rows = _read_csv(results / "storage.csv")
    direct, buffered = rows["seq_read_direct"], rows["buffered_read"]
    assert float(direct["bw_bytes"]) > 0 and float(direct["iops"]) > 0 and float(direct["clat_p99_us"]) > 0
    assert float(direct["gb_s"]) == pytest.approx(float(direct["bw_bytes"]) / 1e9, abs=1e-3)
    assert (direct["size"], direct["numjobs"], direct["iodepth"], direct["target"]) == ("16M", "2", "4", str(target))
    assert buffered["iodepth"] == "1"
    # The buffered job reads its 16 MiB file exactly once, however fast the disk is.
    assert int(buffered["io_bytes"]) == 16 * 2**20

    raw = results / "trials" / "storage.seq_read_direct.r1@localhost" / "raw" / "localhost"
    job = (raw / "seq_read_direct.fio").read_text()
    assert f"directory={target}" in job and "direct=1" in job and "iodepth=4" in job and "time_based=1" in job
    fio_json = json.loads((raw / "fio-seq_read_direct.json").read_text())
    assert fio_json["jobs"][0]["read"]["bw_bytes"] == int(direct["bw_bytes"])
    # keep_files: the direct job's files stay for the next repeat, the buffered job's are removed.
    assert sorted(p.name for p in target.iterdir()) == ["seq_read_direct.0.0", "seq_read_direct.1.0"]

    trial = json.loads((results / "trials" / "storage.buffered_read.r1@localhost" / "trial.json").read_text())
    assert trial["resources"]["exclusive"] is True and trial["metrics"]["fio_version"].startswith("fio-")
    report = (results / "report.md").read_text()
    assert "## Storage (fio)" in report and "13.5 GB/s" in report and "| localhost | seq_read_direct |" in report


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio (apt-get install fio)")
def test_a_device_that_holds_data_is_refused(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    # The root filesystem's device carries a filesystem signature: fio must never run on it.
    source = next((line.split()[0] for line in Path("/proc/self/mounts").read_text().splitlines()
                   if line.split()[1] == "/" and line.startswith("/dev/")), None)
    if source is None or not Path(source).is_block_device():
        pytest.skip("the root filesystem is not on a block device here")
    path = write_campaign(f"""\
name: storage-refuse
inventory: inventory
remote_dir: {tmp_path / "remote"}
experiments:
  - kind: storage
    modes:
      seq_read_direct: {{target: {source}, size: 16M, numjobs: 1, runtime_s: 1}}
""")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    row = _read_csv(results / "summary.csv")["seq_read_direct"]
    assert row["status"] == "failed"
    assert f"Refusing to run fio on {source}: it holds data" in row["reason"]
    raw = results / "trials" / "storage.seq_read_direct.r1@localhost" / "raw"
    assert not any(p.is_file() for p in raw.rglob("*"))  # the runner made the folder; nothing ran to fill it


@pytest.mark.skipif(shutil.which("fio") is not None, reason="fio is installed: the real test above runs")
def test_without_fio_the_trials_are_skipped_with_the_reason(write_campaign: Callable[[str], Path],
                                                           tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert main([str(write_campaign(_campaign(tmp_path, tmp_path / "data"))), "--quiet",
                 "--results", str(results)]) == 0
    summary = _read_csv(results / "summary.csv")
    assert {r["status"] for r in summary.values()} == {"skipped"}
    assert all(r["reason"].startswith("fio is not installed on localhost") for r in summary.values())


def _h2d_campaign(tmp_path: Path) -> str:
    return f"""\
name: storage-h2d
inventory: inventory
remote_dir: {tmp_path / "remote"}
experiments:
  - kind: storage
    modes:
      h2d_copy: {{size_mib: 8, repeats: 3, gpu: 0}}
    repeats: 2
    timeout_s: 120
"""


@pytest.mark.skipif(h2d_copy.probe()["usable"], reason="this machine has an NVIDIA GPU: the skip path cannot run")
def test_h2d_copy_without_a_gpu_is_a_skipped_row_with_the_reason(write_campaign: Callable[[str], Path],
                                                                 tmp_path: Path) -> None:
    results = tmp_path / "results"
    assert main([str(write_campaign(_h2d_campaign(tmp_path))), "--quiet", "--results", str(results)]) == 3
    summary = list(csv.DictReader((results / "summary.csv").open()))
    assert [r["status"] for r in summary] == ["skipped", "skipped"]
    why = h2d_copy.probe()["why"]
    assert all(r["reason"] == f"localhost: {why}" for r in summary) and why.startswith("no NVIDIA")
    rows = list(csv.DictReader((results / "storage.csv").open()))
    assert [(r["status"], r["gb_s"], r["direction"]) for r in rows] == [("skipped", "", ""), ("skipped", "", "")]
    report = (results / "report.md").read_text()
    assert "_no h2d_copy trial finished ok_" in report
    assert f"- localhost h2d_copy r1: skipped: localhost: {why}" in report


def test_h2d_copy_over_the_fake_driver_measures_parses_and_reports(write_campaign: Callable[[str], Path],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The FAKE libcuda (tests/nodetools/fake_libcuda.c): its "GPU memory" is host memory, so this
    # proves the path (probe, copies, fetch, parse, rows, report), not a rate.
    monkeypatch.setenv("H2D_COPY_LIBCUDA", str(compile_fake(tmp_path, "fake_libcuda.so")))
    results = tmp_path / "results"
    assert main([str(write_campaign(_h2d_campaign(tmp_path))), "--quiet", "--results", str(results)]) == 0

    rows = list(csv.DictReader((results / "storage.csv").open()))
    assert [(r["repeat"], r["direction"], r["memory"]) for r in rows] == [
        (rep, d, m) for rep in ("1", "2") for m in ("pinned", "pageable") for d in ("h2d", "d2h")]
    for row in rows:
        assert row["status"] == "ok" and float(row["gb_s"]) > 0 and float(row["gb_s_max"]) >= float(row["gb_s"])
        assert (row["size"], row["copy_repeats"], row["gpu"], row["pci_bus_id"]) == ("8M", "3", "0", "0000:F0:00.0")
        assert row["gpu_name"] == "FAKE GPU 0 (tests/nodetools/fake_libcuda.c)"
        assert float(row["bw_bytes"]) == pytest.approx(8 * 2**20 / float(row["seconds_median"]), rel=1e-3)
    trial = results / "trials" / "storage.h2d_copy.r1@localhost"
    raw = json.loads((trial / "raw" / "localhost" / "h2d_copy.json").read_text())
    assert raw["verified"] is True and raw["size_bytes"] == 8 * 2**20 and len(raw["copies"]) == 4
    record = json.loads((trial / "trial.json").read_text())
    assert record["resources"]["gpus"] == [0] and record["resources"]["exclusive"] is True
    assert record["metrics"]["h2d_pinned_gb_s"] == raw["copies"][0]["gb_s"]

    report = (results / "report.md").read_text()
    assert "## Storage (fio) and host-GPU copies" in report and "### Host-GPU copies (`h2d_copy`)" in report
    assert "| localhost | 0: FAKE GPU 0 (tests/nodetools/fake_libcuda.c) (0000:F0:00.0) | h2d (host → GPU) | pinned |" \
        in report
    # What other kinds' reports compare against: the median of the two trials' pinned H2D rates.
    limits = node_limits(results)["localhost"]
    pinned = sorted(float(r["gb_s"]) for r in rows if (r["direction"], r["memory"]) == ("h2d", "pinned"))
    assert limits.copy("h2d", "pinned") is not None
    assert limits.copy("h2d", "pinned").gb_s == pytest.approx(sum(pinned) / 2, abs=1e-3)


def test_ram_read_of_the_local_rehearsal_measures_ram_with_no_fio(tmp_path: Path) -> None:
    # campaigns/storage-local.yaml itself, its ram_read trial alone, its node folder under tmp_path.
    results = tmp_path / "results"
    assert main([str(REPO / "campaigns" / "storage-local.yaml"), "--quiet", "--results", str(results),
                 "--only", "storage.ram_read", "-e", f"remote_dir={tmp_path / 'remote'}"]) == 0
    [row] = list(csv.DictReader((results / "storage.csv").open()))
    assert (row["mode"], row["status"], row["direction"], row["memory"], row["fs_type"]) == (
        "ram_read", "ok", "read", "ram", "tmpfs")
    assert float(row["gb_s"]) > 0 and float(row["gb_s_max"]) >= float(row["gb_s"])
    assert (row["target"], row["size"], row["numjobs"], row["passes"]) == ("/dev/shm/gpu-campaign-ram-read", "64M",
                                                                         "2", "3")
    trial = results / "trials" / "storage.ram_read.r1@localhost"
    raw = json.loads((trial / "raw" / "localhost" / "ram_read.json").read_text())
    assert raw["verified"] is True and raw["size_bytes"] == 64 * 2**20 and len(raw["seconds"]) == 3
    report = (results / "report.md").read_text()
    assert "### RAM reads (`ram_read`)" in report and "| localhost | /dev/shm/gpu-campaign-ram-read (tmpfs) | ram |" \
        in report
    # What a snapshot trial's limit reads for an image in RAM.
    ram = node_limits(results)["localhost"].ram_read()
    assert ram is not None and ram.gb_s == float(row["gb_s"])
    assert ram.source == "ram_read /dev/shm/gpu-campaign-ram-read (tmpfs), 2 threads"
