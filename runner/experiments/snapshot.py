"""``snapshot``: restore a started engine instead of starting it (CRIU, cuda-checkpoint, vllm snapshot).

The reference campaign never got a number: both of its routes stopped at a CRIU without its CUDA plugin. Here
every precondition is a gate checked on the node before anything runs (a skip with a reason a
user can act on), and every failure of the tools is recognised from their own logs
(``runner.parse.snapshot_logs``) and recorded as the trial's reason with the log tail. Phases:
``prepare`` (gates, launch file), ``measure`` (``nodetools.snapshot``), ``collect`` (always).
The modes' parameters are ``snapshot_params``, what a trial runs on its node and what its own
settings refuse ``snapshot_plan`` (a vllm_snapshot trial's refusals, from cached facts,
``snapshot_checks``), a restore's physical limit ``snapshot_limits``, the report section
``snapshot_report``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from runner.experiments import snapshot_checks, snapshot_plan
from runner.experiments.base import ExperimentKind, KindReport, Phase, Resources, TrialContext
from runner.experiments.limits import host_limits
from runner.experiments.snapshot_limits import restore_limit
from runner.experiments.snapshot_params import CriuParams, CudaCheckpointParams, VllmSnapshotParams
from runner.experiments.snapshot_plan import node_plan
from runner.experiments.snapshot_report import rows, section
from runner.parse.snapshot_logs import (
    classify,
    cuda_plugin_use,
    explain,
    last_error_lines,
    lazy_pages_stats,
    restore_phases,
)

__all__ = ["KIND", "CriuParams", "CudaCheckpointParams", "VllmSnapshotParams"]

PLAYBOOKS = "playbooks/experiments/snapshot"


def _plan_checks(ctx: TrialContext) -> list[str]:
    """What needs no node: an engine that sleeps first moves only what its sleep keeps (a level-2
    sleep vLLM cannot reload is refused); one that does not, its GPU memory against the node's RAM
    and the images' filesystem in all, with the remedy named."""
    quiesce = ctx.params.get("quiesce", "none")
    if quiesce != "none":
        return snapshot_plan.plan_checks(ctx)
    hint = "; quiesce the engine first (quiesce: sleep)" if ctx.mode in ("criu", "cuda_checkpoint") else ""
    return [f"quiesce none: {reason}{hint}" if hint else reason for reason in snapshot_checks.plan_checks(ctx)]


def _resources(ctx: TrialContext) -> Resources:
    # Dumps share /dev/shm, freeze whole process trees and drop the page cache: the node is the trial's.
    return Resources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True)


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


_TIMINGS = ("first_token_s", "dump_s", "restore_s", "restore_to_first_token_s", "lock_s", "checkpoint_s",
            "unlock_s", "create_s", "image_bytes", "artifact_bytes", "port_free_after_dump", "restored_pid_same",
            "wake_s", "reload_s")
# Where a restore's seconds to its first token went, in the order the chart stacks them.
STAGES = ("staging", "CRIU memfds", "CRIU pages", "CRIU rest", "GPU restore", "wake", "weights reload", "first answer")


def _median(values: list[Any]) -> float | None:
    numbers = [v for v in values or [] if isinstance(v, (int, float))]
    return round(statistics.median(numbers), 4) if numbers else None


def _tool(timings: dict[str, Any]) -> str | None:
    tool = timings.get("cuda_checkpoint_tool")
    if not isinstance(tool, dict):
        return None
    if not tool.get("tool"):
        return f"none ({tool.get('source')})"
    return " ".join(str(p) for p in (tool["tool"], tool.get("version")) if p)


def _stages(record: dict[str, Any], phases: dict[str, float]) -> dict[str, float] | None:
    """One restore's seconds by stage: the staging copy, CRIU copying the memfds in (a level-1 sleep's
    pinned weights) and reading the private pages in, the rest of CRIU's restore, the CUDA plugin's
    GPU part, the wake and a level-2 reload, then the first answer."""
    restore, token = record.get("restore_s"), record.get("restore_to_first_token_s")
    if not isinstance(restore, int | float) or not isinstance(token, int | float):
        return None
    pages, gpu = phases.get("restore_pages_s", 0.0), phases.get("restore_gpu_s", 0.0)
    memfd = phases.get("restore_memfd_s", 0.0)
    wake, reload = float(record.get("wake_s") or 0.0), float(record.get("reload_s") or 0.0)
    seconds = {"staging": float(record.get("stage_s") or 0.0), "CRIU memfds": memfd, "CRIU pages": pages,
               "CRIU rest": max(0.0, restore - memfd - pages - gpu), "GPU restore": gpu, "wake": wake,
               "weights reload": reload, "first answer": max(0.0, token - restore - wake - reload)}
    return {name: round(seconds[name], 4) for name in STAGES}


def _kernel_memory(restore: dict[str, Any]) -> dict[str, Any]:
    """How the first restore's pages came in (/proc/vmstat across CRIU's restore call: faults, huge-page
    faults and fallbacks, shared-memory huge pages) and the THP settings it ran under."""
    vmstat, thp = restore.get("vmstat") or {}, restore.get("thp") or {}
    out: dict[str, Any] = {f"restore_{key}": vmstat.get(key) for key in
                           ("pgfault", "pgmajfault", "thp_fault_alloc", "thp_fault_fallback", "thp_file_alloc")}
    out["thp_enabled"], out["thp_shmem_enabled"] = thp.get("enabled"), thp.get("shmem_enabled")
    return out


def _criu_metrics(raw: Path, timings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    restores = timings.get("restores") or []
    phases: list[dict[str, float]] = []
    stages = []
    for record in restores:  # one per page-cache state, from the same image
        cache = record["cache"]
        out[f"restore_{cache}_s"] = record.get("restore_s")
        out[f"restore_{cache}_to_first_token_s"] = record.get("restore_to_first_token_s")
        out[f"lazy_pages_done_{cache}_s"] = record.get("lazy_pages_done_s")
        log = raw / f"restore-{cache}.log"
        phases.append(restore_phases(log.read_text(errors="replace")) if log.is_file() else {})
        # How fast CRIU read this restore's pages in, whatever held them (disk, page cache, RAM).
        out[f"restore_{cache}_pages_gb_s"] = phases[-1].get("restore_pages_gb_s")
        if (seconds := _stages(record, phases[-1])) is not None:
            stages.append({"cache": cache, "image_source": record.get("image_source"), "stages": seconds})
    if stages:
        out["restore_stages"] = stages  # a structure: for the report's chart, never a summary column
    if restores:
        first = restores[0]
        out["restore_cache"] = first["cache"]
        for key in ("image_source", "stage_s", "wake_s", "reload_s"):
            out[key] = first.get(key)
        out["image_resident_fraction"] = first.get("image_resident_fraction")
        out.update(_kernel_memory(first))
        out["answer_after_restore_s"] = _median(first.get("answers_s") or [])
        out["first_answer_after_restore_s"] = (first.get("answers_s") or [None])[0]
        if "first_token_before_image_read" in first:
            out["first_token_before_image_read"] = first["first_token_before_image_read"]
        out.update(phases[0])
        lazy = raw / f"lazy-pages-{first['cache']}.log"
        if lazy.is_file():
            out.update(lazy_pages_stats(lazy.read_text(errors="replace")))
    dump_log = raw / "dump.log"
    out["cuda_plugin"] = cuda_plugin_use(dump_log.read_text(errors="replace")) if dump_log.is_file() else None
    out["answer_before_dump_s"] = _median(timings.get("answers_before_dump_s") or [])
    out["images_fs"] = (timings.get("images_dir") or {}).get("fs_type")
    out["network_lock"] = (timings.get("network_lock") or {}).get("method")
    io_uring = timings.get("io_uring") or {}
    out["io_uring_disabled"] = (io_uring.get("during_engine") or ("left alone" if io_uring.get("left_alone")
                                else "unavailable" if io_uring.get("available") is False else None))
    out["lazy_pages"] = timings.get("lazy_pages")
    before, after = sum(timings.get("gpu_mem_mib_before") or []), sum(timings.get("gpu_mem_mib_after_dump") or [])
    if before:
        out["gpu_gib"] = round(max(0, before - after) / 1024, 3)
    criu = timings.get("criu") or {}
    if criu.get("version"):  # a development build names its commit
        out["criu_version"] = criu["version"] + (f" ({criu['gitid']})" if criu.get("gitid") else "")
    out["thp"] = (timings.get("thp") or {}).get("asked")
    return {k: v for k, v in out.items() if v is not None}


def _quiesce_metrics(timings: dict[str, Any]) -> dict[str, Any]:
    """The sleep before the snapshot: its seconds, the host memory it took, the GPU memory awake and asleep."""
    record = timings.get("quiesce") or {}
    out: dict[str, Any] = {"quiesce": record.get("asked") or "none"}
    if "sleep_s" in record:
        out["sleep_s"] = record["sleep_s"]
    if isinstance(record.get("sleep_host_bytes"), int):
        out["sleep_host_gib"] = round(record["sleep_host_bytes"] / 2**30, 3)
    for key in ("gpu_mem_mib_awake", "gpu_mem_mib_asleep"):
        if record.get(key):
            out[key] = sum(record[key])
    return out


def _collect(ctx: TrialContext) -> dict[str, Any]:
    raw = _raw(ctx)
    timings = json.loads((raw / "timings.json").read_text())
    metrics: dict[str, Any] = {k: timings[k] for k in _TIMINGS if timings.get(k) is not None}
    for key in ("image_bytes", "artifact_bytes"):
        if key in metrics:
            metrics[key.replace("_bytes", "_gib")] = round(metrics.pop(key) / 2**30, 3)
    for key in ("gpu_mem_mib_before", "gpu_mem_mib_while", "gpu_mem_mib_after"):
        if timings.get(key):
            metrics[key] = sum(timings[key])
    if ctx.mode in ("criu", "cuda_checkpoint"):
        metrics.update(_quiesce_metrics(timings))
    if ctx.mode == "criu":
        metrics.update(_criu_metrics(raw, timings))
        # The trial's folder is trials/<id>/ of the results: the host's storage trials give its rates.
        root = ctx.trial_dir.parent.parent if ctx.trial_dir is not None else None
        metrics.update(restore_limit(metrics, ctx.params, host_limits(root, ctx.host) if root else None))
    tool = _tool(timings)
    if str(metrics.get("cuda_plugin", "")).startswith("disabled") or metrics.get("cuda_plugin") == "idle":
        tool = "none acted"  # the plugin's column says why; timings.json names what is on the PATH
    if tool:
        metrics["cuda_checkpoint_tool"] = tool
    if metrics.get("first_token_s") and metrics.get("restore_to_first_token_s"):
        metrics["speedup_vs_start"] = round(metrics["first_token_s"] / metrics["restore_to_first_token_s"], 1)
    return metrics


_LOGS = ("dump.log", "restore-dropped.log", "restore-warm.log", "lazy-pages-dropped.log", "lazy-pages-warm.log",
         "snapshot-create.log", "snapshot-restore.log", "server.log")


def _diagnose(ctx: TrialContext) -> str:
    """The labels of the failed step's log (the one the tool's error names, else every log) and its tail."""
    raw = _raw(ctx)
    timings = raw / "timings.json"
    error = str(json.loads(timings.read_text()).get("error", "")) if timings.is_file() else ""
    named = re.search(r"\(see ([\w.-]+\.log)\)", error)
    logs = [raw / named.group(1)] if named else sorted(raw.glob("*.log"))
    texts = [p.read_text(errors="replace") for p in logs if p.is_file()]
    labels = classify("\n".join([*texts, error]))
    parts = [explain(labels)] if labels else []
    for name in ([named.group(1)] if named else []) + list(_LOGS):
        tail = last_error_lines(raw / name)
        if tail:
            parts.append(f"{name} tail: " + " | ".join(tail))
            break
    return "; ".join(parts)


KIND = ExperimentKind(
    name="snapshot",
    doc="docs/snapshot.md",
    summary="dump and restore a started engine: CRIU, cuda-checkpoint, vllm snapshot",
    phases=(
        Phase("prepare", f"{PLAYBOOKS}/prepare.yml", waits_for_turn=True),
        Phase("measure", f"{PLAYBOOKS}/measure.yml", follow="server.log"),
        Phase("collect", f"{PLAYBOOKS}/collect.yml", always=True),
    ),
    modes={"criu": CriuParams, "cuda_checkpoint": CudaCheckpointParams, "vllm_snapshot": VllmSnapshotParams},
    default_modes=("criu", "cuda_checkpoint", "vllm_snapshot"),
    resources=_resources,
    collect=_collect,
    diagnose=_diagnose,
    plan_checks=_plan_checks,
    node_plan=node_plan,
    needs_engine=True,
    report=KindReport("snapshot.csv", rows, section),
)
