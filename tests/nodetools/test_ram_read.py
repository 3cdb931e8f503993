"""nodetools/ram_read.py for real: a small file written into a folder, read back by threads, timed,
removed; every bound refused before anything is written; a read of other bytes caught."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodetools import exitcodes, ram_read

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodetools.ram_read", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


def test_reads_the_file_back_with_threads_and_removes_it(tmp_path: Path) -> None:
    target, out = tmp_path / "ram" / "read", tmp_path / "ram_read.json"
    done = _run("--target", str(target), "--size-mib", "16", "--threads", "3", "--repeats", "4", "--out", str(out))
    assert done.returncode == exitcodes.OK, done.stderr
    record = json.loads(done.stdout)
    assert json.loads(out.read_text()) == record
    assert (record["target"], record["size_bytes"], record["threads"], record["repeats"]) == (
        str(target), 16 * 2**20, 3, 4)
    assert record["verified"] is True and record["block_bytes"] == 2**20
    assert len(record["seconds"]) == 4 and all(s > 0 for s in record["seconds"])
    assert record["gb_s"] == pytest.approx(16 * 2**20 / record["seconds_median"] / 1e9, rel=1e-2)
    assert record["gb_s_max"] >= record["gb_s"] > 0
    # The filesystem is named as /proc/self/mounts names the one holding the folder; written then read
    # back, the file was wholly in RAM (tmpfs) or the page cache.
    assert record["fs_type"] == ram_read.filesystem(tmp_path)[0] != "unknown"
    assert record["in_ram"] is (record["fs_type"] in ("tmpfs", "ramfs"))
    assert record["resident_fraction"] in (1.0, None)
    # The file is gone, and the folder the run created with it.
    assert not target.exists() and (tmp_path / "ram").is_dir()


def test_a_folder_that_was_there_stays_empty(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("theirs")
    record = ram_read.measure(tmp_path, size_mib=2, threads=1, repeats=1)
    assert record["threads"] == 1 and record["gb_s"] > 0
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(("args", "message"), [
    (["--size-mib", "0"], "--size-mib must be 1-65536, not 0"),
    (["--size-mib", "65537"], "--size-mib must be 1-65536, not 65537"),
    (["--threads", "0"], "--threads must be 1-64, not 0"),
    (["--threads", "65"], "--threads must be 1-64, not 65"),
    (["--repeats", "51"], "--repeats must be 1-50, not 51"),
    (["--size-mib", "2", "--threads", "4"], "--threads 4 needs at least 4 MiB (one 1 MiB block each), not 2"),
])
def test_bounds_are_refused_before_anything_is_written(tmp_path: Path, args: list[str], message: str) -> None:
    target = tmp_path / "t"
    done = _run("--target", str(target), *args)
    assert done.returncode == exitcodes.BAD_INPUT and done.stdout == ""
    assert message in done.stderr and done.stderr.startswith("ram_read: ")
    assert not target.exists()


def test_a_size_the_node_cannot_hold_and_a_target_that_is_no_folder_are_refused(tmp_path: Path) -> None:
    gib = 2**30
    assert ram_read.room_problem(4 * gib, 10 * gib, 16 * gib) == ""
    assert ram_read.room_problem(4 * gib, 10 * gib, None) == ""  # no MemAvailable: the free space alone
    assert ram_read.room_problem(4 * gib, 4 * gib, 64 * gib) == (
        "--size-mib 4096: the folder's filesystem has 4.0 GiB free, the file needs 4.0 GiB and 64 MiB to spare")
    assert ram_read.room_problem(4 * gib, 64 * gib, 6 * gib) == (
        "--size-mib 4096: the file must stay within 50% of the RAM available (6.0 GiB), so it is read from RAM "
        "and the node keeps room")
    # The kernel's own figure is what the run checks: a node with 2 MiB available refuses 2 MiB, writing nothing.
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683792 kB\nMemAvailable:       2048 kB\n")
    assert ram_read.available_ram(meminfo) == 2 * 2**20
    with pytest.raises(ram_read.BadInput, match="within 50% of the RAM available"):
        ram_read.measure(tmp_path / "t", size_mib=2, threads=1, repeats=1, meminfo=meminfo)
    assert not (tmp_path / "t").exists()

    (tmp_path / "file").write_text("x")
    done = _run("--target", str(tmp_path / "file"), "--size-mib", "1", "--threads", "1")
    assert done.returncode == exitcodes.BAD_INPUT
    assert done.stderr == f"ram_read: --target {tmp_path / 'file'}: not a folder\n"


def test_a_read_of_other_bytes_fails_the_run(tmp_path: Path) -> None:
    # Two blocks whose stamps are swapped: a read that returned the wrong block must not pass.
    path = tmp_path / "swapped.dat"
    blocks = [(offset.to_bytes(8, "little") + bytes(2**20 - 8)) for offset in (2**20, 0)]
    path.write_bytes(b"".join(blocks))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ram_read.ReadFailed, match="the block at byte 0 holds the stamp of another"):
            ram_read._read_slice(fd, 0, 2 * 2**20, bytearray(2**20), check=True)
        assert ram_read._read_slice(fd, 0, 2 * 2**20, bytearray(2**20), check=False) == 2 * 2**20
        # Past the end of the file a slice reads short: the pass counts it.
        assert ram_read._read_slice(fd, 2**20, 3 * 2**20, bytearray(2**20), check=False) == 2**20
    finally:
        os.close(fd)


def test_slices_cover_the_file_in_whole_blocks() -> None:
    assert ram_read._slices(10 * 2**20, 3) == [(0, 3 * 2**20), (3 * 2**20, 6 * 2**20), (6 * 2**20, 10 * 2**20)]
    assert ram_read._slices(2**20, 1) == [(0, 2**20)]


def test_sigterm_stops_the_run_and_removes_the_file(tmp_path: Path) -> None:
    target = tmp_path / "t"
    proc = subprocess.Popen([sys.executable, "-m", "nodetools.ram_read", "--target", str(target), "--size-mib",
                             "256", "--repeats", "50", "--threads", "1"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (target.is_dir() and any(target.iterdir())) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    if proc.returncode == exitcodes.OK:
        pytest.skip("the run ended before the signal came (a very fast machine)")
    assert proc.returncode == exitcodes.TIMEOUT and out == ""
    assert err == "ram_read: stopped by a signal; the file was removed\n"
    assert not target.exists()


def test_the_filesystem_is_the_longest_mount_holding_the_folder(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs rw 0 0\nnone /dev/shm\\040x tmpfs rw 0 0\n")
    assert ram_read.filesystem(tmp_path / ".", mounts) == ("tmpfs", str(tmp_path))
    assert ram_read.filesystem(Path("/"), mounts) == ("ext4", "/")
    assert ram_read.filesystem(Path("/"), tmp_path / "absent") == ("unknown", "/")
