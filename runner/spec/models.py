"""The campaign file's pydantic models: what each key may hold, with its bounds.

Checks that need more than one key or the outside world (modes per kind, hosts, weights) are the
sibling modules' job; these models only refuse what one value alone gets wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from runner.experiments import KINDS
from runner.experiments.base import MAX_SECONDS, NumbersAreNotBooleans
from runner.experiments.launch import flag_name
from runner.inventory import InventorySources
from runner.secrets import shown_name
from runner.spec.messages import did_you_mean
from runner.spec.secret_names import ENV_NAME, EngineArg, is_secret_name, refuse_secret_flags

__all__ = ["MAX_REPEATS", "MAX_TIMEOUT_S", "MAX_TRIALS", "Campaign", "Defaults", "Engine", "Experiment",
           "LoadedCampaign"]

# Bounds on what one campaign may ask for: a typo must not plan a billion trials.
MAX_REPEATS = 1000
MAX_TRIALS = 10_000
MAX_GPU_INDEX = 1023  # CUDA_VISIBLE_DEVICES of a node: more than any node holds
MAX_TIMEOUT_S = MAX_SECONDS
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


# Flags the runner gives the engine itself: the same flag in engine.args came after it on the command
# line and won (`args: {port: 1}`: the engine listened on 1, the runner waited on engine.port).
_RUNNER_FLAGS = {"port": "engine.port", "model": "engine.model"}


def _flag_values(args: Any) -> Any:
    """Flags as the file's YAML would type them: ``-e engine.args.enforce-eager=true`` (text, as
    Ansible reads key=value) is the bare flag, ``=8192`` the number; text that would not read back
    the same ("1.10", "0x10") stays text. The credential check comes first; then each flag once
    (``max_model_len`` and ``max-model-len`` are one flag), and none the runner sets itself. Each
    key becomes the flag it names (``--max_model_len`` is ``max-model-len``): every reader of a flag
    (the plan's checks, an experiment's ``engine_args`` over the engine's) finds it by one name."""
    args = refuse_secret_flags(args)
    if not isinstance(args, dict):
        return args
    spelled: dict[str, object] = {}
    for key in args:
        flag = flag_name(key)
        if flag in _RUNNER_FLAGS:
            raise ValueError(f"--{flag} is given by the runner, from {_RUNNER_FLAGS[flag]}: set that instead")
        if flag in spelled:
            raise ValueError(f"--{flag} is given twice ({spelled[flag]!r} and {key!r}): vLLM would take the last")
        spelled[flag] = key
    # A key that is no text (`1: x`, `~: x`) stays as it is, for pydantic to refuse.
    return {flag_name(k) if isinstance(k, str) else k: _scalar(v) if isinstance(v, str) else v for k, v in args.items()}


def _scalar(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"-?[1-9][0-9]{0,17}|0", text):
        return int(text)
    if re.fullmatch(r"-?(0|[1-9][0-9]{0,15})\.[0-9]{1,15}", text) and repr(float(text)) == text:
        return float(text)
    return text


class _Strict(NumbersAreNotBooleans):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Engine(_Strict):
    """The engine every trial of the campaign starts (experiments may override ``args``)."""

    kind: Literal["vllm", "stand-in"] = Field(
        default="stand-in", description="vllm, or the stand-in that rehearses a campaign without a GPU"
    )
    runtime: Literal["docker", "process"] = "process"
    image: str | None = Field(default=None, description="container image (docker runtime)")
    venv: str | None = Field(default=None, description="virtualenv on the node holding vllm (process)")
    python: str | None = Field(
        default=None,
        description="the node's Python that runs vllm (process): one that has torch, with vLLM installed by "
        "the vllm_images role into a --target folder that env.PYTHONPATH names",
    )
    version: str | None = Field(default=None, description="engine version, for args that drift")
    model: str = Field(min_length=1, description="model path on the node, or a model id")
    served_model_name: str | None = None
    port: int = Field(default=8000, ge=1, le=65535)
    gpus: list[Annotated[int, Field(le=MAX_GPU_INDEX)]] = Field(default_factory=list, max_length=MAX_GPU_INDEX + 1,
                                                                description="GPU indices the engine may use")
    args: dict[str, EngineArg] = Field(default_factory=dict, description="vllm serve flags as data")
    env: dict[str, str] = Field(default_factory=dict, description="environment of the engine (no secrets: "
                                "see env_from_controller)")
    env_from_controller: list[str] = Field(
        default_factory=list, max_length=32,
        description="names of variables whose values are taken from the controller's environment at run time "
        "and passed to the engine as secrets: never written to plan.json, trial.json or any other artifact",
    )
    cache_root: str = Field(default="/mnt/data/cache", description="persistent compile and JIT caches on the node")
    model_cache: str | None = Field(default=None, description="HF cache on the node (HF_HOME)")
    standin_model_mib: int = Field(default=256, gt=0, description="stand-in: size of the model it makes if missing")
    rehearsal_model: str | None = Field(
        default=None,
        description="vllm: a nodetools.model_maker preset (e.g. qwen3-0.8b) made at engine.model if no model is "
        "there: random weights and a trained tokenizer, for real engines where no weights can be downloaded",
    )

    @model_validator(mode="after")
    def _runtime_needs(self) -> Engine:
        if self.runtime == "docker" and not self.image:
            raise ValueError("runtime docker needs engine.image")
        if self.runtime == "docker" and self.kind == "stand-in":
            raise ValueError("the stand-in runs as a process: use runtime process")
        if self.rehearsal_model and self.kind != "vllm":
            raise ValueError("engine.rehearsal_model is for kind vllm (the stand-in makes its own model)")
        if self.venv and self.python:
            raise ValueError("engine.venv and engine.python both name vLLM's Python: keep one")
        both = sorted(set(self.env) & set(self.env_from_controller))
        if both:  # one value would silently win over the other on the node
            raise ValueError(f"{both[0]} is in engine.env and in engine.env_from_controller: keep one")
        return self

    @field_validator("env_from_controller")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not re.match(ENV_NAME, n)]
        if bad:
            raise ValueError(f"not a variable name: {shown_name(bad[0])}")
        if len(set(v)) != len(v):
            raise ValueError("a variable is named twice")
        return v

    @field_validator("env")
    @classmethod
    def _no_secret_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(ENV_NAME, key):
                raise ValueError(f"not a variable name: {shown_name(key)}")
            if is_secret_name(key):
                raise ValueError(f"{key} looks like a credential: a campaign file is shared and copied into "
                                 f"every results folder; list {key} in engine.env_from_controller instead")
        return v

    @field_validator("args", mode="before")
    @classmethod
    def _no_secret_args(cls, v: Any) -> Any:
        return _flag_values(v)  # before the values: no per-flag error prints the flag's name

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, v: list[int]) -> list[int]:
        if any(g < 0 for g in v) or len(set(v)) != len(v):
            raise ValueError("GPU indices must be distinct and >= 0")
        return v


class Defaults(_Strict):
    repeats: int = Field(default=1, ge=1, le=MAX_REPEATS)
    timeout_s: float = Field(default=1800, gt=0, le=MAX_TIMEOUT_S, description="per phase")


class Experiment(_Strict):
    kind: str
    name: str | None = Field(default=None, pattern=_NAME, max_length=64)
    modes: dict[str, dict[str, Any] | None] | list[str] | None = None
    repeats: int | None = Field(default=None, ge=1, le=MAX_REPEATS)
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    engine_args: dict[str, EngineArg] = Field(default_factory=dict, description="merged over engine.args")

    @field_validator("engine_args", mode="before")
    @classmethod
    def _no_secret_args(cls, v: Any) -> Any:
        return _flag_values(v)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in KINDS:
            raise ValueError(f"unknown experiment kind {v!r} (known: {', '.join(sorted(KINDS))})"
                             f"{did_you_mean(v, KINDS)}")
        return v

    @property
    def label(self) -> str:
        return self.name or self.kind


class Campaign(_Strict):
    name: str = Field(pattern=_NAME, max_length=64, description="names results/<name>/")
    description: str = ""
    inventory: str = Field(min_length=1, description="inventory path, relative to the campaign file")
    hosts: str = Field(default="all", min_length=1, description="Ansible host pattern")
    remote_dir: str = Field(default="/tmp/gpu-campaign", max_length=256,
                            description="node-side work folder: an absolute path, not /")
    node_python: str | None = Field(
        default=None, description="python on the node with this repo's nodetools (default: the controller's, "
        "right for the local inventory; the bench_client role installs one on real nodes)")
    engine: Engine | None = None
    defaults: Defaults = Defaults()
    experiments: list[Experiment] = Field(min_length=1, max_length=100)

    @field_validator("remote_dir")
    @classmethod
    def _absolute_dir(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path on the node (a relative one lands wherever Ansible runs)")
        parts = [p for p in v.split("/") if p]
        if not parts:
            raise ValueError("must not be / (trial folders are emptied there)")
        if any(p in (".", "..") for p in parts) or any(c in v for c in "\n\r\0"):
            raise ValueError("must be a plain absolute path, without '.', '..' or control characters")
        return "/" + "/".join(parts)


@dataclass(frozen=True)
class LoadedCampaign:
    """A validated campaign plus where it came from; ``modes`` holds validated mode parameters."""

    campaign: Campaign
    path: Path
    text: str
    inventory: InventorySources  # the file's inventory, or -i's
    hosts: tuple[str, ...]
    modes: tuple[dict[str, dict[str, Any]], ...]  # per experiment: mode -> validated params
    options: tuple[str, ...] = ()  # the command-line options that changed the file's values
