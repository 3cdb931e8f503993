"""The ``storage`` kind's ``ram_read`` mode: RAM's read rate, measured with no fio.

``nodetools/ram_read.py`` writes a file of ``size_mib`` into ``target`` (tmpfs by default, so the
file is RAM; elsewhere it is the page cache, as it was just written) and reads it back with
``threads`` threads, ``repeats`` timed passes after a warm-up. The trial fetches
``raw/<host>/ram_read.json``; :func:`ram_read_metrics` checks it (bounded, the tool's own shape) into
the trial's figures; ``storage.csv`` gets one row, ``direction`` read and ``memory`` ``ram`` (tmpfs,
ramfs) or ``page_cache``. A restore of an image in RAM (staged in tmpfs, or in the page cache) is
bounded by this rate: :mod:`runner.experiments.limits` files it among the host's RAM reads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

if TYPE_CHECKING:
    import pandas as pd

from nodetools.ram_read import DEFAULT_TARGET, MAX_REPEATS, MAX_SIZE_MIB, MAX_THREADS
from runner.errors import ParseError
from runner.experiments.base import ModeParams
from runner.experiments.tool_json import read_tool_json

__all__ = ["RAM_MODE", "RAM_RAW", "RamReadParams", "ram_read_metrics", "ram_row", "ram_table"]

RAM_MODE = "ram_read"
RAM_RAW = "ram_read.json"
_MAX_RAW_BYTES = 1 << 20  # the tool's JSON is ~1 KB: anything far larger is not its output
_MAX_GB_S = 10_000.0  # far above any memory system: a larger figure is not a measurement
_RAM_FILESYSTEMS = ("tmpfs", "ramfs")
_FIGURES = ("gb_s", "gb_s_max", "seconds_median")


class RamReadParams(ModeParams):
    """A file read back from RAM by threads: no fio, no disk, no GPU (the trial is exclusive)."""

    MODE: ClassVar[str] = RAM_MODE
    target: str = Field(default=DEFAULT_TARGET, pattern=r"^/", max_length=1024,
                        description="The folder the file is written into and read back from: on tmpfs it is RAM, "
                                    "elsewhere the page cache. Created when missing; the file is always removed.")
    size_mib: int = Field(default=4096, ge=1, le=MAX_SIZE_MIB, description="The file's size in MiB (at most half "
                          "the RAM the node has available, and room on the target's filesystem).")
    threads: int = Field(default=4, ge=1, le=MAX_THREADS, description="Threads reading a slice each, at once "
                         "(os.preadv in 1 MiB calls releases the GIL).")
    repeats: int = Field(default=5, ge=1, le=MAX_REPEATS, description="Timed passes over the whole file within "
                         "the trial (after one warm-up); the rate is over their median.")

    @model_validator(mode="after")
    def _a_block_each(self) -> RamReadParams:
        if self.threads > self.size_mib:
            raise ValueError(f"threads {self.threads} need at least {self.threads} MiB (one 1 MiB block each), "
                             f"not size_mib {self.size_mib}")
        return self


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def ram_read_metrics(path: Path) -> dict[str, Any]:
    """The trial's figures from ram_read's JSON: ``gb_s`` (over the median pass), ``gb_s_max`` (the
    fastest), ``seconds_median``, and what was read: ``size_bytes``, ``threads``, ``fs_type``, ``target``."""
    source = str(path)
    record = read_tool_json(path, "ram_read", _MAX_RAW_BYTES)
    if not isinstance(record, dict) or record.get("tool") != "nodetools.ram_read":
        raise ParseError(source, "not ram_read's output (no 'tool': 'nodetools.ram_read')")
    if record.get("verified") is not True:
        raise ParseError(source, "the bytes read back were not verified: its rates mean nothing")
    bad = [key for key in _FIGURES if not _positive(record.get(key))]
    if bad:
        raise ParseError(source, f"no positive number for {', '.join(bad)}")
    if record["gb_s"] > _MAX_GB_S or record["gb_s_max"] > _MAX_GB_S:
        raise ParseError(source, f"a rate above {_MAX_GB_S:.0f} GB/s ({record['gb_s_max']}): not a RAM read")
    size, threads = record.get("size_bytes"), record.get("threads")
    if not (isinstance(size, int) and 0 < size <= MAX_SIZE_MIB << 20):
        raise ParseError(source, f"size_bytes {size!r:.40} is not 1 byte to {MAX_SIZE_MIB} MiB")
    if not (isinstance(threads, int) and 1 <= threads <= MAX_THREADS):
        raise ParseError(source, f"threads {threads!r:.40} is not 1-{MAX_THREADS}")
    texts = {key: record.get(key) for key in ("fs_type", "target")}
    if not all(isinstance(v, str) and 0 < len(v) <= 4096 for v in texts.values()):
        raise ParseError(source, f"fs_type and target must be short strings, not {texts!r:.200}")
    resident = record.get("resident_fraction")
    return {**{key: record[key] for key in _FIGURES}, "size_bytes": size, "threads": threads, **texts,
            "in_ram": texts["fs_type"] in _RAM_FILESYSTEMS,
            "resident_fraction": resident if isinstance(resident, int | float) and 0 <= resident <= 1 else None}


def ram_row(row: dict[str, Any], params: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """``storage.csv``'s row of a ram_read trial: the planned read, and its figures when it finished ok."""
    row = {**row, "target": params.get("target"), "size": f"{params.get('size_mib')}M", "bs": "1M", "iodepth": 1,
           "numjobs": params.get("threads"), "passes": params.get("repeats"), "direction": "read"}
    if not metrics:
        return row
    size, seconds = metrics.get("size_bytes"), metrics.get("seconds_median")
    return {**row, "target": metrics.get("target"), "numjobs": metrics.get("threads"),
            "fs_type": metrics.get("fs_type"), "memory": "ram" if metrics.get("in_ram") else "page_cache",
            "gb_s": metrics.get("gb_s"), "gb_s_max": metrics.get("gb_s_max"), "seconds_median": seconds,
            "bw_bytes": round(size / seconds) if size and seconds else None, "io_bytes": size}


def ram_table(ok: pd.DataFrame) -> list[str]:
    """The report's RAM reads: medians over the trials of each host, target and shape."""
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    lines = ["\n### RAM reads (`ram_read`)\n",
             "A file written into `target` and read back at once (`nodetools/ram_read.py`, no fio): on tmpfs it is "
             "RAM (`memory` ram), elsewhere the page cache. `numjobs` threads read a slice each in 1 MiB `preadv` "
             "calls; GB/s are decimal, over the median pass of each trial, then the median over the trials (best: "
             "the fastest pass). A restore of an image in RAM (staged in tmpfs, or in the page cache) is bounded "
             "by this rate.\n",
             "| host | target | memory | size | threads | trials x passes | GB/s | best GB/s |",
             "|---|---|---|---|---|---|---|---|"]
    for (host, target, memory, size, threads), group in ok.groupby(["host", "target", "memory", "size", "numjobs"],
                                                                   sort=True):
        lines.append(
            f"| {host} | {target} ({group.iloc[0]['fs_type']}) | {memory} | {size} | {threads} | "
            f"{len(group)} x {group.iloc[0]['passes']} | {pd.to_numeric(group['gb_s']).median():.2f} | "
            f"{pd.to_numeric(group['gb_s_max']).max():.2f} |")
    return lines
