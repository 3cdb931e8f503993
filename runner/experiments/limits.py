"""What a node can move, as its ``storage`` trials measured it: for kinds that compare their rates.

An offload tier's GB/s means little alone: against the node's pinned host-to-GPU copy rate
(``h2d_copy``) it says how close the tier came to the PCIe link, against its disk read rate (fio's
``buffered_read`` or ``seq_read_direct``) how close a file-system tier came to the disk. A CRIU
restore's seconds compare with ``image bytes / read rate + GPU bytes / host-to-GPU rate``, the read
rate the disk's or, for images in RAM (staged in tmpfs, or in the page cache), RAM's (``ram_read``):
the ``ram_read`` mode's (a file in RAM read back by threads, no fio needed; the most threads measured,
as the most parallel read is the limit), else a fio read whose target is on tmpfs (the filesystem
from the host's facts in the trial record, else a target under /dev/shm).

``node_limits(root)`` reads the trial records (``trials/<id>/trial.json``) of one results folder
directly, so a kind's report section can call it without the results store (a layer above the
kinds): the ok ``storage`` trials give the rates (medians over the trials), the others why a rate
is missing. A rate nothing measured is ``None``, never 0.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DISK_READ_MODES", "RAM_READ_MODES", "NodeLimits", "Rate", "host_limits", "node_limits", "transfer_limit"]

DISK_READ_MODES = ("buffered_read", "seq_read_direct")  # through the page cache first: what a file read sees
_RAM_MODE = "ram_read"
RAM_READ_MODES = (_RAM_MODE, *DISK_READ_MODES)  # the RAM reader first: made for it, its threads named
_COPY_MODE = "h2d_copy"
_MAX_RECORD_BYTES = 16 << 20
_GPU, _HOST, _DISK = "gpu", "host", "disk"
# How engines and connectors name the places KV blocks move between (vLLM's transfer types are
# GPU_to_CPU, CPU_to_GPU, ...; a file-system tier's side is its medium).
_TIER_WORDS = {"gpu": _GPU, "cuda": _GPU, "hbm": _GPU, "device": _GPU,
               "cpu": _HOST, "host": _HOST, "ram": _HOST, "shm": _HOST, "memory": _HOST,
               "fs": _DISK, "disk": _DISK, "file": _DISK, "files": _DISK, "nvme": _DISK, "ssd": _DISK,
               "local_disk": _DISK, "storage": _DISK}


@dataclass(frozen=True)
class Rate:
    """A measured rate (decimal GB/s, the median over ``trials`` ok trials) and where it came from."""

    gb_s: float
    source: str  # e.g. "h2d_copy h2d pinned, GPU 0 NVIDIA H200 (0000:19:00.0)" or "fio buffered_read /mnt/data/fio"
    #              or "ram_read /dev/shm/gpu-campaign-ram-read (tmpfs), 4 threads"
    trials: int


@dataclass(frozen=True)
class NodeLimits:
    """One host's measured limits; ``not_measured`` maps a storage mode to why it gave no rate."""

    host: str
    copies: Mapping[tuple[str, str], Rate] = field(default_factory=dict)  # (h2d|d2h, pinned|pageable) -> rate
    disk_reads: Mapping[str, Rate] = field(default_factory=dict)  # fio mode -> rate (targets on a disk)
    not_measured: Mapping[str, str] = field(default_factory=dict)
    ram_reads: Mapping[str, Rate] = field(default_factory=dict)  # ram_read, or fio mode on tmpfs -> rate

    def copy(self, direction: str = "h2d", memory: str = "pinned") -> Rate | None:
        return self.copies.get((direction, memory))

    def disk_read(self, prefer: tuple[str, ...] = DISK_READ_MODES) -> Rate | None:
        return next((self.disk_reads[m] for m in prefer if m in self.disk_reads), None)

    def ram_read(self, prefer: tuple[str, ...] = RAM_READ_MODES) -> Rate | None:
        """A read of a file in RAM (``ram_read``, else fio on tmpfs): what reading an image staged there,
        or in the page cache, can reach."""
        return next((self.ram_reads[m] for m in prefer if m in self.ram_reads), None)


def _records(root: Path) -> Iterator[dict[str, Any]]:
    trials = root / "trials"
    if not trials.is_dir():
        return
    for path in sorted(trials.glob("*/trial.json")):
        try:
            if path.stat().st_size > _MAX_RECORD_BYTES:
                continue
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a half-written or foreign file: the report's own reading says so
        if isinstance(record, dict) and record.get("kind") == "storage":
            yield record


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def _on_ram(target: str, facts: Any) -> bool:
    """Whether fio's ``target`` lies on tmpfs: the longest mount of the host's facts holding it, else /dev/shm."""
    mounts = [m for m in (facts or {}).get("mounts") or [] if isinstance(m, dict) and m.get("mountpoint")]
    inside = [m for m in mounts if target == m["mountpoint"] or target.startswith(m["mountpoint"].rstrip("/") + "/")]
    if inside:
        return str(max(inside, key=lambda m: len(m["mountpoint"])).get("fstype")) in ("tmpfs", "ramfs")
    return target == "/dev/shm" or target.startswith("/dev/shm/")


def _rates(samples: dict[Any, list[tuple[float, str]]]) -> dict[Any, Rate]:
    return {key: Rate(round(statistics.median(v for v, _ in values), 3), values[0][1], len(values))
            for key, values in samples.items()}


def node_limits(root: Path) -> dict[str, NodeLimits]:
    """Every host's limits measured by the ``storage`` trials of the results folder ``root``."""
    copies: dict[str, dict[tuple[str, str], list[tuple[float, str]]]] = {}
    reads: dict[str, dict[str, list[tuple[float, str]]]] = {}
    ram: dict[str, dict[str, list[tuple[float, str]]]] = {}
    missing: dict[str, dict[str, str]] = {}
    ram_by_threads: dict[str, dict[int, list[tuple[float, str]]]] = {}  # ram_read trials, by their threads
    for record in _records(root):
        host, mode = str(record.get("host", "")), str(record.get("mode", ""))
        metrics, params = record.get("metrics") or {}, record.get("params") or {}
        if record.get("status") != "ok":
            missing.setdefault(host, {})[mode] = f"{record.get('status')}: {record.get('reason') or 'no reason'}"
            continue
        if mode == _COPY_MODE:
            where = f"GPU {metrics.get('gpu')} {metrics.get('gpu_name') or '?'} ({metrics.get('pci_bus_id') or '?'})"
            for key, value in metrics.items():
                if (m := re.fullmatch(r"(h2d|d2h)_(pinned|pageable)_gb_s", key)) and (rate := _number(value)):
                    copies.setdefault(host, {}).setdefault((m[1], m[2]), []).append(
                        (rate, f"h2d_copy {m[1]} {m[2]}, {where}"))
        elif mode == _RAM_MODE and (rate := _number(metrics.get("gb_s"))):
            threads = metrics.get("threads") if isinstance(metrics.get("threads"), int) else 0
            source = (f"ram_read {metrics.get('target') or params.get('target')} ({metrics.get('fs_type') or '?'}), "
                      f"{threads} thread{'' if threads == 1 else 's'}")
            ram_by_threads.setdefault(host, {}).setdefault(threads, []).append((rate, source))
        elif mode in DISK_READ_MODES and (rate := _number(metrics.get("gb_s"))):
            target = str(params.get("target", ""))
            found = ram if _on_ram(target, record.get("host_facts")) else reads
            found.setdefault(host, {}).setdefault(mode, []).append((rate, f"fio {mode} {target}"))
    for host, by_threads in ram_by_threads.items():  # the most parallel read measured is RAM's limit
        ram.setdefault(host, {})[_RAM_MODE] = by_threads[max(by_threads)]
    hosts = sorted({*copies, *reads, *ram, *missing})
    out = {}
    for host in hosts:
        measured = set(reads.get(host, {})) | set(ram.get(host, {})) | ({_COPY_MODE} if host in copies else set())
        out[host] = NodeLimits(host, _rates(copies.get(host, {})), _rates(reads.get(host, {})),
                               {m: why for m, why in missing.get(host, {}).items() if m not in measured},
                               _rates(ram.get(host, {})))
    return out


def host_limits(root: Path, host: str) -> NodeLimits | None:
    """``host``'s limits, or None when the results folder has no storage trial of that host."""
    return node_limits(root).get(host)


def _tier(word: str) -> str:
    return _TIER_WORDS.get(word.lower(), "")


def transfer_limit(limits: NodeLimits, source: str, destination: str) -> tuple[Rate | None, str]:
    """The measured limit of a transfer from tier ``source`` to ``destination`` (``cpu``, ``gpu``,
    ``fs``, ...), and what bounds it in words; ``(None, why)`` where the node has no such figure."""
    src, dst = _tier(source), _tier(destination)
    if {src, dst} == {_HOST, _GPU}:
        direction = "h2d" if src == _HOST else "d2h"
        words = "host → GPU" if direction == "h2d" else "GPU → host"
        rate = limits.copy(direction, "pinned")
        if rate is None:
            return None, f"no pinned {words} copy rate ({limits.not_measured.get(_COPY_MODE) or 'no h2d_copy trial'})"
        return rate, f"pinned {words} copy"
    if src == _DISK:
        rate = limits.disk_read()
        missing = "; ".join(f"{m} {limits.not_measured[m]}" for m in DISK_READ_MODES if m in limits.not_measured)
        return rate, ("disk read" if rate else f"no disk read rate ({missing or 'no fio read trial'})")
    if dst == _DISK:
        return None, "a disk write: the storage kind measures reads only"
    return None, f"no measured limit for {source} → {destination}"
