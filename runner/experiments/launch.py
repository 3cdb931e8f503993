"""Render an engine (vLLM or the stand-in) from data into the argv and environment that start it.

Engine arguments are data: a mapping of ``vllm serve`` flags rendered by one tested function,
never string-pasted shell. The kinds call these at plan time, so ``--plan`` shows the exact
command a trial's node will exec (``launch`` in plan.json); the playbooks only pass it on.

- :func:`engine_argv` turns a mapping of flags into argv: ``True`` gives a bare flag, ``False``
  and ``None`` omit it (write ``no-enable-prefix-caching: true`` for a negative flag), a list gives
  the flag followed by each item, a mapping gives compact JSON, anything else its string form.
  Underscores in names become dashes.
- :func:`engine_launch` returns ``argv``, ``env`` and ``stop_argv`` for a campaign's engine at a
  runtime (docker or process), with the compile and JIT caches and the model cache where the mode
  says.
- :func:`mode_cache_root` maps a startup mode's cache recipe (persistent, fresh, none) to a folder.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["VLLM_DEFAULTS", "engine_arg", "engine_argv", "engine_launch", "flag_name", "mode_cache_root", "vllm_arg"]

# vLLM's own defaults for the flags the plan reads when a campaign leaves them out.
VLLM_DEFAULTS: dict[str, Any] = {"tensor-parallel-size": 1, "gpu-memory-utilization": 0.9}

# Where each cache lives inside the vLLM image (root's home) and which variable moves it for a
# process runtime. vLLM's compile cache is under VLLM_CACHE_ROOT; the kernel-JIT caches (Triton,
# FlashInfer) dominated a real cold start, so they are persisted beside it.
_CACHES = (
    ("vllm", "/root/.cache/vllm", "VLLM_CACHE_ROOT"),
    ("triton", "/root/.triton", "TRITON_CACHE_DIR"),
    ("flashinfer", "/root/.cache/flashinfer", "FLASHINFER_WORKSPACE_BASE"),
    ("torchinductor", "/root/.cache/torchinductor", "TORCHINDUCTOR_CACHE_DIR"),
    # The driver's PTX-to-machine-code cache, for kernels shipped without code for this GPU.
    ("cuda", "/root/.nv/ComputeCache", "CUDA_CACHE_PATH"),
)
_HF_IN_IMAGE = "/root/.cache/huggingface"


def engine_argv(args: Any) -> list[str]:
    if args is None:
        return []
    if not isinstance(args, dict):
        raise ValueError(f"engine_argv: expected a mapping of flags, got {type(args).__name__}: {args!r}")
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + flag_name(key)
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            out.extend([flag, *(str(v) for v in value)])
        elif isinstance(value, dict):
            out.extend([flag, json.dumps(value, separators=(",", ":"), sort_keys=True)])
        else:
            out.extend([flag, str(value)])
    return out


def flag_name(key: object) -> str:
    """The flag a key of engine.args names: ``max_model_len``, ``--max-model-len`` and
    ``max-model-len`` are all ``max-model-len``. As vLLM's parser does, only the part before the
    first dot: after it comes a config field, underscores and all
    (``compilation-config.cudagraph_capture_sizes``)."""
    name, dot, field = str(key).lstrip("-").partition(".")
    return name.replace("_", "-") + dot + field


def engine_arg(args: Mapping[str, Any], flag: str) -> Any:
    """An engine flag as a campaign may spell it: ``max-model-len`` or ``max_model_len``."""
    value = args.get(flag)
    return args.get(flag.replace("-", "_")) if value is None else value


def vllm_arg(args: Mapping[str, Any], flag: str) -> Any:
    """The flag's value as the engine will see it: the campaign's, else vLLM's default."""
    value = engine_arg(args, flag)
    return VLLM_DEFAULTS[flag] if value is None else value


def _cache_dirs(cache_root: str | None) -> dict[str, str]:
    if not cache_root:
        return {}
    return {name: f"{cache_root.rstrip('/')}/{name}" for name, _, _ in _CACHES}


def engine_launch(engine: Mapping[str, Any], name: str, cache_root: str | None = None,
                  model_cache: str | None = None, extra_args: dict[str, Any] | None = None,
                  python: str = "python3", host: str = "127.0.0.1") -> dict[str, Any]:
    """argv/env/stop_argv starting ``engine``; ``cache_root`` None means no persistent caches."""
    if not isinstance(engine, Mapping) or not engine.get("model"):
        raise ValueError(f"engine_launch: engine must be a mapping with a model, got {engine!r}")
    kind = engine.get("kind", "stand-in")
    runtime = engine.get("runtime", "process")
    port = str(engine.get("port", 8000))
    model = str(engine["model"])
    args: dict[str, Any] = {**(engine.get("args") or {}), **(extra_args or {})}
    if engine.get("served_model_name"):
        args = {"served-model-name": engine["served_model_name"], **args}
    flags = ["--host", host, "--port", port, *engine_argv(args)]
    gpus = [str(g) for g in engine.get("gpus") or []]
    env = {str(k): str(v) for k, v in (engine.get("env") or {}).items()}
    caches = _cache_dirs(cache_root)

    if runtime == "process":
        if kind == "stand-in":
            argv = [python, "-m", "nodetools.standin", "serve", model, *flags]
            if "flashinfer" in caches:  # the stand-in's kernel-JIT cache sits beside the compile cache
                env["STANDIN_JIT_DIR"] = caches["flashinfer"]
        elif engine.get("python"):  # vLLM installed with --target into a Python that has torch
            argv = [str(engine["python"]), "-m", "vllm.entrypoints.cli.main", "serve", model, *flags]
        else:
            vllm = f"{engine['venv'].rstrip('/')}/bin/vllm" if engine.get("venv") else "vllm"
            argv = [vllm, "serve", model, *flags]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        for cache, _, variable in _CACHES:
            if cache in caches:
                env[variable] = caches[cache]
        if model_cache:
            env["HF_HOME"] = model_cache
        return {"argv": argv, "env": env, "stop_argv": [], "container": "", "caches": caches}

    if runtime != "docker":
        raise ValueError(f"engine_launch: unknown runtime {runtime!r} (docker or process)")
    if kind == "stand-in":
        raise ValueError("engine_launch: the stand-in runs as a process (runtime: process)")
    if not engine.get("image"):
        raise ValueError("engine_launch: runtime docker needs engine.image")
    docker = ["docker", "run", "--rm", "--name", name, "--ipc=host", "--network=host"]
    docker += ["--gpus", f'"device={",".join(gpus)}"' if gpus else "all"]
    for cache, in_image, _ in _CACHES:
        if cache in caches:
            docker += ["-v", f"{caches[cache]}:{in_image}"]
    if model_cache:
        docker += ["-v", f"{model_cache}:{_HF_IN_IMAGE}"]
    if model.startswith("/"):
        docker += ["-v", f"{model}:{model}:ro"]
    for key, value in sorted(env.items()):
        docker += ["-e", f"{key}={value}"]
    for secret in sorted(engine.get("env_from_controller") or []):  # by name: docker takes the value
        docker += ["-e", str(secret)]                                # from its own environment
    # The stock image's entrypoint is `vllm serve`: the model and flags follow the image.
    argv = [*docker, str(engine["image"]), model, *flags]
    return {"argv": argv, "env": {}, "stop_argv": ["docker", "stop", "--time", "30", name], "container": name,
            "caches": caches}


def mode_cache_root(cache: str, engine: Mapping[str, Any], fresh_dir: str) -> str | None:
    """Where a mode's compile and JIT caches live: ``persistent`` the campaign's cache volume,
    ``fresh`` an empty folder of the trial, ``none`` no cache volume for a docker engine (a
    process engine always has a cache folder: a fresh one)."""
    if cache == "persistent":
        return str(engine.get("cache_root") or "") or None
    if cache == "fresh" or (cache == "none" and engine.get("runtime", "process") == "process"):
        return fresh_dir
    if cache == "none":
        return None
    raise ValueError(f"mode_cache_root: unknown cache mode {cache!r} (persistent, fresh or none)")

