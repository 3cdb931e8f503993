"""A restore's physical limit: which read rate applies to where the image was read, which GPU bytes
cross to the GPU, and which rates the node measured (a fio read on tmpfs is RAM's rate, not the disk's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.experiments.limits import host_limits
from runner.experiments.snapshot_limits import restore_limit

GIB = 2**30


def _trial(root: Path, trial_id: str, **record: Any) -> None:
    folder = root / "trials" / trial_id
    folder.mkdir(parents=True)
    (folder / "trial.json").write_text(json.dumps({"id": trial_id, "host": "h200", "kind": "storage",
                                                   "status": "ok", **record}))


def test_a_fio_read_on_tmpfs_is_rams_rate_never_the_disks(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _trial(root, "disk.buffered_read.r1@h200", mode="buffered_read", params={"target": "/data/fio"},
           metrics={"gb_s": 1.75})
    # The host's facts say /mnt/ram is tmpfs; /dev/shm is RAM by its path where no facts came with the record.
    _trial(root, "ram.buffered_read.r1@h200", mode="buffered_read", params={"target": "/mnt/ram/fio"},
           metrics={"gb_s": 9.0}, host_facts={"mounts": [{"mountpoint": "/", "fstype": "ext4"},
                                                         {"mountpoint": "/mnt/ram", "fstype": "tmpfs"}]})
    _trial(root, "shm.seq_read_direct.r1@h200", mode="seq_read_direct", params={"target": "/dev/shm/fio"},
           metrics={"gb_s": 12.0})
    limits = host_limits(root, "h200")
    assert limits is not None
    disk, ram = limits.disk_read(), limits.ram_read()
    assert disk is not None and (disk.gb_s, disk.source) == (1.75, "fio buffered_read /data/fio")
    assert ram is not None and (ram.gb_s, ram.source) == (9.0, "fio buffered_read /mnt/ram/fio")
    assert set(limits.ram_reads) == {"buffered_read", "seq_read_direct"} and set(limits.disk_reads) == {"buffered_read"}


def test_the_limit_reads_the_image_where_the_restore_read_it() -> None:
    # The H200 restore: a 5.8 GB image of a sleeping 0.8B engine, 1.3 GiB left on the GPU and
    # 1.65 GiB of weights the wake copies back.
    metrics = {"image_gib": 5.402, "gpu_gib": 1.3, "sleep_host_gib": 1.65, "quiesce": "sleep",
               "gpu_mem_mib_awake": 128900, "image_source": "disk", "restore_cache": "dropped"}
    rates = {"disk_read_gb_s": 1.75, "tmpfs_read_gb_s": 10.0, "h2d_gb_s": 55.0}
    disk = restore_limit(metrics, rates, None)
    assert disk == {"limit_read_gb_s": 1.75, "limit_read_from": "mode parameter", "limit_gpu_gib": 2.95,
                    "limit_h2d_gb_s": 55.0, "limit_h2d_from": "mode parameter",
                    "limit_s": round(5.402 * GIB / 1e9 / 1.75 + 2.95 * GIB / 1e9 / 55.0, 3)}
    assert restore_limit({**metrics, "image_source": "tmpfs"}, rates, None)["limit_read_gb_s"] == 10.0
    assert restore_limit({**metrics, "restore_cache": "warm"}, rates, None)["limit_read_gb_s"] == 10.0  # page cache
    # Level 2 keeps no weights in host memory: only what the GPU held at the dump crosses back.
    assert restore_limit({**metrics, "quiesce": "sleep2"}, rates, None)["limit_gpu_gib"] == 1.3
    # An engine without GPU memory (the stand-in) backs its weights up in host memory and copies nothing back.
    standin = {k: v for k, v in metrics.items() if k not in ("gpu_gib", "gpu_mem_mib_awake")}
    assert restore_limit(standin, {"disk_read_gb_s": 1.75}, None)["limit_gpu_gib"] == 0.0


def test_a_rate_nothing_measured_leaves_the_limit_empty_and_no_gpu_needs_no_copy_rate() -> None:
    standin = {"image_gib": 0.05, "image_source": "disk", "restore_cache": "dropped"}
    assert "limit_s" not in restore_limit(standin, {}, None)
    assert restore_limit(standin, {"disk_read_gb_s": 0.5}, None)["limit_s"] == round(0.05 * GIB / 1e9 / 0.5, 3)
    assert "limit_s" not in restore_limit({**standin, "gpu_gib": 2.0}, {"disk_read_gb_s": 0.5}, None)
    assert restore_limit({}, {"disk_read_gb_s": 0.5}, None) == {}  # no image: nothing to bound


def test_a_ram_read_trial_gives_a_tmpfs_restore_its_limit_without_fio(tmp_path: Path) -> None:
    # The borrowed H200 has no fio: its fio read of /dev/shm is skipped, and ram_read measures RAM instead.
    root = tmp_path / "results"
    _trial(root, "limits.h2d_copy.r1@h200", mode="h2d_copy", params={"gpu": 0},
           metrics={"gpu": 0, "gpu_name": "NVIDIA H200", "pci_bus_id": "0000:00:06.0", "h2d_pinned_gb_s": 55.485})
    _trial(root, "limits_tmpfs.buffered_read.r1@h200", mode="buffered_read", status="skipped",
           reason="fio is not installed on h200", params={"target": "/dev/shm/gpu-campaign-fio"})
    for name, threads, rate in (("limits_ram", 4, 11.0), ("limits_ram_1thread", 1, 6.0)):
        _trial(root, f"{name}.ram_read.r1@h200", mode="ram_read", params={"target": "/dev/shm/gpu-campaign-ram-read"},
               metrics={"gb_s": rate, "threads": threads, "fs_type": "tmpfs",
                        "target": "/dev/shm/gpu-campaign-ram-read"})
    limits = host_limits(root, "h200")
    assert limits is not None
    # The most parallel read is RAM's limit; the 1-thread trial stands beside it in storage.csv only.
    ram = limits.ram_read()
    assert ram is not None and (ram.gb_s, ram.trials) == (11.0, 1)
    assert ram.source == "ram_read /dev/shm/gpu-campaign-ram-read (tmpfs), 4 threads"
    assert limits.disk_read() is None and "buffered_read" in limits.not_measured
    # The 0.8B engine's restore_tmpfs row of the H200 report (its limit was empty): now a figure.
    metrics = {"image_gib": 5.309, "gpu_gib": 1.72, "sleep_host_gib": 1.65, "quiesce": "sleep",
               "gpu_mem_mib_awake": 128900, "image_source": "tmpfs", "restore_cache": "dropped"}
    out = restore_limit(metrics, {}, limits)
    assert out["limit_read_gb_s"] == 11.0
    assert out["limit_read_from"] == "storage: ram_read /dev/shm/gpu-campaign-ram-read (tmpfs), 4 threads"
    assert out["limit_s"] == round(5.309 * GIB / 1e9 / 11.0 + 3.37 * GIB / 1e9 / 55.485, 3)
    # A warm restore reads the page cache: RAM's rate too; the image on disk with the cache dropped does not.
    assert restore_limit({**metrics, "image_source": "disk", "restore_cache": "warm"}, {}, limits)[
        "limit_read_gb_s"] == 11.0
    assert "limit_s" not in restore_limit({**metrics, "image_source": "disk"}, {}, limits)
    # The mode's own tmpfs_read_gb_s still wins.
    assert restore_limit(metrics, {"tmpfs_read_gb_s": 9.0}, limits)["limit_read_from"] == "mode parameter"


def test_ram_read_comes_before_a_fio_read_on_tmpfs_and_either_fills_the_gap(tmp_path: Path) -> None:
    root = tmp_path / "results"
    _trial(root, "shm.buffered_read.r1@h200", mode="buffered_read", params={"target": "/dev/shm/fio"},
           metrics={"gb_s": 8.0})
    limits = host_limits(root, "h200")
    assert limits is not None and limits.ram_read() is not None and limits.ram_read().source == (
        "fio buffered_read /dev/shm/fio")
    _trial(root, "ram.ram_read.r1@h200", mode="ram_read", params={"target": "/dev/shm/x"},
           metrics={"gb_s": 10.0, "threads": 1, "fs_type": "tmpfs", "target": "/dev/shm/x"})
    _trial(root, "ram.ram_read.r2@h200", mode="ram_read", params={"target": "/dev/shm/x"},
           metrics={"gb_s": 12.0, "threads": 1, "fs_type": "tmpfs", "target": "/dev/shm/x"})
    limits = host_limits(root, "h200")
    assert limits is not None
    assert limits.ram_read() is not None and (limits.ram_read().gb_s, limits.ram_read().trials) == (11.0, 2)
    assert limits.ram_read().source == "ram_read /dev/shm/x (tmpfs), 1 thread"
    assert set(limits.ram_reads) == {"ram_read", "buffered_read"}
    # A failed ram_read leaves no rate, and says why while nothing else measured RAM.
    other = tmp_path / "other"
    _trial(other, "ram.ram_read.r1@h200", mode="ram_read", status="failed", reason="ram_read: --size-mib 4096: ...",
           params={})
    limits = host_limits(other, "h200")
    assert limits is not None and limits.ram_read() is None
    assert limits.not_measured == {"ram_read": "failed: ram_read: --size-mib 4096: ..."}
