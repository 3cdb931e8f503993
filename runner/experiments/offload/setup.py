"""What an offload trial hands its node tools, planned before anything runs (``plan.json`` shows it).

Everything derived from the mode's parameters, the engine and the trial: the file-system tier's
own folder, each engine copy's port, GPUs and container name, the mode's flags and environment
with that folder filled in, why the trial must be skipped (a gap of the stand-in, an engine older
than the mode, GPUs that do not split), what the preflight must check (``need``), the files to
fetch, and the sizing of the working set against the tiers. It travels as the trial's resources
(``OffloadResources``: ``exp_resources.offload`` in the playbooks), so the playbooks only move it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodetools.loadgen.workload import request_context_tokens
from nodetools.model_shapes import CONFIG_ONLY_PRESETS
from nodetools.offload.layout import COPY_FILES, TRIAL_FILES, fetched_name, split_gpus
from runner.experiments.base import Resources, TrialContext
from runner.experiments.launch import engine_arg
from runner.experiments.offload.params import TRIAL_FS_DIR, QualityParams, WorkloadParams
from runner.experiments.offload.sizing import plan_sizing, staging_shortfall

__all__ = ["OffloadResources", "load_format", "resources", "trial_setup", "weights_label"]

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
FACTS_AFTER = "facts_after.json"


@dataclass(frozen=True)
class OffloadResources(Resources):
    """The trial's resources plus its planned setup (``offload`` in plan.json's and trial.json's resources)."""

    setup: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "offload": dict(self.setup)}


def load_format(engine: Mapping[str, Any]) -> str:
    return str(engine_arg(engine.get("args") or {}, "load-format") or "")


def weights_label(engine: Mapping[str, Any]) -> str:
    """What the engine's weights were, for the results: dummy (vLLM made them), random (a rehearsal
    model's files), or empty (the model's own)."""
    if load_format(engine) == "dummy":
        return "dummy (--load-format dummy: random weights made on the GPU, none read from disk)"
    if engine.get("rehearsal_model"):
        return f"random ({engine['rehearsal_model']}, made by nodetools.model_maker)"
    return ""


def _trial_fs_dir(params: Mapping[str, Any], ctx: TrialContext) -> str:
    """The file-system tier's own folder for this trial (collect removes it), under ``fs_dir``."""
    if params.get("fs_dir"):
        return f"{str(params['fs_dir']).rstrip('/')}/{_UNSAFE_NAME.sub('-', f'{ctx.campaign}.{ctx.trial_id}')}"
    return f"{ctx.remote_dir}/kv-fs"


def _fill(value: Any, fs_dir: str) -> Any:
    """``value`` with the trial's fs-tier folder in place of the recipe's placeholder, at any depth."""
    if isinstance(value, str):
        return value.replace(TRIAL_FS_DIR, fs_dir)
    if isinstance(value, Mapping):
        return {k: _fill(v, fs_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, fs_dir) for v in value]
    return value


def _release(version: str) -> tuple[int, ...]:
    """0.24.0 -> (0, 24, 0); what follows the numbers (rc1, +cu130) does not count."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip().lstrip("v"))
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def _skip_reason(ctx: TrialContext, recipe: Mapping[str, Any], copies: int) -> str:
    engine = ctx.engine
    kind, version = engine.get("kind") or "stand-in", str(engine.get("version") or "")
    if kind == "stand-in" and recipe.get("standin"):
        return str(recipe["standin"])
    minimum = str(recipe.get("min_version") or "")
    if kind == "vllm" and minimum and version and _release(version) < _release(minimum):
        return f"vLLM {version} predates mode {ctx.mode} ({recipe['summary']}): it needs >= {minimum}"
    gpus = list(engine.get("gpus") or [])
    if len(gpus) % copies:
        return f"{len(gpus)} GPUs cannot be split evenly between {copies} engine copies"
    if ctx.mode == "tiered":
        return staging_shortfall(ctx.params, engine)
    return ""


def _engine_python(engine: Mapping[str, Any]) -> str:
    """The Python that runs vLLM when the campaign names it (the node's default is known only there)."""
    if engine.get("python"):
        return str(engine["python"])
    return f"{str(engine['venv']).rstrip('/')}/bin/python" if engine.get("venv") else ""


def _need(ctx: TrialContext, recipe: Mapping[str, Any], copies: int, fs_dir: str) -> dict[str, Any]:
    """What the preflight checks on the node (``nodetools.offload.preflight.Need``)."""
    params, engine = ctx.params, ctx.engine
    kind, runtime = engine.get("kind") or "stand-in", engine.get("runtime") or "process"
    docker = runtime == "docker"
    process_vllm = kind == "vllm" and runtime == "process"
    workload = WorkloadParams(**(params.get("workload") or {})).workload()
    quality = QualityParams(**(params.get("quality") or {})).spec()
    module = str(recipe.get("python_module") or "") if kind == "vllm" else ""
    port = int(engine.get("port") or 8000)
    return {
        "offload_gib": float(recipe.get("host_gib_per_copy") or 0), "copies": copies,
        "gpus": list(engine.get("gpus") or []), "safety_factor": float(params.get("ram_safety_factor") or 1.0),
        "uses_shm": bool(recipe.get("shm")), "fs_dir": fs_dir, "fs_gib": float(params.get("fs_gib") or 0),
        "docker": docker, "image": str(recipe.get("image") or engine.get("image") or "") if docker else "",
        "ports": [port + i for i in range(copies)],
        "exists": [f"{str(engine['venv']).rstrip('/')}/bin/vllm"] if process_vllm and engine.get("venv") else [],
        "python": _engine_python(engine) if process_vllm and module else "", "python_module": module,
        "refuse_torch_ops": bool(module and recipe.get("refuse_torch_ops")),
        "pythonpath": str((engine.get("env") or {}).get("PYTHONPATH") or ""),
        "max_model_len": engine_arg(engine.get("args") or {}, "max-model-len") or "",
        "context_tokens": request_context_tokens(workload, quality),
    }


def _copies(ctx: TrialContext, copies: int) -> list[dict[str, Any]]:
    port = int(ctx.engine.get("port") or 8000)
    gpus = list(ctx.engine.get("gpus") or [])
    try:
        shares = split_gpus(gpus, copies)
    except ValueError:
        shares = [[] for _ in range(copies)]  # the trial is skipped with that reason
    return [{"index": i, "port": port + i, "gpus": shares[i], "container_suffix": f"-c{i}" if i else ""}
            for i in range(copies)]


def _fetch(copies: int) -> list[list[str]]:
    """[path in the trial's folder, name in raw/<host>/]: the trial's files, the other copies', and
    the node's facts after the trial (written there by the collect on a remote node)."""
    files = [[name, name] for name in TRIAL_FILES]
    files += [[f"copy{i}/{name}", fetched_name(name, i)] for i in range(1, copies) for name in COPY_FILES]
    return [*files, [FACTS_AFTER, FACTS_AFTER]]


def trial_setup(ctx: TrialContext) -> dict[str, Any]:
    params, engine = ctx.params, ctx.engine
    recipe = params.get("recipe") or {}
    copies = int(params.get("engine_copies") or 1)
    fs_dir = _trial_fs_dir(params, ctx) if recipe.get("fs") else ""
    preset = str(engine.get("rehearsal_model") or "")
    dummy = load_format(engine) == "dummy"
    return {
        "skip": _skip_reason(ctx, recipe, copies),
        "copies": _copies(ctx, copies),
        "args": _fill(recipe.get("args") or {}, fs_dir),
        "env": {**(engine.get("env") or {}), **_fill(recipe.get("env") or {}, fs_dir)},
        "image": str(recipe.get("image") or engine.get("image") or ""),
        "served_model": str(engine.get("served_model_name") or engine.get("model") or ""),
        "fs_dir": fs_dir,
        # A dummy-weights engine reads no weights: the rehearsal model needs its config and tokenizer only.
        "model_maker_args": ["--config-only"] if dummy and preset and preset not in CONFIG_ONLY_PRESETS else [],
        "weights": weights_label(engine),
        "need": _need(ctx, recipe, copies, fs_dir),
        "fetch": _fetch(copies),
        "sizing": plan_sizing(params, engine),
    }


def resources(ctx: TrialContext) -> Resources:
    # The trial pins host RAM and drives the GPUs at full load: the node is the trial's.
    recipe = ctx.params.get("recipe") or {}
    ram = float(recipe.get("host_gib_per_copy") or 0) * int(ctx.params.get("engine_copies") or 1)
    ram *= float(ctx.params.get("ram_safety_factor") or 1.0)
    return OffloadResources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True, host_ram_gib=round(ram, 2),
                            setup=trial_setup(ctx))
