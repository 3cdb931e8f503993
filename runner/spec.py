"""Load and validate a campaign YAML before any host is touched.

Every problem becomes one line ``FILE:LINE: key.path: message``; all of them are reported at once
(a user fixing a campaign should not discover typos one run at a time). Unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nodetools.model_shapes import CONFIG_ONLY_PRESETS, PRESETS
from runner.errors import SpecError
from runner.experiments import KINDS
from runner.overrides import Override, apply_overrides
from runner.yaml_input import InputError, Loc, format_loc, line_for, read_yaml

__all__ = ["Campaign", "Engine", "Experiment", "LoadedCampaign", "did_you_mean", "load_campaign", "select"]

EngineArg = str | int | float | bool | None | list[str | int | float]


# Bounds on what one campaign may ask for: a typo must not plan a billion trials.
MAX_REPEATS = 1000
MAX_TRIALS = 10_000
MAX_TIMEOUT_S = 7 * 24 * 3600
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Keys and flags whose values are credentials: never written in a campaign file (it is copied into
# every results folder and shared); engine.env_from_controller passes them instead.
_SECRET_WORDS = {"SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
_KEY_QUALIFIERS = {"API", "ACCESS", "PRIVATE", "SECRET", "AUTH", "SIGNING"}
_SECRET_FLAGS = ("hf-token", "api-key")


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, DB_PASS, OPENAI_API_KEY are credentials; STANDIN_KV_CAPACITY_TOKENS is not."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(w == "KEY" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words)):
        return True
    # HF_TOKEN, ACCESS_TOKEN; not BYTES_PER_TOKEN or MAX_TOKENS (token counts are everywhere here)
    return bool(words) and words[-1] == "TOKEN" and (len(words) == 1 or words[-2] not in {"PER", "MAX", "MIN", "NUM"})


class _Strict(BaseModel):
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
    gpus: list[int] = Field(default_factory=list, description="GPU indices the engine may use")
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
        return self

    @field_validator("env_from_controller")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not re.match(_ENV_NAME, n)]
        if bad:
            raise ValueError(f"not a variable name: {bad[0]!r}")
        if len(set(v)) != len(v):
            raise ValueError("a variable is named twice")
        return v

    @field_validator("env")
    @classmethod
    def _no_secret_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(_ENV_NAME, key):
                raise ValueError(f"not a variable name: {key!r}")
            if is_secret_name(key):
                raise ValueError(f"{key} looks like a credential: a campaign file is shared and copied into "
                                 f"every results folder; list {key} in engine.env_from_controller instead")
        return v

    @field_validator("args")
    @classmethod
    def _no_secret_args(cls, v: dict[str, EngineArg]) -> dict[str, EngineArg]:
        return _refuse_secret_flags(v)

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, v: list[int]) -> list[int]:
        if any(g < 0 for g in v) or len(set(v)) != len(v):
            raise ValueError("GPU indices must be distinct and >= 0")
        return v


def _refuse_secret_flags(args: dict[str, EngineArg]) -> dict[str, EngineArg]:
    for key in args:
        flag = str(key).lstrip("-").replace("_", "-")
        if flag in _SECRET_FLAGS:
            raise ValueError(f"--{flag} takes a credential: a campaign file is shared; put its value in a "
                             "variable named in engine.env_from_controller (vLLM reads HF_TOKEN / VLLM_API_KEY)")
    return args


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

    @field_validator("engine_args")
    @classmethod
    def _no_secret_args(cls, v: dict[str, EngineArg]) -> dict[str, EngineArg]:
        return _refuse_secret_flags(v)

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
    inventory_path: Path
    hosts: tuple[str, ...]
    modes: tuple[dict[str, dict[str, Any]], ...]  # per experiment: mode -> validated params
    options: tuple[str, ...] = ()  # the command-line options that changed the file's values


# --- messages ------------------------------------------------------------------------------


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_MESSAGES = {
    "extra_forbidden": lambda e: "unknown key",
    "missing": lambda e: "required key is missing",
    "greater_than": lambda e: f"must be > {_num(e['ctx']['gt'])}",
    "greater_than_equal": lambda e: f"must be >= {_num(e['ctx']['ge'])}",
    "less_than_equal": lambda e: f"must be <= {_num(e['ctx']['le'])}",
    "literal_error": lambda e: f"must be one of {e['ctx']['expected']}",
    "string_pattern_mismatch": lambda e: f"must match {e['ctx']['pattern']}",
    "too_short": lambda e: "must not be empty",
}


def _message(err: Any) -> str:
    make = _MESSAGES.get(err["type"])
    if make is not None:
        return str(make(err))
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


def _clean_loc(loc: Loc) -> Loc:
    # pydantic adds the union member it tried (e.g. "dict[str,...]", "function-after[...]"): drop it.
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))


def did_you_mean(word: object, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def _known_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys allowed where ``loc`` (relative to ``model``) points, for "did you mean"."""
    fields: list[str] = [n for n, f in model.model_fields.items() if not f.exclude]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(str(part))
        sub = getattr(info, "annotation", None) if info else None
        for candidate in (sub, *getattr(sub, "__args__", ())):
            inner = getattr(candidate, "__args__", (candidate,))
            found = next((c for c in (candidate, *inner) if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if found is not None:
                model = found
                break
        else:
            return []
        fields = list(model.model_fields)
    return fields


def _errors_of(exc: ValidationError, prefix: Loc = (), model: type[BaseModel] | None = None
               ) -> list[tuple[Loc, str]]:
    seen: set[tuple[Loc, str]] = set()
    out = []
    for err in exc.errors():
        loc = _clean_loc(tuple(err["loc"]))
        message = _message(err)
        if err["type"] == "extra_forbidden" and model is not None and loc:
            message += did_you_mean(loc[-1], _known_keys(model, loc))
        item = ((*prefix, *loc), message)
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


# --- validation steps -------------------------------------------------------------------------


def _validate_modes(kind_name: str, raw_modes: Any, index: int
                    ) -> tuple[dict[str, dict[str, Any]], list[tuple[Loc, str]]]:
    """Check one experiment's modes against its kind; works on raw data so that these errors are
    reported together with every other error of the file."""
    kind = KINDS[kind_name]
    errors: list[tuple[Loc, str]] = []
    loc_modes: Loc = ("experiments", index, "modes")
    if raw_modes is None:
        raw: dict[str, Any] = dict.fromkeys(kind.default_modes)
    elif isinstance(raw_modes, list):
        raw = dict.fromkeys(str(m) for m in raw_modes)
        if len(raw) != len(raw_modes):
            errors.append((loc_modes, "a mode is listed twice"))
    elif isinstance(raw_modes, dict):
        raw = raw_modes
    else:
        return {}, []  # a wrong type is reported by the Campaign model
    if not raw:
        errors.append((loc_modes, f"no modes given and kind {kind_name} has no default"))
    validated: dict[str, dict[str, Any]] = {}
    for mode, params in raw.items():
        loc: Loc = (*loc_modes, mode)
        model = kind.modes.get(mode)
        if model is None:
            errors.append((loc, f"unknown mode for kind {kind_name} (known: {', '.join(kind.modes)})"
                           f"{did_you_mean(mode, kind.modes)}"))
            continue
        if params is not None and not isinstance(params, dict):
            errors.append((loc, "mode parameters must be a mapping"))
            continue
        try:
            validated[mode] = model.model_validate(params or {}).model_dump(mode="json")
        except ValidationError as exc:
            errors.extend(_errors_of(exc, loc, model))
    return validated, errors


def _check_modes(data: dict[str, Any]) -> tuple[list[dict[str, dict[str, Any]]], list[tuple[Loc, str]]]:
    experiments = data.get("experiments")
    modes: list[dict[str, dict[str, Any]]] = []
    errors: list[tuple[Loc, str]] = []
    for i, exp in enumerate(experiments if isinstance(experiments, list) else []):
        if isinstance(exp, dict) and exp.get("kind") in KINDS:
            validated, mode_errors = _validate_modes(str(exp["kind"]), exp.get("modes"), i)
        else:
            validated, mode_errors = {}, []
        modes.append(validated)
        errors.extend(mode_errors)
    return modes, errors


_PATTERN_TERM = re.compile(r"^[!&]?(?:[A-Za-z0-9_.*?\-]+(?:\[-?\d+(?::-?\d*)?\])?)$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.\-:\[\]%@]{1,200}$")


def _pattern_problem(pattern: str) -> str:
    """Ansible reads a malformed pattern ('[', 'all[') as 'all': check the grammar ourselves."""
    terms = re.split(r"[,:](?![^\[]*\])", pattern)
    for term in terms:
        if term.lstrip("!&").startswith("~"):
            try:
                re.compile(term.lstrip("!&")[1:])
            except re.error as exc:
                return f"host pattern term {term!r}: not a valid regular expression ({exc})"
        elif not _PATTERN_TERM.match(term):
            return (f"host pattern term {term!r} is malformed (names, globs, ~regex, group[0] or group[0:2], "
                    "joined by ',' or ':', each may start with ! or &)")
    return ""


def _resolve_hosts(inventory: Path, pattern: str) -> tuple[list[str], str]:
    """The hosts the pattern matches, or why the inventory or pattern is refused."""
    problem = _pattern_problem(pattern)
    if problem:
        return [], problem
    if not inventory.is_dir() and not inventory.is_file():
        return [], f"inventory {inventory} is neither a file nor a folder"
    if inventory.is_file() and inventory.stat().st_size > 4 * 1024 * 1024:
        return [], f"inventory {inventory} is larger than 4 MiB: is it an Ansible inventory?"
    from runner.inventory import Inventory  # noqa: PLC0415 - ansible's import costs ~0.3 s: only when an inventory is read

    hosts = Inventory(inventory).hosts(pattern)
    odd = [h for h in hosts if not _HOST_NAME.match(h)]
    if odd:
        return [], (f"inventory {inventory} gives host {odd[0][:60]!r}, which is not a host name: "
                    "is it an Ansible inventory?")
    return hosts, ""


# Kinds that time reading the weights: vLLM's --load-format dummy (random weights made on the GPU,
# nothing read from disk) would fake that phase.
_MEASURES_WEIGHT_LOADING = {"startup": "it times reading the weights, which --load-format dummy skips"}


def _weights_problems(engine: Engine, exp: Experiment, index: int) -> list[tuple[Loc, str]]:
    """Dummy weights where the kind measures loading them, and a config-only rehearsal model
    (no weights on disk) without them."""
    args = {**engine.args, **exp.engine_args}
    dummy = (args.get("load-format") or args.get("load_format")) == "dummy"
    if dummy and exp.kind in _MEASURES_WEIGHT_LOADING:
        return [(("experiments", index, "kind"), f"kind {exp.kind} cannot run with engine.args load-format dummy: "
                 f"{_MEASURES_WEIGHT_LOADING[exp.kind]} (use a rehearsal model with weights, or another kind)")]
    preset = engine.rehearsal_model or ""
    if preset and preset not in PRESETS:
        return [(("engine", "rehearsal_model"), f"unknown preset {preset!r} (known: {', '.join(PRESETS)})"
                 f"{did_you_mean(preset, PRESETS)}")]
    if preset in CONFIG_ONLY_PRESETS and not dummy:
        return [(("engine", "rehearsal_model"), f"preset {preset} is written without weights (config and tokenizer "
                 f"only): experiment {exp.label} needs engine.args load-format: dummy")]
    return []


def load_campaign(path: Path, *, check_hosts: bool = True, overrides: list[Override] | None = None,
                  inventory: Path | None = None, limit: str | None = None) -> LoadedCampaign:
    """Read, validate and resolve a campaign file, or raise ``SpecError`` with every problem.

    ``overrides`` (``-e``), ``inventory`` (``-i``) and ``limit`` (``-l``) replace values of the file
    before validation; an error in one names the option it came from instead of a line."""
    name = str(path)
    try:
        text, data, lines = read_yaml(path)
    except InputError as exc:
        raise SpecError([f"{name}:{exc.line}: {exc.message}"]) from exc
    if not isinstance(data, dict):
        raise SpecError([f"{name}:1: a campaign must be a YAML mapping"])
    given = list(overrides or [])
    if inventory is not None:
        given.append((("inventory",), str(inventory.resolve()), f"-i {inventory}"))
    if limit is not None:
        given.append((("hosts",), limit, f"-l {limit}"))
    from_options = apply_overrides(data, given)

    def where(loc: Loc) -> str:
        for path_, source in from_options.items():
            if loc[: len(path_)] == path_ or path_[: len(loc)] == loc:
                return source
        return f"{name}:{line_for(lines, loc)}"

    def fail(errors: list[tuple[Loc, str]]) -> SpecError:
        errors = sorted(errors, key=lambda e: line_for(lines, e[0]))
        return SpecError([f"{where(loc)}: {format_loc(loc)}: {msg}" for loc, msg in errors])

    modes, errors = _check_modes(data)
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as exc:
        raise fail(_errors_of(exc, (), Campaign) + errors) from exc

    labels: dict[str, int] = {}
    for i, exp in enumerate(campaign.experiments):
        if KINDS[exp.kind].needs_engine and campaign.engine is None:
            errors.append((("experiments", i, "kind"), f"kind {exp.kind} starts an engine: the campaign needs engine:"))
        if KINDS[exp.kind].needs_engine and campaign.engine is not None:
            errors.extend(e for e in _weights_problems(campaign.engine, exp, i) if e not in errors)
        if exp.label in labels:
            errors.append(((*("experiments", i), "name"), f"experiment name {exp.label!r} is used twice "
                           f"(also experiments[{labels[exp.label]}]): give each a distinct name"))
        labels.setdefault(exp.label, i)
    inventory_path = (path.parent / campaign.inventory).resolve()
    hosts: list[str] = []
    if not inventory_path.exists():
        errors.append((("inventory",), f"inventory {inventory_path} does not exist"))
    elif check_hosts:
        hosts, problem = _resolve_hosts(inventory_path, campaign.hosts)
        if problem:
            errors.append((("hosts",) if problem.startswith("host pattern") else ("inventory",), problem))
        elif not hosts:
            errors.append((("hosts",), f"host pattern {campaign.hosts!r} matches no host in {inventory_path}"))
    if errors:
        raise fail(errors)
    return LoadedCampaign(campaign, path.resolve(), text, inventory_path, tuple(hosts), tuple(modes),
                          tuple(sorted(source for source in set(from_options.values()))))


def select(loaded: LoadedCampaign, only: list[str]) -> LoadedCampaign:
    """Keep the experiments (``EXPERIMENT``) and modes (``EXPERIMENT.MODE``) that ``--only`` names;
    trial ids do not change, so a subset run resumes into the same results folder."""
    if not only:
        return loaded
    labels = [e.label for e in loaded.campaign.experiments]
    wanted: dict[str, set[str] | None] = {}
    errors = []
    for item in only:
        label, _, mode = item.partition(".")
        if label not in labels:
            errors.append(f"--only {item}: no experiment {label!r} (known: {', '.join(labels)})"
                          f"{did_you_mean(label, labels)}")
            continue
        modes = loaded.modes[labels.index(label)]
        if mode and mode not in modes:
            errors.append(f"--only {item}: experiment {label} has no mode {mode!r} (known: {', '.join(modes)})"
                          f"{did_you_mean(mode, modes)}")
            continue
        if mode:
            current = wanted.setdefault(label, set())
            if current is not None:
                current.add(mode)
        else:
            wanted[label] = None
    if errors:
        raise SpecError(errors)
    experiments, modes_kept = [], []
    for exp, modes in zip(loaded.campaign.experiments, loaded.modes, strict=True):
        if exp.label in wanted:
            keep = wanted[exp.label]
            experiments.append(exp)
            modes_kept.append({m: p for m, p in modes.items() if keep is None or m in keep})
    campaign = loaded.campaign.model_copy(update={"experiments": experiments})
    return dataclasses.replace(loaded, campaign=campaign, modes=tuple(modes_kept),
                               options=(*loaded.options, *(f"--only {o}" for o in only)))
