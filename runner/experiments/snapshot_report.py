"""The snapshot experiment's rows (``snapshot.csv``) and report section.

Three tables: every trial's figures; a CRIU restore from disk against what the node's rates
predict, ``image bytes / disk read rate + GPU bytes / host-to-GPU rate`` (the disk rate from the
mode's ``disk_read_gb_s``, else the host's ``storage`` trials in the same results folder, buffered
reads first; the host-to-GPU rate from ``h2d_gb_s``, else the host's measured pinned copy
(``storage`` mode ``h2d_copy``), else this campaign's in-place cuda-checkpoint restores, GPU bytes
moved over their seconds); and every path back to a serving engine side by side (cold and
cached starts and the wake from sleep from ``startup.csv`` of the same results folder, the
in-place cuda-checkpoint restore, the CRIU restores), medians over the repeats that finished ok.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.experiments.limits import NodeLimits, node_limits
from runner.markdown import markdown_table
from runner.records import TrialRecord

__all__ = ["COLUMNS", "rows", "section"]

GB = 1e9  # rates are decimal GB/s, as fio and the reference campaign quote them
GIB = 2**30

COLUMNS = ("first_token_s", "dump_s", "image_gib", "gpu_gib", "images_fs", "restore_cache", "restore_s",
           "restore_to_first_token_s", "restore_dropped_s", "restore_dropped_to_first_token_s", "restore_warm_s",
           "restore_warm_to_first_token_s", "restore_gpu_s", "restore_pages_gib", "restore_pages_s",
           "restore_dropped_pages_gb_s", "restore_warm_pages_gb_s", "image_resident_fraction", "port_free_after_dump",
           "speedup_vs_start", "answer_before_dump_s", "first_answer_after_restore_s", "answer_after_restore_s",
           "lazy_pages", "lazy_pages_done_dropped_s", "lazy_pages_done_warm_s", "first_token_before_image_read",
           "lazy_page_faults", "network_lock", "io_uring_disabled", "cuda_plugin", "cuda_checkpoint_tool", "lock_s",
           "checkpoint_s", "unlock_s", "gpu_mem_mib_before", "gpu_mem_mib_while", "gpu_mem_mib_after", "create_s",
           "artifact_gib")
_TIMES = ("first_token_s", "dump_s", "image_gib", "images_fs", "restore_s", "restore_dropped_s", "restore_warm_s",
          "restore_to_first_token_s", "speedup_vs_start", "lock_s", "checkpoint_s", "unlock_s", "gpu_mem_mib_before",
          "gpu_mem_mib_while", "gpu_mem_mib_after", "create_s", "artifact_gib")
_SETTINGS = ("network_lock", "io_uring_disabled", "cuda_plugin", "cuda_checkpoint_tool", "port_free_after_dump",
             "restore_gpu_s", "restore_pages_s", "restore_dropped_pages_gb_s", "restore_warm_pages_gb_s",
             "image_resident_fraction", "answer_before_dump_s", "first_answer_after_restore_s",
             "answer_after_restore_s", "lazy_pages_done_dropped_s", "first_token_before_image_read",
             "lazy_page_faults")
_STARTS = {"first_start": "cold start (empty caches)", "disk_cold": "start with persisted caches",
           "page_cache_warm": "start with persisted caches, weights in page cache",
           "enforce_eager": "start, --enforce-eager", "fresh_container": "start in a fresh container"}


def rows(record: TrialRecord) -> list[dict[str, Any]]:
    metrics = record.get("metrics") or {}
    params = record.get("params") or {}
    args = (record.get("engine") or {}).get("args") or {}
    return [{"experiment": record.get("experiment"), "gpu_memory_utilization": args.get("gpu-memory-utilization"),
             **{k: metrics.get(k) for k in COLUMNS},
             "disk_read_gb_s": params.get("disk_read_gb_s"), "h2d_gb_s": params.get("h2d_gb_s")}]


def _num(frame: Any, col: str) -> Any:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    return pd.to_numeric(frame[col], errors="coerce") if col in frame.columns else pd.Series(dtype=float)


def _median(frame: Any, col: str) -> float | None:
    values = _num(frame, col).dropna()
    return round(float(values.median()), 3) if len(values) else None


def _with_data(frame: Any, cols: tuple[str, ...]) -> list[str]:
    return [c for c in cols if c in frame.columns and frame[c].notna().any()]


def _disk_rate(limits: NodeLimits | None) -> tuple[float | None, str]:
    rate = limits.disk_read() if limits else None
    return (rate.gb_s, f"storage: {rate.source}") if rate else (None, "")


def _copy_rate(limits: NodeLimits | None) -> tuple[float | None, str]:
    rate = limits.copy("h2d", "pinned") if limits else None
    return (rate.gb_s, f"storage: {rate.source}") if rate else (None, "")


def _h2d_rate(ok: Any) -> tuple[float | None, str]:
    ck = ok[ok["mode"] == "cuda_checkpoint"]
    moved = (_num(ck, "gpu_mem_mib_before") - _num(ck, "gpu_mem_mib_while")) * 2**20 / GB
    rates = (moved / _num(ck, "restore_s")).dropna()
    rates = rates[rates > 0]
    return (round(float(rates.median()), 3), "cuda_checkpoint restore") if len(rates) else (None, "")


def _expected(ok: Any, root: Path) -> list[dict[str, Any]]:
    """Per experiment: the CRIU restore from disk against image / disk rate + GPU bytes / host-to-GPU rate."""
    limits = node_limits(root)
    h2d_restores, h2d_restores_source = _h2d_rate(ok)
    out = []
    criu = ok[(ok["mode"] == "criu") & _num(ok, "restore_dropped_s").notna()]
    for experiment, group in criu.groupby("experiment", sort=False):
        host = limits.get(str(group["host"].iloc[0])) if "host" in group.columns else None
        disk_campaign, disk_source = _disk_rate(host)
        h2d_campaign, h2d_source = _copy_rate(host)
        if h2d_campaign is None:
            h2d_campaign, h2d_source = h2d_restores, h2d_restores_source
        in_ram = str(group["images_fs"].iloc[0]) in ("tmpfs", "ramfs")
        disk = _median(group, "disk_read_gb_s") or disk_campaign
        h2d = _median(group, "h2d_gb_s") or h2d_campaign
        image, gpu = _median(group, "image_gib"), _median(group, "gpu_gib") or 0.0
        expected = None  # on tmpfs only the GPU term is modelled (reading RAM is not the limit)
        if image is not None and (disk or in_ram) and (h2d or not gpu) and (gpu or not in_ram):
            expected = round((0 if in_ram else image * GIB / GB / disk) + (gpu * GIB / GB / h2d if gpu else 0), 2)
        measured = _median(group, "restore_dropped_s")
        gpu_part, pages_part = _median(group, "restore_gpu_s"), _median(group, "restore_pages_s")
        out.append({
            "experiment": experiment, "image_gib": image, "gpu_gib": gpu, "images_fs": group["images_fs"].iloc[0],
            "disk_gb_s": "in RAM" if in_ram else disk,
            "disk_rate_from": "" if in_ram else ("mode parameter" if _median(group, "disk_read_gb_s") else disk_source),
            "h2d_gb_s": h2d, "h2d_rate_from": "mode parameter" if _median(group, "h2d_gb_s") else h2d_source,
            "expected_restore_s": expected, "measured_restore_s": measured,
            "measured_over_expected": round(measured / expected, 2) if expected and measured else None,
            "gpu_part_from_log_s": gpu_part,
            # What CRIU's log itself accounts for: its restorer reading the pages in, then the plugin.
            "pages_part_from_log_s": pages_part,
            "criu_page_read_gb_s": _median(group, "restore_dropped_pages_gb_s"),
            "log_explains_s": round(pages_part + gpu_part, 3) if pages_part is not None and gpu_part is not None
            else None})
    return out


def _side_by_side(ok: Any, root: Path) -> list[dict[str, Any]]:
    import pandas as pd  # noqa: PLC0415

    side: list[dict[str, Any]] = []

    def add(path: str, experiment: str, frame: Any, col: str) -> None:
        values = _num(frame, col).dropna()
        if len(values):
            side.append({"path to a serving engine": path, "experiment": experiment,
                         "seconds to first token": round(float(values.median()), 3), "repeats": len(values)})

    startup = root / "startup.csv"
    if startup.is_file():
        s = pd.read_csv(startup)
        s = s[s["status"] == "ok"]
        s = s.assign(experiment=s["trial_id"].str.split(".").str[0])
        for (experiment, mode), group in s.groupby(["experiment", "mode"], sort=False):
            if mode == "sleep_wake":
                add("wake from sleep", experiment, group, "wake_to_first_token_s")
            else:
                add(_STARTS.get(str(mode), f"start ({mode})"), experiment, group, "first_token_s")
    for experiment, group in ok.groupby("experiment", sort=False):
        add("in-place cuda-checkpoint restore (GPU state kept in host RAM)", experiment,
            group[group["mode"] == "cuda_checkpoint"], "restore_to_first_token_s")
        criu = group[group["mode"] == "criu"]
        lazy = " (lazy pages)" if criu["lazy_pages"].fillna(False).astype(bool).any() else ""
        if criu["images_fs"].isin(["tmpfs", "ramfs"]).any():  # RAM: no page cache to drop
            add(f"CRIU restore from tmpfs{lazy}", experiment, criu, "restore_to_first_token_s")
        else:
            add(f"CRIU restore from disk{lazy}, page cache dropped", experiment, criu,
                "restore_dropped_to_first_token_s")
            add(f"CRIU restore{lazy}, image in page cache", experiment, criu, "restore_warm_to_first_token_s")
        add("vllm snapshot restore", experiment, group[group["mode"] == "vllm_snapshot"], "restore_to_first_token_s")
    return side


def section(frame: Any, root: Path) -> str:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    lines = ["\n## Snapshot: restore a started engine instead of starting it\n",
             "Failed and skipped modes stay rows with their reasons, never zero-second results. Restores of one "
             "trial come from the same dump: `restore_dropped_s` with the node's page cache dropped first, "
             "`restore_warm_s` with the image read into it (on tmpfs the image is RAM either way).\n"]
    lines.append(markdown_table(frame[["experiment", "mode", "repeat", "status", *_with_data(frame, _TIMES)]]))
    ok = frame[frame["status"] == "ok"]
    settings = _with_data(ok, _SETTINGS)
    if len(ok) and settings:
        lines.append("\nWhat acted, and what the restored engine did next (answers: seconds for "
                     "16-token completions; lazy pages: when the whole image had been read):\n")
        lines.append(markdown_table(ok[["experiment", "mode", "repeat", *settings]]))
    expected = _expected(ok, root) if len(ok) else []
    if expected:
        lines.append("\nCRIU restore from its images against the node's rates: expected = image / disk read rate + "
                     "GPU memory / host-to-GPU rate (medians; the disk rate from `disk_read_gb_s` or a storage "
                     "trial of this campaign, the host-to-GPU rate from `h2d_gb_s` or this campaign's "
                     "cuda_checkpoint restores; a rate neither gives leaves the expectation empty). CRIU's own log "
                     "splits the measured restore: its restorer reading the pages into the processes' memory "
                     "(`pages_part_from_log_s`, at `criu_page_read_gb_s`: where that rate is near the same from "
                     "disk, page cache and tmpfs, CRIU's page restore is the limit, not the disk) and the CUDA "
                     "plugin's GPU part:\n")
        lines.append(markdown_table(pd.DataFrame(expected)))
    side = _side_by_side(ok, root) if len(ok) else []
    if side:
        lines.append("\nEvery path back to a serving engine (medians of this campaign's repeats):\n")
        lines.append(markdown_table(pd.DataFrame(side)))
    not_ok = frame[frame["status"] != "ok"]
    if len(not_ok):
        lines.append("\nNot ok:\n")
        lines += [f"- `{r.trial_id}` {r.status}: {r.reason}" for r in not_ok.itertuples()]
    return "\n".join(lines) + "\n"
