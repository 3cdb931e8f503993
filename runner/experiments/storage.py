"""``storage``: the node's transfer limits: the fio baseline of its data filesystem (the reference
campaign's 13.5 GB/s RAID0 read) and its host-GPU copy rates.

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

``h2d_copy`` times host-to-GPU (``h2d``) and GPU-to-host (``d2h``) copies from pinned and pageable
host memory on one GPU (``nodetools/h2d_copy.py``, ctypes over the driver's libcuda): the PCIe
rate a KV offload tier or a CUDA checkpoint restore can reach. It fetches ``raw/<host>/h2d_copy.json``;
``storage.csv`` gets one row per direction and memory kind (``gb_s`` over the median repeat). A
node without an NVIDIA driver or GPU skips the trial with that reason.

``ram_read`` measures RAM's read rate with no fio (``nodetools/ram_read.py``: a file in tmpfs, or
the page cache, read back by threads; :mod:`runner.experiments.storage_ram`): what a restore of an
image staged in RAM can reach. It fetches ``raw/<host>/ram_read.json``; ``storage.csv`` gets one row.
Other kinds read these figures through :mod:`runner.experiments.limits`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, computed_field

if TYPE_CHECKING:
    import pandas as pd

from nodetools.h2d_copy import DIRECTIONS, MAX_SIZE_MIB, MEMORY_KINDS
from runner.errors import ParseError
from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.experiments.node_plan import NodePlan, reap_argv
from runner.experiments.storage_ram import RAM_MODE, RAM_RAW, RamReadParams, ram_read_metrics, ram_row, ram_table
from runner.experiments.tool_json import read_tool_json
from runner.parse.fio import parse_fio_json, summarize
from runner.records import TrialRecord

__all__ = ["H2D_RAW", "KIND", "PLAYBOOK", "STORAGE_MODES", "BufferedReadParams", "H2DCopyParams",
           "RamReadParams", "SeqReadDirectParams", "h2d_copy_metrics", "storage_metrics"]

PLAYBOOK = "playbooks/experiments/storage.yml"
_SIZE = r"^[1-9][0-9]*[KMGTP]?$"  # fio's sizes, base 2: 512M, 16G
REFERENCE_READ_GB_S = 13.5  # the reference campaign's fio sequential read on the 12 TB NVMe RAID0 (8x H200 node)
PCIE5_X16_GB_S = 63.0  # PCIe Gen5 x16, one way, after 128b/130b encoding: what no H200 copy can pass
H2D_MODE = "h2d_copy"
H2D_RAW = "h2d_copy.json"
_MAX_RAW_BYTES = 1 << 20  # the tool's JSON is ~3 KB: anything far larger is not its output


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


class H2DCopyParams(ModeParams):
    """Host-GPU copies on one GPU: no fio, no disk; the GPU must be idle (the trial is exclusive)."""

    MODE: ClassVar[str] = H2D_MODE
    size_mib: int = Field(default=1024, ge=1, le=MAX_SIZE_MIB, description="MiB per copy (one device buffer, "
                          "one pinned and one pageable host buffer of this size).")
    repeats: int = Field(default=5, ge=1, le=100, description="Timed copies per direction and memory kind, "
                         "within the trial (after one warm-up); the rate is over their median.")
    gpu: int = Field(default=0, ge=0, le=63, description="The GPU, by nvidia-smi's index.")


def h2d_copy_metrics(path: Path) -> dict[str, Any]:
    """The trial's figures from h2d_copy's JSON: ``<direction>_<memory>_gb_s`` (over the median repeat),
    ``..._gb_s_max`` (the fastest) and ``..._s`` (the median seconds), and the GPU they were measured on."""
    source = str(path)
    record = read_tool_json(path, "h2d_copy", _MAX_RAW_BYTES)
    if not isinstance(record, dict) or not isinstance(record.get("copies"), list):
        raise ParseError(source, "no 'copies' list: not h2d_copy's output")
    if record.get("verified") is not True:
        raise ParseError(source, "the bytes read back were not verified: its rates mean nothing")
    out: dict[str, Any] = {key: record.get(key) for key in ("gpu", "gpu_name", "pci_bus_id", "numa_node",
                                                            "driver_version", "cuda_version", "size_bytes")}
    for copy in record["copies"]:
        if not isinstance(copy, dict) or copy.get("direction") not in DIRECTIONS or copy.get("memory") not in \
                MEMORY_KINDS or not all(isinstance(copy.get(k), int | float) and copy[k] > 0
                                        for k in ("gb_s", "gb_s_max", "seconds_median")):
            raise ParseError(source, f"a copy without a direction, memory kind and positive rate: {copy!r:.200}")
        name = f"{copy['direction']}_{copy['memory']}"
        out.update({f"{name}_gb_s": copy["gb_s"], f"{name}_gb_s_max": copy["gb_s_max"],
                    f"{name}_s": copy["seconds_median"]})
    missing = [f"{d}_{m}" for m in MEMORY_KINDS for d in DIRECTIONS if f"{d}_{m}_gb_s" not in out]
    if missing:
        raise ParseError(source, f"no figure for {', '.join(missing)}")
    return out


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
    if ctx.mode == H2D_MODE:
        return h2d_copy_metrics(ctx.trial_dir / "raw" / ctx.host / H2D_RAW)
    if ctx.mode == RAM_MODE:
        return ram_read_metrics(ctx.trial_dir / "raw" / ctx.host / RAM_RAW)
    path = ctx.trial_dir / "raw" / ctx.host / f"fio-{ctx.mode}.json"
    return storage_metrics(parse_fio_json(path), str(path))


_PARAM_COLUMNS = ("target", "size", "bs", "iodepth", "numjobs", "runtime_s")
_METRIC_COLUMNS = ("gb_s", "bw_bytes", "iops", "clat_p50_us", "clat_p99_us", "clat_p99_9_us", "lat_mean_us",
                   "io_bytes", "runtime_ms", "fio_version")
# h2d_copy rows: the copy's own figures and the GPU they were measured on (empty in fio rows).
_COPY_COLUMNS = ("gb_s_max", "seconds_median", "copy_repeats", "gpu", "gpu_name", "pci_bus_id", "driver_version")
# ram_read rows: the timed passes of the trial and the target's filesystem (empty in the others).
_RAM_COLUMNS = ("passes", "fs_type")
# The directions in words, for the report.
DIRECTION_WORDS = {"h2d": "host → GPU", "d2h": "GPU → host", "read": "disk → host"}


def _rows(record: TrialRecord) -> list[dict[str, Any]]:
    """One row per fio or ram_read trial (``direction`` read); per h2d_copy trial one row per direction
    and memory kind, or one row with its reason when it did not finish ok."""
    params = record.get("params") or {}
    metrics = (record.get("metrics") or {}) if record.get("status") == "ok" else {}
    row: dict[str, Any] = dict.fromkeys((*_PARAM_COLUMNS, "direction", "memory", *_METRIC_COLUMNS, *_COPY_COLUMNS,
                                         *_RAM_COLUMNS))
    if record.get("mode") == RAM_MODE:
        return [ram_row(row, params, metrics)]
    if record.get("mode") == H2D_MODE:
        row.update(size=f"{params.get('size_mib')}M", copy_repeats=params.get("repeats"), gpu=params.get("gpu"))
        if not metrics:
            return [row]
        row.update({key: metrics.get(key) for key in ("gpu", "gpu_name", "pci_bus_id", "driver_version")})
        out = []
        for memory in MEMORY_KINDS:
            for direction in DIRECTIONS:
                name, seconds = f"{direction}_{memory}", metrics.get(f"{direction}_{memory}_s")
                size = metrics.get("size_bytes")
                out.append({**row, "direction": direction, "memory": memory, "gb_s": metrics.get(f"{name}_gb_s"),
                            "gb_s_max": metrics.get(f"{name}_gb_s_max"), "seconds_median": seconds,
                            "bw_bytes": round(size / seconds) if size and seconds else None, "io_bytes": size})
        return out
    row.update({key: params.get(key) for key in _PARAM_COLUMNS})
    row["iodepth"] = (params.get("job") or {}).get("iodepth", row["iodepth"])  # buffered: 1 by construction
    row["direction"] = (params.get("job") or {}).get("rw")
    row.update({key: metrics.get(key) for key in _METRIC_COLUMNS})
    return [row]


def _fio_table(ok: pd.DataFrame) -> list[str]:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    lines = ["| host | mode | target | numjobs x iodepth | repeats | GB/s | IOPS | clat p99 (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for (host, mode), group in ok.groupby(["host", "mode"], sort=True):
        first = group.iloc[0]
        p99 = pd.to_numeric(group["clat_p99_us"], errors="coerce").median()
        lines.append(
            f"| {host} | {mode} | {first['target']} | {first['numjobs']} x {first['iodepth']} | {len(group)} | "
            f"{pd.to_numeric(group['gb_s']).median():.2f} | {pd.to_numeric(group['iops']).median():.0f} | "
            f"{'' if pd.isna(p99) else f'{p99 / 1000:.1f}'} |")
    return lines


def _copy_table(ok: pd.DataFrame) -> list[str]:
    import pandas as pd  # noqa: PLC0415

    lines = ["\n### Host-GPU copies (`h2d_copy`)\n",
             "Each row is one direction (`h2d`: host memory → GPU, `d2h`: GPU → host memory) from one kind of "
             "host memory: `pinned` is page-locked (`cuMemHostAlloc`), copied by the GPU's DMA engine directly, "
             "as vLLM's CPU KV tier and a CUDA checkpoint restore copy; `pageable` is ordinary `malloc` memory, "
             "which the driver stages through its own pinned buffers. GB/s are decimal, over the median repeat "
             "of each trial, then the median over the trials (best: the fastest single copy); PCIe Gen5 x16 "
             f"carries at most ~{PCIE5_X16_GB_S:.0f} GB/s a way.\n",
             "| host | GPU | direction | memory | size | trials x copies | GB/s | best GB/s |",
             "|---|---|---|---|---|---|---|---|"]
    order = {(d, m): i for i, (m, d) in enumerate((m, d) for m in MEMORY_KINDS for d in DIRECTIONS)}
    groups = sorted(ok.groupby(["host", "gpu", "direction", "memory", "size"], sort=True),
                    key=lambda item: (item[0][0], item[0][1], order.get((item[0][2], item[0][3]), 99), item[0][4]))
    for (host, gpu, direction, memory, size), group in groups:
        first = group.iloc[0]
        lines.append(
            f"| {host} | {gpu}: {first['gpu_name']} ({first['pci_bus_id']}) | {direction} "
            f"({DIRECTION_WORDS.get(str(direction), direction)}) | {memory} | {size} | "
            f"{len(group)} x {first['copy_repeats']} | {pd.to_numeric(group['gb_s']).median():.2f} | "
            f"{pd.to_numeric(group['gb_s_max']).max():.2f} |")
    return lines


def _section(frame: pd.DataFrame, _root: Path) -> str:
    copies = frame[frame["mode"] == H2D_MODE]
    ram = frame[frame["mode"] == RAM_MODE]
    fio = frame[~frame["mode"].isin((H2D_MODE, RAM_MODE))]
    parts = [*(["RAM reads"] if len(ram) else []), *(["host-GPU copies"] if len(copies) else [])]
    if len(fio) or not len(ram):  # a campaign of copies alone keeps the heading it always had
        parts.insert(0, "Storage (fio)")
    title = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    title = title if title.startswith("Storage") else f"Storage: {title}"
    lines = [f"\n## {title}\n"]
    if len(fio):
        lines.append("Reference: the reference campaign's fio sequential read on the 12 TB NVMe RAID0 was "
                     f"{REFERENCE_READ_GB_S} GB/s "
                     "(`seq_read_direct`, 1 MiB blocks, direct I/O). Medians over the repeats that finished ok; "
                     "full rows in `storage.csv`.\n")
        fio_ok = fio[fio["status"] == "ok"]
        lines.extend(_fio_table(fio_ok) if len(fio_ok) else ["_no fio trial finished ok_\n"])
    ram_ok = ram[ram["status"] == "ok"]
    if len(ram_ok):
        lines.extend(ram_table(ram_ok))
    elif len(ram):
        lines.append("\n### RAM reads (`ram_read`)\n\n_no ram_read trial finished ok_\n")
    copies_ok = copies[copies["status"] == "ok"]
    if len(copies_ok):
        lines.extend(_copy_table(copies_ok))
    elif len(copies):
        lines.append("\n### Host-GPU copies (`h2d_copy`)\n\n_no h2d_copy trial finished ok_\n")
    not_ok = frame[frame["status"] != "ok"].drop_duplicates("trial_id")
    if len(not_ok):
        lines.append("\nNot measured (a row each in `storage.csv`, with the reason):\n")
        lines.extend(f"- {r.host} {r.mode} r{r.repeat}: {r.status}: {r.reason}" for r in not_ok.itertuples())
    return "\n".join(lines) + "\n"


def _resources(ctx: TrialContext) -> Resources:
    # A storage baseline needs the node's disks, and a copy its GPU and PCIe link, to itself.
    if ctx.mode == H2D_MODE:
        return Resources(gpus=(int(ctx.params.get("gpu", 0)),), exclusive=True)
    if ctx.mode == RAM_MODE:  # the file lies in RAM while it is read (tmpfs, or the page cache)
        return Resources(exclusive=True, host_ram_gib=round(int(ctx.params["size_mib"]) / 1024, 2))
    return Resources(exclusive=True)


def _node_plan(ctx: TrialContext) -> NodePlan:
    """The reap (a stray fio of an earlier attempt too: --clear-users), the copy timer's and the RAM
    reader's argv; the fio job itself is the fio role's."""
    paths = ctx.node_paths()
    commands = {"reap": reap_argv(paths, clear_users=True)}
    if ctx.mode == H2D_MODE:
        tool = [paths.python, "-m", "nodetools.h2d_copy"]
        gpu = str(ctx.params["gpu"])
        commands["h2d_probe"] = [*tool, "--probe", "--gpu", gpu]
        commands["h2d_copy"] = [*tool, "--size-mib", str(ctx.params["size_mib"]), "--repeats",
                                str(ctx.params["repeats"]), "--gpu", gpu, "--out", paths.file(H2D_RAW)]
    elif ctx.mode == RAM_MODE:
        commands["ram_read"] = [paths.python, "-m", "nodetools.ram_read", "--target", str(ctx.params["target"]),
                                "--size-mib", str(ctx.params["size_mib"]), "--threads", str(ctx.params["threads"]),
                                "--repeats", str(ctx.params["repeats"]), "--out", paths.file(RAM_RAW)]
    return NodePlan(commands=commands)


KIND = ExperimentKind(
    name="storage",
    doc="docs/storage.md",
    summary="the node's transfer limits: fio on the data filesystem (direct sequential read, the reference "
            "campaign's 13.5 GB/s, and buffered read), RAM's read rate without fio and host-GPU copies (pinned "
            "and pageable)",
    phases=(Phase("run", PLAYBOOK, waits_for_turn=True),),
    modes={m.MODE: m for m in (SeqReadDirectParams, BufferedReadParams, H2DCopyParams, RamReadParams)},
    default_modes=("seq_read_direct", "buffered_read"),
    resources=_resources,
    collect=_collect,
    node_plan=_node_plan,
    report=KindReport(csv_name="storage.csv", rows=_rows, section=_section),
)
