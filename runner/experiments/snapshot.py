"""``snapshot``: restore a started engine instead of starting it (CRIU, cuda-checkpoint, vllm snapshot).

The reference campaign never got a number: both of its routes stopped at a CRIU without its CUDA plugin. Here
every precondition is a gate checked on the node before anything runs (a skip with a reason a
user can act on), and every failure of the tools is recognised from their own logs
(``runner.parse.snapshot_logs``) and recorded as the trial's reason with the log tail. Phases:
``prepare`` (gates, launch file), ``measure`` (``nodetools.snapshot``), ``collect`` (always).
The report section is ``runner.experiments.snapshot_report``; the refusals that need no node
(``--plan``) are ``runner.experiments.snapshot_checks``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from nodetools.snapshot.criu_node import DEFAULT_FLAGS, RESERVED_FLAGS
from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.experiments.launch import engine_launch, vllm_arg
from runner.experiments.node_plan import (
    NodePlan,
    cleanup_argv,
    launch_spec,
    make_model_argv,
    node_wait_s,
    reap_argv,
    to_json,
)
from runner.experiments.snapshot_checks import plan_checks
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


class _Params(ModeParams):
    cuda_checkpoint: str = Field(default="cuda-checkpoint", min_length=1,
                                 description="NVIDIA's cuda-checkpoint or the path of cuda_checkpoint_api.py; in the "
                                             "criu mode the one CRIU's CUDA plugin runs")
    poll_s: float = Field(default=0.05, gt=0, le=1.0)


class CudaCheckpointParams(_Params):
    """In place: the GPU state to host RAM and back, the process alive throughout."""


class _CriuParams(_Params):
    criu: str = Field(default="criu", min_length=1, description="CRIU binary on the node (>= 4.1)")
    libdir: str = Field(default="", description="CRIU plugin folder (-L); default: CRIU_LIBS_DIR or its PLUGINDIR")
    images_dir: str = Field(default="", pattern=r"^(/.*)?$",
                            description="where images go (default: the trial's node-side folder); tmpfs allowed, "
                                        "recorded as such")


class VllmSnapshotParams(_CriuParams):
    revision: str = Field(default="", description="the model's 40-character revision")


class CriuParams(_CriuParams):
    network_lock: Literal["auto", "iptables", "nftables", "skip"] = Field(
        default="auto", description="CRIU's --network-lock; auto: iptables where iptables and iptables-restore "
                                    "are on the PATH, else nftables where CRIU can, else skip")
    criu_flags: tuple[str, ...] = Field(default=DEFAULT_FLAGS, description="dump and restore flags (restore adds -d)")
    restore_cache: tuple[Literal["dropped", "warm"], ...] = Field(
        default=("dropped",), min_length=1, max_length=2,
        description="one restore per page-cache state of the image, in this order, from the same dump")
    lazy_pages: bool = Field(default=False, description="restore with criu lazy-pages: memory on demand")
    disable_io_uring: bool = Field(default=True, description="kernel.io_uring_disabled=2 for the engine's life")
    answers: int = Field(default=3, ge=0, le=20, description="timed answers before the dump and after each restore")
    keep_images: bool = Field(default=False, description="leave the images on the node (removed by default: tens "
                                                         "of GB a trial)")
    disk_read_gb_s: float | None = Field(default=None, gt=0, description="the disk's read rate (GB/s) for the "
                                                                         "report's expected restore; else storage.csv")
    h2d_gb_s: float | None = Field(default=None, gt=0, description="host-to-GPU rate (GB/s) for the expected "
                                                                   "restore; else this campaign's cuda_checkpoint")

    @field_validator("criu_flags")
    @classmethod
    def _flags(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        for flag in flags:
            name = flag.split("=", 1)[0]
            if not flag.startswith("-"):
                raise ValueError(f"{flag!r} is not a flag (starts with '-')")
            if name in RESERVED_FLAGS or (name.startswith("-v") and name[2:].isdigit()):
                raise ValueError(f"{flag!r} is set by the tool (network_lock, lazy_pages, images_dir, libdir)")
        return flags

    @field_validator("restore_cache")
    @classmethod
    def _distinct(cls, states: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(states)) != len(states):
            raise ValueError("each page-cache state once")
        return states


COLLECT_FILES = ("server.log", "timings.json", "launch.json", "dump.log", "restore-dropped.log", "restore-warm.log",
                 "lazy-pages-dropped.log", "lazy-pages-warm.log", "snapshot-create.log", "snapshot-restore.log")


def _tool_options(mode: str, params: dict[str, Any]) -> list[str]:
    """The options ``nodetools.snapshot gates`` and ``measure`` share, as the mode's parameters set them."""
    argv = ["--mode", mode, "--cuda-checkpoint", params["cuda_checkpoint"]]
    if "criu" in params:  # the modes that run CRIU
        argv += ["--criu", params["criu"], "--libdir", params["libdir"]]
    if "revision" in params:
        argv += ["--revision", params["revision"]]
    if mode == "criu":
        argv += ["--network-lock", params["network_lock"], "--criu-flags", to_json(list(params["criu_flags"]))]
        argv += ["--lazy-pages"] if params["lazy_pages"] else []
        argv += [] if params["disable_io_uring"] else ["--keep-io-uring"]
    return argv


def _node_plan(ctx: TrialContext) -> NodePlan:
    """The engine's launch (its persistent caches) and the node programs of the three phases."""
    engine, params, paths = ctx.engine, dict(ctx.params), ctx.node_paths()
    cleanup = {"cleanup": cleanup_argv(paths, engine["port"])}
    if ctx.mode == "vllm_snapshot" and engine["kind"] == "stand-in":
        return NodePlan(skip="the stand-in has no vllm snapshot command: this mode needs vLLM",
                        commands={"reap": reap_argv(paths), **cleanup}, files=COLLECT_FILES)
    launch = engine_launch(engine, paths.container, engine["cache_root"], engine["model_cache"], {}, paths.python)
    spec = launch_spec(launch, engine)
    images = params.get("images_dir") or paths.file("images")
    tool = [paths.python, "-m", "nodetools.snapshot"]
    gates = [*tool, "gates", *_tool_options(ctx.mode, params), "--gpus", ",".join(str(g) for g in engine["gpus"]),
             "--tp", str(vllm_arg(engine["args"], "tensor-parallel-size")), "--model", engine["model"],
             "--launch-json", to_json(spec),
             "--gpu-memory-fraction", str(vllm_arg(engine["args"], "gpu-memory-utilization"))]
    if ctx.mode == "criu":
        gates += ["--images", images]
    measure = [*tool, "measure", *_tool_options(ctx.mode, params), "--launch", paths.file("launch.json"),
               "--log", paths.file("server.log"), "--out", paths.file("timings.json"), "--images", images,
               "--poll-s", str(params["poll_s"]), "--timeout-s", str(node_wait_s(ctx.timeout_s)),
               "--trial", ctx.trial_id, "--lease-dir", paths.lease_dir]
    if ctx.mode == "criu":
        measure += ["--restore-cache", ",".join(params["restore_cache"]), "--answers", str(params["answers"])]
        measure += ["--keep-images"] if params["keep_images"] else []
    return NodePlan(launch=spec, files=COLLECT_FILES, commands={
        "reap": reap_argv(paths),
        "make_model": make_model_argv(paths, engine),
        "preflight": [paths.python, "-m", "nodetools.preflight", "--port", str(engine["port"]),
                      "--gpus", ",".join(str(g) for g in engine["gpus"])],
        "gates": gates,
        "prepare": [paths.python, "-m", "nodetools.coldstart", "prepare", "--dir", paths.work_dir,
                    "--launch-json", to_json(spec), "--page-cache", "keep"],
        "measure": measure,
        **cleanup,
    })


def _resources(ctx: TrialContext) -> Resources:
    # Dumps share /dev/shm, freeze whole process trees and drop the page cache: the node is the trial's.
    return Resources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True)


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


_TIMINGS = ("first_token_s", "dump_s", "restore_s", "restore_to_first_token_s", "lock_s", "checkpoint_s",
            "unlock_s", "create_s", "image_bytes", "artifact_bytes", "port_free_after_dump", "restored_pid_same")


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


def _criu_metrics(raw: Path, timings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    restores = timings.get("restores") or []
    phases: list[dict[str, float]] = []
    for record in restores:  # one per page-cache state, from the same image
        cache = record["cache"]
        out[f"restore_{cache}_s"] = record.get("restore_s")
        out[f"restore_{cache}_to_first_token_s"] = record.get("restore_to_first_token_s")
        out[f"lazy_pages_done_{cache}_s"] = record.get("lazy_pages_done_s")
        log = raw / f"restore-{cache}.log"
        phases.append(restore_phases(log.read_text(errors="replace")) if log.is_file() else {})
        # How fast CRIU read this restore's pages in, whatever held them (disk, page cache, RAM).
        out[f"restore_{cache}_pages_gb_s"] = phases[-1].get("restore_pages_gb_s")
    if restores:
        first = restores[0]
        out["restore_cache"] = first["cache"]
        out["image_resident_fraction"] = first.get("image_resident_fraction")
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
    return {k: v for k, v in out.items() if v is not None}


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
    if ctx.mode == "criu":
        metrics.update(_criu_metrics(raw, timings))
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
    plan_checks=plan_checks,
    collect=_collect,
    diagnose=_diagnose,
    node_plan=_node_plan,
    needs_engine=True,
    report=KindReport("snapshot.csv", rows, section),
)
