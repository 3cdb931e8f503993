"""What a snapshot trial runs on its node, and what its own settings refuse before anything starts.

``node_plan``: the engine's launch (with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``
when the mode quiesces it) and the argv of the three phases' node programs (``nodetools.snapshot
gates`` and ``measure``). ``plan_checks``: a level-2 sleep where vLLM 0.24.0 cannot reload the
weights, and an unquiesced engine whose image cannot fit the node (its GPU memory at its
``--gpu-memory-utilization``, against the node's RAM and the images folder's free space, from the
host's cached facts), each with its arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.experiments.base import TrialContext
from runner.experiments.launch import engine_arg, engine_launch, vllm_arg
from runner.experiments.node_plan import (
    NodePlan,
    cleanup_argv,
    launch_spec,
    make_model_argv,
    node_wait_s,
    reap_argv,
    to_json,
)

__all__ = ["COLLECT_FILES", "RELOADABLE_FORMATS", "node_plan", "plan_checks"]

COLLECT_FILES = ("server.log", "timings.json", "launch.json", "dump.log", "restore-dropped.log", "restore-warm.log",
                 "lazy-pages-dropped.log", "lazy-pages-warm.log", "snapshot-create.log", "snapshot-restore.log")
# vLLM 0.24.0 reloads weights (POST /collective_rpc {"method": "reload_weights"}) through a model
# loader's get_all_weights, which only its DefaultModelLoader has: these are the formats it serves.
RELOADABLE_FORMATS = ("auto", "hf", "fastsafetensors", "instanttensor", "mistral", "npcache", "pt", "safetensors")
GIB = 2**30
_RAM_FS = ("tmpfs", "ramfs")


def _tool_options(mode: str, params: Mapping[str, Any]) -> list[str]:
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
        argv += ["--thp", params["thp"]] if params.get("thp", "leave") != "leave" else []
    if params.get("quiesce", "none") != "none":
        argv += ["--quiesce", params["quiesce"]]
    return argv


def _stage_dir(ctx: TrialContext) -> str:
    """Where image_source tmpfs copies the images: the mode's stage_dir, else /dev/shm/<trial>-stage."""
    if ctx.params.get("image_source") != "tmpfs":
        return ""
    return str(ctx.params.get("stage_dir") or f"/dev/shm/{ctx.node_paths().container}-stage")


def _launch(ctx: TrialContext) -> dict[str, Any]:
    engine, paths = ctx.engine, ctx.node_paths()
    extra: dict[str, Any] = {}
    if ctx.params.get("quiesce", "none") != "none":  # the sleep routes: sleep mode and vLLM's development API
        engine = {**engine, "env": {**(engine.get("env") or {}), "VLLM_SERVER_DEV_MODE": "1"}}
        extra = {"enable-sleep-mode": True}
    launch = engine_launch(engine, paths.container, engine["cache_root"], engine["model_cache"], extra, paths.python)
    return launch_spec(launch, engine)


def node_plan(ctx: TrialContext) -> NodePlan:
    """The engine's launch (its persistent caches) and the node programs of the three phases."""
    engine, params, paths = ctx.engine, dict(ctx.params), ctx.node_paths()
    cleanup = {"cleanup": cleanup_argv(paths, engine["port"])}
    if ctx.mode == "vllm_snapshot" and engine["kind"] == "stand-in":
        return NodePlan(skip="the stand-in has no vllm snapshot command: this mode needs vLLM",
                        commands={"reap": reap_argv(paths), **cleanup}, files=COLLECT_FILES)
    spec = _launch(ctx)
    images = params.get("images_dir") or paths.file("images")
    stage = ["--stage-dir", _stage_dir(ctx)] if _stage_dir(ctx) else []
    tool = [paths.python, "-m", "nodetools.snapshot"]
    gates = [*tool, "gates", *_tool_options(ctx.mode, params), "--gpus", ",".join(str(g) for g in engine["gpus"]),
             "--tp", str(vllm_arg(engine["args"], "tensor-parallel-size")), "--model", engine["model"],
             "--launch-json", to_json(spec),
             "--gpu-memory-fraction", str(vllm_arg(engine["args"], "gpu-memory-utilization"))]
    if ctx.mode == "criu":
        gates += ["--images", images, *stage]
    measure = [*tool, "measure", *_tool_options(ctx.mode, params), "--launch", paths.file("launch.json"),
               "--log", paths.file("server.log"), "--out", paths.file("timings.json"), "--images", images,
               "--poll-s", str(params["poll_s"]), "--timeout-s", str(node_wait_s(ctx.timeout_s)),
               "--trial", ctx.trial_id, "--lease-dir", paths.lease_dir]
    if ctx.mode == "criu":
        measure += ["--restore-cache", ",".join(params["restore_cache"]), "--answers", str(params["answers"]), *stage]
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


def _reload_refusal(engine: Mapping[str, Any]) -> list[str]:
    fmt = str(engine_arg(engine.get("args") or {}, "load-format") or "auto")
    if fmt in RELOADABLE_FORMATS:
        return []
    return [f"quiesce sleep2 drops the weights and reads them back after the wake (POST /collective_rpc "
            f"{{\"method\": \"reload_weights\"}}), which vLLM 0.24.0 does only through its default model loader: "
            f"load-format {fmt} has no get_all_weights ('Model reloading with `{fmt}` format'); use quiesce sleep"]


def plan_checks(ctx: TrialContext) -> list[str]:
    """A quiesced trial's refusals: a level-2 sleep whose weights vLLM cannot read back (an
    unquiesced one's are runner/experiments/snapshot_checks.py's, from the node's totals)."""
    return _reload_refusal(ctx.engine) if ctx.params.get("quiesce") == "sleep2" else []
