"""The snapshot experiment's rows (``snapshot.csv``) and report section.

The tables: every trial's figures; what acted and what the restored engine did next; every CRIU
restore beside its physical limit (``snapshot_limits``: image bytes / the read rate of where it
read the image + GPU bytes / the pinned host-to-GPU rate), beside the campaign's warm start of the
same engine, and the reference figures beside the engines they compare with
(``snapshot_reference``); and every path back to a serving engine side by side (cold and cached
starts and the wake from sleep from ``startup.csv`` of the same results folder, the in-place
cuda-checkpoint restore, the CRIU restores), medians over the repeats that finished ok. One
chart, ``snapshot_restore.png``: a bar per restore, stacked by stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.experiments.snapshot_reference import limits_table, reference_lines, restore_bars, warm_start
from runner.markdown import markdown_table
from runner.records import TrialRecord

__all__ = ["COLUMNS", "rows", "section"]

COLUMNS = ("quiesce", "criu_version", "first_token_s", "dump_s", "image_gib", "gpu_gib", "images_fs", "image_source",
           "restore_cache", "stage_s", "restore_s", "wake_s", "reload_s", "restore_to_first_token_s", "limit_s",
           "restore_dropped_s", "restore_dropped_to_first_token_s", "restore_warm_s", "restore_warm_to_first_token_s",
           "restore_gpu_s", "restore_gpu_resume_s", "restore_gpu_processes", "restore_pages_gib", "restore_pages_s",
           "restore_dropped_pages_gb_s", "restore_warm_pages_gb_s", "restore_memfd_gib", "restore_memfd_s",
           "restore_memfd_gb_s", "restore_memfd_threads", "thp", "thp_enabled", "thp_shmem_enabled", "restore_pgfault",
           "restore_pgmajfault", "restore_thp_fault_alloc", "restore_thp_fault_fallback", "restore_thp_file_alloc",
           "image_resident_fraction", "port_free_after_dump", "speedup_vs_start",
           "sleep_s", "sleep_host_gib", "gpu_mem_mib_awake", "gpu_mem_mib_asleep", "answer_before_dump_s",
           "first_answer_after_restore_s", "answer_after_restore_s", "lazy_pages", "lazy_pages_done_dropped_s",
           "lazy_pages_done_warm_s", "first_token_before_image_read", "lazy_page_faults", "network_lock",
           "io_uring_disabled", "cuda_plugin", "cuda_checkpoint_tool", "lock_s", "checkpoint_s", "unlock_s",
           "gpu_mem_mib_before", "gpu_mem_mib_while", "gpu_mem_mib_after", "create_s", "artifact_gib",
           "limit_read_gb_s", "limit_read_from", "limit_gpu_gib", "limit_h2d_gb_s", "limit_h2d_from")
_TIMES = ("model", "quiesce", "first_token_s", "dump_s", "image_gib", "images_fs", "image_source", "stage_s",
          "restore_s", "wake_s", "reload_s", "restore_dropped_s", "restore_warm_s", "restore_to_first_token_s",
          "limit_s", "speedup_vs_start", "lock_s", "checkpoint_s", "unlock_s", "gpu_mem_mib_before",
          "gpu_mem_mib_while", "gpu_mem_mib_after", "create_s", "artifact_gib")
_SETTINGS = ("criu_version", "network_lock", "io_uring_disabled", "cuda_plugin", "cuda_checkpoint_tool",
             "port_free_after_dump", "sleep_s", "sleep_host_gib", "gpu_mem_mib_awake", "gpu_mem_mib_asleep",
             "restore_gpu_s", "restore_gpu_resume_s", "restore_gpu_processes", "restore_pages_s",
             "restore_dropped_pages_gb_s", "restore_warm_pages_gb_s",
             "restore_memfd_s", "restore_memfd_gb_s", "restore_memfd_threads", "thp", "thp_enabled",
             "thp_shmem_enabled", "restore_pgfault", "restore_thp_fault_alloc", "restore_thp_file_alloc",
             "image_resident_fraction", "answer_before_dump_s",
             "first_answer_after_restore_s",
             "answer_after_restore_s", "lazy_pages_done_dropped_s", "first_token_before_image_read",
             "lazy_page_faults")
_STARTS = {"first_start": "cold start (empty caches)", "disk_cold": "start with persisted caches",
           "page_cache_warm": "start with persisted caches, weights in page cache",
           "enforce_eager": "start, --enforce-eager", "fresh_container": "start in a fresh container"}


def _model(engine: dict[str, Any]) -> str | None:
    """The rehearsal preset, else the model as the campaign names it (a local folder by its last part)."""
    if engine.get("rehearsal_model"):
        return str(engine["rehearsal_model"])
    model = str(engine.get("model") or "")
    return (model.rstrip("/").rsplit("/", 1)[-1] if model.startswith("/") else model) or None


def rows(record: TrialRecord) -> list[dict[str, Any]]:
    metrics = record.get("metrics") or {}
    params = record.get("params") or {}
    engine = record.get("engine") or {}
    args = engine.get("args") or {}
    row = {"experiment": record.get("experiment"), "model": _model(engine),
           "gpu_memory_utilization": args.get("gpu-memory-utilization"), **{k: metrics.get(k) for k in COLUMNS},
           "disk_read_gb_s": params.get("disk_read_gb_s"), "h2d_gb_s": params.get("h2d_gb_s"),
           "_restores": metrics.get("restore_stages")}
    row["quiesce"] = row["quiesce"] or params.get("quiesce")  # a failed or skipped trial: what it asked
    if row["image_source"] is None and params.get("image_source") == "tmpfs":
        row["image_source"] = "tmpfs"
    return [row]


def _num(frame: Any, col: str) -> Any:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    return pd.to_numeric(frame[col], errors="coerce") if col in frame.columns else pd.Series(dtype=float)


def _with_data(frame: Any, cols: tuple[str, ...]) -> list[str]:
    return [c for c in cols if c in frame.columns and frame[c].notna().any()]


def _criu_label(quiesce: Any, source: Any, lazy: str) -> tuple[str, str]:
    """The side-by-side labels of a CRIU restore: from RAM, or from disk (page cache dropped / warm)."""
    asleep = f", engine asleep ({quiesce})" if quiesce not in (None, "none") else ""
    if source == "tmpfs":
        return f"CRIU restore from tmpfs{lazy}{asleep}", ""
    return (f"CRIU restore from disk{lazy}{asleep}, page cache dropped",
            f"CRIU restore{lazy}{asleep}, image in page cache")


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
        source = criu["image_source"].fillna(criu["images_fs"].map({"tmpfs": "tmpfs", "ramfs": "tmpfs"}))
        keys = [criu["quiesce"].fillna("none"), source.fillna("disk")]
        for (quiesce, where), sub in criu.groupby(keys, sort=False):
            dropped, warm = _criu_label(quiesce, where, lazy)
            if where == "tmpfs":  # RAM: no page cache to drop
                add(dropped, experiment, sub, "restore_to_first_token_s")
            else:
                add(dropped, experiment, sub, "restore_dropped_to_first_token_s")
                add(warm, experiment, sub, "restore_warm_to_first_token_s")
        add("vllm snapshot restore", experiment, group[group["mode"] == "vllm_snapshot"], "restore_to_first_token_s")
    return side


def _chart(ok: Any, root: Path) -> list[str]:
    from runner.report_charts import engine_note, restore_chart  # noqa: PLC0415 - matplotlib: only for a report

    bars = restore_bars(ok)
    chart = restore_chart(bars, root / "snapshot_restore.png", engine_note(ok, root)) if bars else None
    return [f"\n![every restore by stage]({chart.name})\n"] if chart else []


def section(frame: Any, root: Path) -> str:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    lines = ["\n## Snapshot: restore a started engine instead of starting it\n",
             "Failed and skipped modes stay rows with their reasons, never zero-second results. Restores of one "
             "trial come from the same dump: `restore_dropped_s` with the node's page cache dropped first, "
             "`restore_warm_s` with the image read into it (on tmpfs the image is RAM either way). `quiesce`: the "
             "engine was put to sleep before the dump (`sleep`: its KV pool freed, its weights in host memory; "
             "`sleep2`: the weights dropped too, reloaded after the wake) and woken after the restore (`wake_s`, "
             "inside `restore_to_first_token_s`); `stage_s`: the images copied into tmpfs before the restore, "
             "outside it.\n"]
    lines.append(markdown_table(frame[["experiment", "mode", "repeat", "status", *_with_data(frame, _TIMES)]]))
    ok = frame[frame["status"] == "ok"]
    settings = _with_data(ok, _SETTINGS)
    if len(ok) and settings:
        lines.append("\nWhat acted, and what the restored engine did next (answers: seconds for 16-token "
                     "completions; lazy pages: when the whole image had been read; sleep: the seconds it took, the "
                     "host memory it added to the engine's processes, the GPU memory before and after it):\n")
        lines.append(markdown_table(ok[["experiment", "mode", "repeat", *settings]]))
    limits = limits_table(ok, warm_start(root)) if len(ok) else []
    if limits:
        lines.append("\nEvery CRIU restore beside its physical limit (medians per experiment, quiesce and image "
                     "source): `limit_s` = image / the read rate of where the restore read it (`disk` with the page "
                     "cache dropped; `tmpfs`, staged or dumped there, reads RAM) + GPU bytes / the pinned host-to-GPU "
                     "rate (GPU bytes: what the engine held on the GPU at the dump, plus the weights a level-1 wake "
                     "copies back). The rates come from the mode's `disk_read_gb_s`, `tmpfs_read_gb_s` and `h2d_gb_s`, "
                     "else this campaign's storage trials; a rate neither gives leaves the limit empty. CRIU's own log "
                     "splits the restore: its page reader copying the memfds in (`memfd_part_from_log_s` at "
                     "`criu_memfd_gb_s`: a level-1 sleep's pinned weights, one memfd after another), its restorers "
                     "reading the private pages in (`pages_part_from_log_s`, the seconds inside their reads, at "
                     "`criu_page_read_gb_s`) and the CUDA plugin's GPU part, one process after another. "
                     "`warm_start_s`: this campaign's start of the engine with persisted caches (weights in page "
                     "cache where measured):\n")
        lines.append(markdown_table(pd.DataFrame(limits)))
    lines += reference_lines(ok)
    side = _side_by_side(ok, root) if len(ok) else []
    if side:
        lines.append("\nEvery path back to a serving engine (medians of this campaign's repeats):\n")
        lines.append(markdown_table(pd.DataFrame(side)))
    lines += _chart(ok, root) if len(ok) else []
    not_ok = frame[frame["status"] != "ok"]
    if len(not_ok):
        lines.append("\nNot ok:\n")
        lines += [f"- `{r.trial_id}` {r.status}: {r.reason}" for r in not_ok.itertuples()]
    return "\n".join(lines) + "\n"
