"""Parse fio's ``--output-format=json`` output into one row per job and I/O direction.

Pure: text or a file in, plain dicts out; no Ansible, no network. Every row has the keys of
:data:`FIO_COLUMNS` (``None`` where fio did not report the value), with units in the names:

* ``bw_bytes`` (bytes/s, fio's own figure), ``iops``, ``io_bytes``, ``runtime_ms``;
* latencies in microseconds: ``lat_mean_us`` (submission + completion), ``clat_mean_us`` and the
  completion-latency percentiles ``clat_p50_us`` … ``clat_p99_99_us``;
* the job's options that decide what was measured (``rw``, ``bs``, ``iodepth``, ``numjobs``,
  ``direct``, ``ioengine``, ``size``), job options over global options, as fio applies them;
* ``error``: fio's per-job error code (0 = the job ran to completion). The parser reports it;
  whether a failed job fails the trial is the caller's decision.

A job contributes one row per direction (``read``, ``write``, ``trim``) that moved data, so a
pure read job gives one row. With ``group_reporting`` fio folds its ``numjobs`` clones into one
job entry; without it each clone is a row, and :func:`summarize` adds their bandwidths.

fio older than 3.0 reported latencies in microseconds under ``clat``/``lat`` instead of
nanoseconds under ``clat_ns``/``lat_ns``; both are read. Text before the JSON object (fio writes
notes such as ``note: both iodepth >= 1 and synchronous I/O engine are selected`` to the same
stream when ``--output`` is not used) and after it is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from runner.errors import ParseError

__all__ = ["FIO_COLUMNS", "PERCENTILES", "parse_fio_json", "parse_fio_text", "summarize"]

DIRECTIONS = ("read", "write", "trim")
# fio's percentile key (as a float) -> column suffix.
PERCENTILES: dict[float, str] = {50.0: "p50", 90.0: "p90", 99.0: "p99", 99.9: "p99_9", 99.99: "p99_99"}
_OPTION_COLUMNS = ("rw", "bs", "iodepth", "numjobs", "direct", "ioengine", "size")
FIO_COLUMNS: tuple[str, ...] = (
    "job", "direction", *_OPTION_COLUMNS,
    "bw_bytes", "iops", "io_bytes", "runtime_ms",
    "lat_mean_us", "clat_mean_us", *(f"clat_{suffix}_us" for suffix in PERCENTILES.values()),
    "error", "fio_version",
)
_INT_OPTIONS = ("iodepth", "numjobs", "direct")


def _decode(text: str, source: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        raise ParseError(source, "no JSON object found (is this fio --output-format=json output?)")
    try:
        data, _end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise ParseError(source, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    return data  # decoding from a "{" always yields a dict


def _number(value: Any, source: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParseError(source, f"{where}: expected a number, got {value!r}")
    return float(value)


def _latency_us(stats: Mapping[str, Any], key_ns: str, key_us: str) -> tuple[Mapping[str, Any] | None, float]:
    """The latency block and the factor that turns its values into microseconds."""
    block = stats.get(key_ns)
    if isinstance(block, Mapping):
        return block, 1e-3
    block = stats.get(key_us)
    if isinstance(block, Mapping):
        return block, 1.0
    return None, 1.0


def _percentiles(block: Mapping[str, Any] | None, factor: float, source: str, where: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"clat_{suffix}_us": None for suffix in PERCENTILES.values()}
    raw = block.get("percentile") if block is not None else None
    if not isinstance(raw, Mapping):
        return out
    for key, value in raw.items():
        try:
            pct = round(float(key), 6)
        except ValueError:
            raise ParseError(source, f"{where}: percentile key {key!r} is not a number") from None
        suffix = PERCENTILES.get(pct)
        if suffix is not None:
            out[f"clat_{suffix}_us"] = round(_number(value, source, f"{where}.{key}") * factor, 3)
    return out


def _options(global_opts: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**global_opts, **(job.get("job options") or {})}
    out: dict[str, Any] = {}
    for key in _OPTION_COLUMNS:
        value = merged.get(key)
        if key in _INT_OPTIONS and isinstance(value, str) and value.isdigit():
            value = int(value)
        out[key] = value
    if out["rw"] is None:
        out["rw"] = merged.get("readwrite")
    return out


def parse_fio_text(text: str, source: str = "<text>") -> list[dict[str, Any]]:
    """Rows (see :data:`FIO_COLUMNS`) of one fio JSON document; ``ParseError`` on bad input."""
    data = _decode(text, source)
    jobs = data.get("jobs")
    if not isinstance(jobs, list) or not jobs:
        raise ParseError(source, "no 'jobs' list: not fio JSON output, or fio ran no job")
    version = data.get("fio version")
    global_opts = data.get("global options") or {}
    if not isinstance(global_opts, Mapping):
        raise ParseError(source, "'global options' is not an object")
    rows: list[dict[str, Any]] = []
    for index, job in enumerate(jobs):
        where = f"jobs[{index}]"
        if not isinstance(job, Mapping) or "jobname" not in job:
            raise ParseError(source, f"{where}: not a fio job entry (no jobname)")
        options = _options(global_opts, job)
        error = int(_number(job.get("error", 0), source, f"{where}.error"))
        moved = False
        for direction in DIRECTIONS:
            stats = job.get(direction)
            if not isinstance(stats, Mapping):
                continue
            io_bytes = stats.get("io_bytes")
            if io_bytes is None and "io_kbytes" in stats:  # fio 2.x
                io_bytes = _number(stats["io_kbytes"], source, f"{where}.{direction}.io_kbytes") * 1024
            if not io_bytes:
                continue
            moved = True
            bw = stats.get("bw_bytes")
            bw_bytes = (_number(bw, source, f"{where}.{direction}.bw_bytes") if bw is not None
                        else _number(stats.get("bw"), source, f"{where}.{direction}.bw") * 1024)
            clat, clat_factor = _latency_us(stats, "clat_ns", "clat")
            lat, lat_factor = _latency_us(stats, "lat_ns", "lat")
            row: dict[str, Any] = {
                "job": str(job["jobname"]), "direction": direction, **options,
                "bw_bytes": int(bw_bytes),
                "iops": round(_number(stats.get("iops"), source, f"{where}.{direction}.iops"), 3),
                "io_bytes": int(_number(io_bytes, source, f"{where}.{direction}.io_bytes")),
                "runtime_ms": int(_number(stats.get("runtime", 0), source, f"{where}.{direction}.runtime")),
                "lat_mean_us": (round(_number(lat.get("mean"), source, f"{where}.{direction}.lat.mean") * lat_factor, 3)
                                if lat is not None and "mean" in lat else None),
                "clat_mean_us": (round(_number(clat.get("mean"), source, f"{where}.{direction}.clat.mean")
                                       * clat_factor, 3) if clat is not None and "mean" in clat else None),
                **_percentiles(clat, clat_factor, source, f"{where}.{direction}.clat"),
                "error": error, "fio_version": version,
            }
            rows.append({column: row.get(column) for column in FIO_COLUMNS})
        if not moved and error:
            # A job that failed before moving data is still a row, so the failure is visible.
            row = {"job": str(job["jobname"]), "direction": None, **options, "error": error, "fio_version": version}
            rows.append({column: row.get(column) for column in FIO_COLUMNS})
    if not rows:
        raise ParseError(source, "no job moved any data")
    return rows


def parse_fio_json(path: Path) -> list[dict[str, Any]]:
    """Rows of the fio JSON file at ``path`` (see :func:`parse_fio_text`)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ParseError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    return parse_fio_text(text, str(path))


def summarize(rows: Iterable[Mapping[str, Any]], direction: str = "read") -> dict[str, Any]:
    """Totals of one direction over all rows: bandwidths and IOPS add up, latencies are the
    IOPS-weighted mean of the rows' percentiles (exact with ``group_reporting``, one row).
    Empty when no row moved data in that direction."""
    chosen = [r for r in rows if r.get("direction") == direction and r.get("bw_bytes") is not None]
    if not chosen:
        return {}
    out: dict[str, Any] = {
        "bw_bytes": sum(int(r["bw_bytes"]) for r in chosen),
        "iops": round(sum(float(r["iops"]) for r in chosen), 3),
        "io_bytes": sum(int(r["io_bytes"]) for r in chosen),
        "runtime_ms": max(int(r["runtime_ms"]) for r in chosen),
        "jobs": len(chosen),
    }
    weights = [float(r["iops"]) or 1.0 for r in chosen]
    for column in ("lat_mean_us", "clat_mean_us", *(f"clat_{s}_us" for s in PERCENTILES.values())):
        pairs = [(float(r[column]), w) for r, w in zip(chosen, weights, strict=True) if r.get(column) is not None]
        if pairs:
            out[column] = round(sum(v * w for v, w in pairs) / sum(w for _, w in pairs), 3)
    return out
