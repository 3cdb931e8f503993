"""``startup``: time a start to the first answer, then explain the wait from the server log.

Each mode is a documented preparation of the node before the same start command (the reference campaign's
table): which compile cache the engine gets, what the page cache holds, and the few flags that
differ. The recipe is data (``recipe`` in the trial's params), so plan.json shows exactly what a
trial does. One Ansible run (``playbooks/experiments/startup/trial.yml``): prepare (preconditions,
caches, page cache, launch file, what the start begins from), measure (the node-side timer
``nodetools.coldstart``), then collect (always: stop leftovers, fetch, facts). The wait is
explained by :mod:`runner.parse.startup_timeline`, from the server log, the timer's events and the
processes it saw.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, computed_field

from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.experiments.launch import engine_launch, mode_cache_root
from runner.experiments.node_plan import (
    NodePlan,
    cleanup_argv,
    engine_python,
    launch_spec,
    make_model_argv,
    node_wait_s,
    to_json,
)
from runner.experiments.startup_imports import IMPORT_COLUMNS, import_metrics, pyc_metrics
from runner.experiments.startup_imports_report import imports_section
from runner.markdown import markdown_table
from runner.parse.startup_timeline import PHASE_NAMES, timeline
from runner.records import TrialRecord

__all__ = ["KIND", "PHASE_COLUMNS", "RECIPES", "before_start"]

PLAYBOOKS = "playbooks/experiments/startup"

# cache: fresh (an empty compile/JIT cache dir per trial) | persistent (engine.cache_root) |
#        none (docker: no cache volume at all; process: same as fresh)
# empty_cache: empty the persistent cache first (the very first start begins from nothing and fills it)
# page_cache: drop (sync; echo 3 > drop_caches) | warm (weights read first) | keep
# standin: why the stand-in cannot rehearse the mode (the trial is skipped with that reason)
# pycache: PYTHONPYCACHEPREFIX on the cache volume (engine.cache_root/pycache), what the engine
#          imports compiled into it once before the start (not part of the start)
RECIPES: dict[str, dict[str, Any]] = {
    "first_start": {"cache": "persistent", "empty_cache": True, "page_cache": "drop"},
    "disk_cold": {"cache": "persistent", "page_cache": "drop"},
    "page_cache_warm": {"cache": "persistent", "page_cache": "warm"},
    "fresh_container": {"cache": "none", "page_cache": "drop"},
    "runai_streamer": {"cache": "persistent", "page_cache": "drop", "args": {"load-format": "runai_streamer"},
                       "python_module": "runai_model_streamer",
                       "standin": "the stand-in does not model --load-format runai_streamer (it reads like auto)"},
    "fastsafetensors": {"cache": "persistent", "page_cache": "drop", "args": {"load-format": "fastsafetensors"},
                        "python_module": "fastsafetensors"},  # O_DIRECT reads: page-cache state means little
    "preload": {"cache": "persistent", "page_cache": "drop", "preload": True,
                "args": {"load-format": "ipc_cache"},
                "standin": "the stand-in does not model vllm preload / --load-format ipc_cache"},
    "enforce_eager": {"cache": "persistent", "page_cache": "drop", "args": {"enforce-eager": True}},
    "sleep_wake": {"cache": "persistent", "page_cache": "drop", "args": {"enable-sleep-mode": True},
                   "env": {"VLLM_SERVER_DEV_MODE": "1"}, "sleep_wake": True},
    # The import remedies, each the pair of page_cache_warm (docs/startup.md, "The imports"):
    "bytecode_persisted": {"cache": "persistent", "page_cache": "warm", "pycache": True},
    # The EngineCore forked from the API server keeps what it imported instead of importing it again.
    "engine_fork": {"cache": "persistent", "page_cache": "warm", "env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"},
                    "standin": "the stand-in's EngineCore imports next to nothing: it does not model vLLM's "
                               "multiprocessing start method"},
    # Both: the API server imports from persisted bytecode, and the EngineCore forked from it imports nothing.
    "bytecode_and_fork": {"cache": "persistent", "page_cache": "warm", "pycache": True,
                          "env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"},
                          "standin": "the stand-in does not model vLLM's multiprocessing start method (engine_fork)"},
}


class StartupParams(ModeParams):
    poll_s: float = Field(default=0.05, gt=0, le=1.0,
                          description="first-token poll interval (the reference campaign polled every 0.2 s)")
    drop_scope: Literal["auto", "global", "files"] = Field(
        default="auto", description="how a 'page cache dropped' mode drops it: global (echo 3 > drop_caches, the "
        "whole machine's cache: for a node that is the campaign's alone), files (only the model's files, "
        "fadvise DONTNEED, verified: polite on a shared machine), auto (files for the stand-in, global for vLLM)")
    RECIPE: ClassVar[dict[str, Any]] = {}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recipe(self) -> dict[str, Any]:
        return {"args": {}, "env": {}, "empty_cache": False, "sleep_wake": False, "preload": False,
                "python_module": "", "standin": "", "pycache": False, **self.RECIPE}


def _mode_model(mode: str) -> type[StartupParams]:
    return type(f"{mode.title().replace('_', '')}Params", (StartupParams,), {"RECIPE": RECIPES[mode]})


# vllm preload's health port, beside the engine's (docs/startup.md)
PRELOAD_PORT = 8001
# The engine's own packages whose warm .pyc share prepare counts (a process engine only).
BYTECODE_PACKAGES = {"stand-in": ("nodetools", "aiohttp"),
                     "vllm": ("vllm", "torch", "transformers", "triton", "flashinfer")}
COLLECT_FILES = ("server.log", "timings.json", "launch.json", "preload.log", "importtime.txt")
# Written by the timer when the measured windows are over (Phase.overlap_marker, runner/overlap.py).
WINDOW_MARKER = "window-over.json"
PYCACHE_FOLDER = "pycache"  # under engine.cache_root: the persistent bytecode of bytecode_persisted


def _node_plan(ctx: TrialContext) -> NodePlan:
    """The engine's launch for this mode and the one node program a trial runs
    (``nodetools.coldstart trial``: prepare, then measure), with every option decided here."""
    engine, params, paths = ctx.engine, ctx.params, ctx.node_paths()
    recipe = params["recipe"]
    kind, runtime = engine["kind"], engine["runtime"]
    if kind == "stand-in" and recipe["standin"]:
        return NodePlan(skip=recipe["standin"], commands={"cleanup": cleanup_argv(paths, engine["port"])},
                        files=COLLECT_FILES)
    fresh_cache = paths.file("fresh-cache")
    cache_root = mode_cache_root(recipe["cache"], engine, fresh_cache)
    env = {**engine["env"], **recipe["env"]}
    if recipe["pycache"]:
        env["PYTHONPYCACHEPREFIX"] = f"{str(engine['cache_root']).rstrip('/')}/{PYCACHE_FOLDER}"
    launch = engine_launch({**engine, "env": env}, paths.container, cache_root, engine["model_cache"], recipe["args"],
                           paths.python)
    extra: dict[str, Any] = {"preload_port": PRELOAD_PORT} if recipe["preload"] else {}
    if runtime == "process":  # the timer takes Python's import profile of every engine process
        extra["import_profile"] = True
    spec = launch_spec(launch, engine, **extra)
    argv = [paths.python, "-m", "nodetools.coldstart", "trial", "--dir", paths.work_dir, "--launch-json", to_json(spec),
            "--reap-leases", paths.lease_dir, "--fresh-cache", "" if recipe["cache"] == "persistent" else fresh_cache,
            "--page-cache", recipe["page_cache"], "--drop-scope", params["drop_scope"], "--engine-kind", kind,
            "--model", engine["model"], "--make-model", to_json(make_model_argv(paths, engine)), "--check"]
    if recipe["empty_cache"]:
        argv.append("--empty-cache")
    if runtime == "process":  # where the packages are is kept in the answers folder across trials
        argv += ["--engine-python", engine_python(engine, paths.python),
                 "--bytecode-packages", ",".join(BYTECODE_PACKAGES[kind])]
        argv += ["--compile-bytecode"] if recipe["pycache"] else []
    if recipe["python_module"] and (runtime == "docker" or kind == "vllm"):
        argv += ["--python-module", recipe["python_module"]]
    if kind == "vllm" and runtime == "process" and engine["venv"]:
        argv += ["--exists", f"{engine['venv']}/bin/vllm"]
    if runtime == "docker":
        argv += ["--docker-image", engine["image"]]
    if recipe["preload"] and kind == "vllm":
        argv += ["--vllm-subcommand", "preload"]
    if runtime == "process" or (recipe["preload"] and kind == "vllm"):
        argv += ["--answers-dir", paths.answers_dir]
    argv += ["--poll-s", str(params["poll_s"]), "--timeout-s", str(node_wait_s(ctx.timeout_s)),
             "--residency", engine["model"], "--trial", ctx.trial_id, "--lease-dir", paths.lease_dir,
             "--window-marker", paths.file(WINDOW_MARKER)]
    if recipe["sleep_wake"]:
        argv.append("--sleep-wake")
    return NodePlan(launch=spec, commands={"trial": argv, "cleanup": cleanup_argv(paths, engine["port"])},
                    files=COLLECT_FILES)


def _resources(ctx: TrialContext) -> Resources:
    # Every start drops or fills the page cache and holds the engine's GPUs: the node is the trial's.
    return Resources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True)


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


def _parsed_log(raw: Path) -> dict[str, Any]:
    from runner.parse.vllm_log import parse_log_if_any  # noqa: PLC0415 - the log parser's patterns: when collecting, not at the runner's start
    return parse_log_if_any(raw / "server.log")


PHASE_COLUMNS = PHASE_NAMES


def before_start(timings: Mapping[str, Any]) -> dict[str, Any]:
    """What the start began from, as the prepare step read it from disk: ``cache_state`` (fresh,
    empty, warm, unknown), ``cache_files`` and ``cache_bytes`` (all cache folders), and the warm
    ``.pyc`` share of the engine's main package (``pyc_warm_fraction``: vllm, or nodetools for
    the stand-in) and of all its counted packages together (``pyc_warm_fraction_all``)."""
    before = timings.get("before_start") or {}
    out: dict[str, Any] = {}
    page_cache = before.get("page_cache") or {}
    if page_cache.get("action"):
        out["page_cache_action"] = page_cache["action"] if page_cache["action"] != "drop" else \
            f"drop ({page_cache.get('method', 'global')})"
    if before.get("cache_state"):
        out["cache_state"] = before["cache_state"]
        out["cache_files"] = sum((before.get("cache_files") or {}).values())
        out["cache_bytes"] = before.get("cache_bytes")
    packages = (before.get("bytecode") or {}).get("packages") or {}
    order = (before.get("bytecode") or {}).get("order") or sorted(packages)
    counted = [packages[name] for name in order if (packages.get(name) or {}).get("modules")]
    if counted:
        main = packages.get(order[0]) or {}
        if main.get("modules"):
            out["pyc_warm_fraction"] = main["fraction"]
        out["pyc_warm_fraction_all"] = round(sum(p["current"] for p in counted) / sum(p["modules"] for p in counted), 4)
    return out


def _collect(ctx: TrialContext) -> dict[str, Any]:
    raw = _raw(ctx)
    timings = json.loads((raw / "timings.json").read_text())
    log = _parsed_log(raw)
    first = float(timings["first_token_s"])
    metrics: dict[str, Any] = {"first_token_s": round(first, 3)}
    metrics.update(timeline(first, log, timings))
    metrics.update(before_start(timings))
    metrics.update(import_metrics(raw, timings, log, first))
    metrics.update(pyc_metrics(timings.get("before_start") or {}))
    for key in ("compile_cache_hit", "init_engine_s", "kv_cache_tokens", "weights_load_s", "sleep_s", "wake_s",
                "sleep_freed_gib"):
        if key in log:
            metrics[key] = log[key]
    for key in ("resident_fraction_before", "wake_to_first_token_s", "wake_http_s", "sleep_http_s"):
        if timings.get(key) is not None:
            metrics[key] = timings[key]
    events = timings.get("events") or {}
    if "stop_requested" in events and "stopped" in events:  # SIGTERM to the group gone: a restart's first part
        metrics["stop_s"] = round(float(events["stopped"]) - float(events["stop_requested"]), 3)
    # After the stop: what the engine left on the GPUs (an EngineCore outliving its API process
    # holds its memory) and the page cache the next trial starts from (timer, nodetools/node_state.py).
    for key in ("gpu_mem_mib_asleep", "gpu_mem_mib_awake", "gpu_mem_mib_after_stop"):
        if timings.get(key):
            metrics[key] = sum(timings[key])
    cached = (timings.get("node_after_stop") or {}).get("page_cache_bytes")
    if cached is not None:
        metrics["page_cache_gib_after_stop"] = round(cached / 2**30, 2)
    if log.get("errors"):
        metrics["log_errors"] = ",".join(log["errors"])
    return metrics


def _diagnose(ctx: TrialContext) -> str:
    """For a failed trial: the engine's parsed error labels and the last lines of its log."""
    raw = _raw(ctx)
    parts = []
    log = _parsed_log(raw)
    if log.get("errors"):
        parts.append(f"engine errors: {', '.join(log['errors'])}")
    path = raw / "server.log"
    if path.is_file():
        tail = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()][-3:]
        if tail:
            parts.append("log tail: " + " | ".join(tail))
    return "; ".join(parts)


_STATE_COLUMNS = ("compile_cache_hit", "cache_state", "cache_files", "pyc_warm_fraction", "pyc_warm_fraction_all",
                  "page_cache_action", "resident_fraction_before")
_WORD_COLUMNS = ("compile_cache_hit", "cache_state", "page_cache_action")  # no median of these: startup.csv has them
_REPORT_COLUMNS = ("first_token_s", *PHASE_COLUMNS, "other_s", "named_fraction", "timeline_resolution_s",
                   "timeline_sources", *_STATE_COLUMNS, *IMPORT_COLUMNS, "bytecode_compile_s", "wake_to_first_token_s",
                   "gpu_mem_mib_asleep", "stop_s", "gpu_mem_mib_after_stop", "page_cache_gib_after_stop", "log_errors",
                   "timeline_note")


def _rows(record: TrialRecord) -> list[dict[str, Any]]:
    from runner.report_charts import trial_engine  # noqa: PLC0415 - with pandas: only when a report is built

    metrics = record.get("metrics") or {}
    # What the engine was (engine, rehearsal_model, load_format): the chart's warning reads it here,
    # not from every trial's record again. "_" columns carry the import detail to the section only.
    return [{**{k: metrics.get(k) for k in _REPORT_COLUMNS}, **trial_engine(record),
             "_imports": metrics.get("imports"), "_pyc_packages": metrics.get("pyc_packages")}]


def _resolution_line(ok: Any) -> str:
    """How precise the phase boundaries are, in words, from the trials' ``timeline_resolution_s``."""
    counts = ok["timeline_resolution_s"].dropna().value_counts().sort_index()
    if counts.empty:
        return ""
    parts = [f"{n} trial{'s' if n != 1 else ''} to {float(res):g} s" for res, n in counts.items()]
    return ("Phase boundaries: " + ", ".join(parts) + ". vLLM stamps its lines to the whole second unless its log "
            "has milliseconds: such a boundary is placed in the middle of its second (±0.5 s); the start command, "
            "the port opening and the first token are the timer's (to the poll interval), the EngineCore's start "
            "is the process's own (to the clock tick).\n")


def _per_mode(ok: Any, columns: list[str]) -> Any:
    """One row per mode (and host where there are several): ``n`` ok trials and each column's median."""
    import pandas as pd  # noqa: PLC0415 - only when a report is built

    keys = ["mode", "host"] if ok["host"].nunique() > 1 else ["mode"]
    numbers = ok[keys].assign(**{c: pd.to_numeric(ok[c], errors="coerce") for c in columns})
    grouped = numbers.groupby(keys, sort=False)
    table = grouped.median().round(3)
    table.insert(0, "n", grouped.size())
    return table.reset_index()


def _section(frame: Any, root: Path) -> str:
    from runner.report_charts import MAX_TRIAL_BARS, startup_chart  # noqa: PLC0415 - pandas and matplotlib: only when a report is built

    ok = frame[frame["status"] == "ok"]
    many = len(ok) > MAX_TRIAL_BARS
    each = ("Each bar is one trial (repeats side by side: read the pairs, not a mean), stacked from the start "
            "command to the first token." if not many else
            f"{len(ok):,} trials are too many to draw one by one: each bar is a mode (and host), each phase its "
            "median over the ok trials, stacked, with the first token's median and its 10th-90th percentile over it "
            "(a stack of medians need not add up to the median start); the tables below give medians per mode, and "
            "`startup.csv` every trial.")
    lines = ["\n## Startup: time to the first token, and where it went\n",
             f"{each} Phases come from the server log's timestamps, the timer's events and the engine's processes as "
             "the timer saw them; `other` is what lies between named boundaries or where one is missing.\n"]
    chart = startup_chart(frame, root / "startup.png")
    if chart is not None:
        lines.append(f"![startup phases]({chart.name})\n")
    if len(ok):
        lines.append(_resolution_line(ok))
        phases = [c for c in ("first_token_s", *PHASE_COLUMNS, "other_s", "named_fraction") if ok[c].notna().any()]
        lines.append(markdown_table(_per_mode(ok, phases) if many else ok[["mode", "repeat", *phases]]))
        lines.append("\nWhat each start began from (read from disk before it, never from the mode): the compile "
                     "and JIT caches, the engine's warm `.pyc` share, the model's share in the page cache. "
                     "`stop_s`: the engine's stop after the trial (SIGTERM to its whole process group gone), what a "
                     "restart pays before its start; `gpu_mem_mib_after_stop`: the GPUs' memory in use once it "
                     "was stopped (what the engine left behind); `page_cache_gib_after_stop`: the node's page cache "
                     "then.\n")
        extra = [c for c in ("wake_to_first_token_s", "stop_s", "gpu_mem_mib_after_stop", "page_cache_gib_after_stop")
                 if ok[c].notna().any()]
        state = [c for c in _STATE_COLUMNS if c not in _WORD_COLUMNS and ok[c].notna().any()]
        lines.append(markdown_table(_per_mode(ok, [*state, *extra]) if many
                                    else ok[["mode", "repeat", *_STATE_COLUMNS, *extra]]))
    lines.append(imports_section(frame, root))
    return "\n".join(lines)


KIND = ExperimentKind(
    name="startup",
    doc="docs/startup.md",
    summary="wall seconds from the start command to the first token, explained phase by phase",
    # One Ansible run a trial (prepare, measure, then collect in an always: section): each
    # ansible-playbook start costs 1.4-2.1 s on the H200: the next trial's run starts once the
    # timer says its windows are over (a local connection), else when this one collects
    # (runner/overlap.py).
    phases=(Phase("trial", f"{PLAYBOOKS}/trial.yml", follow="server.log", overlap_from="collect_engine_files |",
                  overlap_marker=WINDOW_MARKER, waits_for_turn=True,
                  turn_from="collect_engine_files | Done with the node"),),
    modes={mode: _mode_model(mode) for mode in RECIPES},
    default_modes=("first_start", "disk_cold", "page_cache_warm", "enforce_eager", "sleep_wake"),
    resources=_resources,
    collect=_collect,
    diagnose=_diagnose,
    node_plan=_node_plan,
    needs_engine=True,
    report=KindReport("startup.csv", _rows, _section),
)
