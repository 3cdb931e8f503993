"""``storage``: the fio baseline of a node's data filesystem (the reference campaign's 13.5 GB/s RAID0 read).

``seq_read_direct`` is the figure the reference campaign quotes: sequential reads, 1 MiB blocks, direct I/O,
enough queue depth and jobs to saturate an NVMe RAID0. ``buffered_read`` reads the same way
through the page cache, one cold pass per file (fio drops the file's cached pages first), which
is what a model load from disk sees. Both run the fio role's ``run`` entry point
(``playbooks/experiments/storage.yml``) on files laid out in ``target`` (a directory on the
mounted filesystem), or on a block device that holds no data; the role refuses anything else.

The trial fetches ``raw/<host>/fio-<mode>.json`` and the job file; ``collect`` parses the JSON
(:mod:`runner.parse.fio`) into ``bw_bytes``, ``gb_s`` (decimal GB/s, as fio and the reference campaign
quote them), ``iops`` and completion-latency percentiles in µs. ``storage.csv`` has one row per
trial with the job's parameters and those figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, computed_field

if TYPE_CHECKING:
    import pandas as pd

from runner.errors import ParseError
from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.parse.fio import parse_fio_json, summarize

__all__ = ["KIND", "PLAYBOOK", "STORAGE_MODES", "BufferedReadParams", "SeqReadDirectParams", "storage_metrics"]

PLAYBOOK = "playbooks/experiments/storage.yml"
_SIZE = r"^[1-9][0-9]*[KMGTP]?$"  # fio's sizes, base 2: 512M, 16G
REFERENCE_READ_GB_S = 13.5  # the reference campaign's fio sequential read on the 12 TB NVMe RAID0 (8x H200 node)


# What each mode measures: fio's access pattern, I/O path and engine; sizes and depths come from
# the campaign. ``job`` in a trial's params carries it to the playbook (plan.json shows it).
STORAGE_MODES: dict[str, dict[str, Any]] = {
    "seq_read_direct": {"rw": "read", "direct": True, "ioengine": "libaio"},
    "buffered_read": {"rw": "read", "direct": False, "ioengine": "psync"},  # synchronous: queue depth 1
}


class _FioParams(ModeParams):
    MODE: ClassVar[str] = ""
    target: str = Field(default="/mnt/data/fio", pattern=r"^/",
                        description="Directory on the mounted data filesystem (files laid out inside), "
                                    "or a block device that holds no data.")
    size: str = Field(default="16G", pattern=_SIZE, description="Bytes per job (fio suffixes, base 2).")
    bs: str = Field(default="1M", pattern=_SIZE, description="Block size.")
    numjobs: int = Field(default=8, ge=1, le=256, description="Parallel jobs, reported together.")
    runtime_s: int = Field(default=30, gt=0, le=3600, description="Measurement length (upper bound when buffered).")
    keep_files: bool = Field(default=True, description="Keep the laid-out files for the next repeat.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def job(self) -> dict[str, Any]:
        """The fio job of this mode: its pattern, I/O path and engine, and the queue depth per job."""
        return {**STORAGE_MODES[self.MODE], "iodepth": int(getattr(self, "iodepth", 1))}


class SeqReadDirectParams(_FioParams):
    MODE: ClassVar[str] = "seq_read_direct"
    iodepth: int = Field(default=32, ge=1, le=4096, description="Queue depth per job (libaio).")


class BufferedReadParams(_FioParams):
    """Buffered reads use a synchronous engine: the queue depth is 1 by construction."""

    MODE: ClassVar[str] = "buffered_read"


def storage_metrics(rows: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """The trial's figures from parsed fio rows; a job that reported an error fails the trial."""
    failed = [r for r in rows if r.get("error")]
    if failed:
        raise ParseError(source, f"fio job {failed[0]['job']!r} ended with error {failed[0]['error']}")
    total = summarize(rows, "read")
    if not total:
        raise ParseError(source, "the job read nothing")
    out: dict[str, Any] = {
        "bw_bytes": total["bw_bytes"],
        "gb_s": round(total["bw_bytes"] / 1e9, 3),
        "iops": total["iops"],
        "io_bytes": total["io_bytes"],
        "runtime_ms": total["runtime_ms"],
    }
    for key in ("lat_mean_us", "clat_p50_us", "clat_p90_us", "clat_p99_us", "clat_p99_9_us"):
        if key in total:
            out[key] = total[key]
    if rows[0].get("fio_version"):
        out["fio_version"] = rows[0]["fio_version"]
    return out


def _collect(ctx: TrialContext) -> dict[str, Any]:
    assert ctx.trial_dir is not None
    path = ctx.trial_dir / "raw" / ctx.host / f"fio-{ctx.mode}.json"
    return storage_metrics(parse_fio_json(path), str(path))


_PARAM_COLUMNS = ("target", "size", "bs", "iodepth", "numjobs", "runtime_s")
_METRIC_COLUMNS = ("gb_s", "bw_bytes", "iops", "clat_p50_us", "clat_p99_us", "clat_p99_9_us", "lat_mean_us",
                   "io_bytes", "runtime_ms", "fio_version")


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    params = record.get("params") or {}
    row: dict[str, Any] = {key: params.get(key) for key in _PARAM_COLUMNS}
    row["iodepth"] = (params.get("job") or {}).get("iodepth", row["iodepth"])  # buffered: 1 by construction
    metrics = (record.get("metrics") or {}) if record.get("status") == "ok" else {}
    row.update({key: metrics.get(key) for key in _METRIC_COLUMNS})
    return [row]


def _section(frame: pd.DataFrame, _root: Path) -> str:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    lines = ["\n## Storage (fio)\n",
             "Reference: the reference campaign's fio sequential read on the 12 TB NVMe RAID0 was "
             f"{REFERENCE_READ_GB_S} GB/s "
             "(`seq_read_direct`, 1 MiB blocks, direct I/O). Medians over the repeats that finished ok; "
             "full rows in `storage.csv`.\n"]
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        lines.append("_no storage trial finished ok_\n")
        return "\n".join(lines)
    lines.append("| host | mode | target | numjobs x iodepth | repeats | GB/s | IOPS | clat p99 (ms) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for (host, mode), group in ok.groupby(["host", "mode"], sort=True):
        first = group.iloc[0]
        p99 = pd.to_numeric(group["clat_p99_us"], errors="coerce").median()
        lines.append(
            f"| {host} | {mode} | {first['target']} | {first['numjobs']} x {first['iodepth']} | {len(group)} | "
            f"{pd.to_numeric(group['gb_s']).median():.2f} | {pd.to_numeric(group['iops']).median():.0f} | "
            f"{'' if pd.isna(p99) else f'{p99 / 1000:.1f}'} |")
    return "\n".join(lines) + "\n"


KIND = ExperimentKind(
    name="storage",
    summary="fio baseline of the data filesystem: direct sequential read (the reference campaign's 13.5 GB/s) "
            "and buffered read",
    phases=(Phase("run", PLAYBOOK),),
    modes={m.MODE: m for m in (SeqReadDirectParams, BufferedReadParams)},
    default_modes=("seq_read_direct", "buffered_read"),
    # A storage baseline needs the node's disks to itself.
    resources=lambda _ctx: Resources(exclusive=True),
    collect=_collect,
    report=KindReport(csv_name="storage.csv", rows=_rows, section=_section),
)
