"""``startup``: time a start to the first answer, then explain the wait from the server log.

Each mode is a documented preparation of the node before the same start command (the reference campaign's
table): which compile cache the engine gets, what the page cache holds, and the few flags that
differ. The recipe is data (``recipe`` in the trial's params), so plan.json shows exactly what a
trial does. Phases: ``prepare`` (preconditions, caches, page cache, launch file), ``measure`` (the
node-side timer ``nodetools.coldstart``), ``collect`` (always: stop leftovers, fetch, facts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, computed_field

from runner.errors import ParseError
from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.markdown import markdown_table
from runner.parse.vllm_log import parse_log_file

__all__ = ["KIND", "RECIPES", "breakdown"]

PLAYBOOKS = "playbooks/experiments/startup"

# cache: fresh (an empty compile/JIT cache dir per trial) | persistent (engine.cache_root) |
#        none (docker: no cache volume at all; process: same as fresh)
# page_cache: drop (sync; echo 3 > drop_caches) | warm (weights read first) | keep
# standin: why the stand-in cannot rehearse the mode (the trial is skipped with that reason)
RECIPES: dict[str, dict[str, Any]] = {
    "first_start": {"cache": "fresh", "page_cache": "drop"},
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
}


class StartupParams(ModeParams):
    poll_s: float = Field(default=0.05, gt=0, le=1.0, description="first-token poll interval (seed: 0.2)")
    RECIPE: ClassVar[dict[str, Any]] = {}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recipe(self) -> dict[str, Any]:
        return {"args": {}, "env": {}, "sleep_wake": False, "preload": False, "python_module": "", "standin": "",
                **self.RECIPE}


def _mode_model(mode: str) -> type[StartupParams]:
    return type(f"{mode.title().replace('_', '')}Params", (StartupParams,), {"RECIPE": RECIPES[mode]})


def _resources(ctx: TrialContext) -> Resources:
    # Every start drops or fills the page cache and holds the engine's GPUs: the node is the trial's.
    return Resources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True)


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


def _parsed_log(raw: Path) -> dict[str, Any]:

    path = raw / "server.log"
    if not path.is_file():
        return {}
    try:
        return parse_log_file(path)
    except ParseError:
        return {}


def _seconds_between(log: Mapping[str, Any], first: str, last: str) -> float | None:
    stamps = log.get("phase_ts") or {}
    if first not in stamps or last not in stamps:
        return None
    a, b = (datetime.strptime(f"2000-{stamps[k]}", "%Y-%m-%d %H:%M:%S.%f") for k in (first, last))
    return (b - a).total_seconds()


def breakdown(first_token_s: float, log: Mapping[str, Any]) -> dict[str, float]:
    """Split the wall time to the first token into the phases the log explains.

    ``weights_s`` is the model load; ``compile_s`` torch.compile; ``graph_capture_s`` CUDA graphs;
    ``kernel_jit_s`` the gap from graph capture to "init engine" done (kernel JIT and warm-up: on
    a real H200 the largest part of a cold start; from log timestamps, so to the second when the
    log has no milliseconds); ``engine_other_s`` the rest of "init engine" (profiling, KV
    allocation); ``other_s`` what no log line explains (process start, imports, API server, the
    first request). Absent lines give absent keys.
    """
    out: dict[str, float] = {}
    weights = log.get("model_load_s", log.get("weights_load_s"))
    if weights is not None:
        out["weights_s"] = float(weights)
    for key in ("compile_s", "graph_capture_s"):
        if key in log:
            out[key] = float(log[key])
    if "init_engine_s" in log:
        rest = max(0.0, float(log["init_engine_s"]) - out.get("compile_s", 0.0) - out.get("graph_capture_s", 0.0))
        jit = _seconds_between(log, "graph_capture", "init_engine")
        if jit is not None:
            out["kernel_jit_s"] = min(max(0.0, jit), rest)
            rest -= out["kernel_jit_s"]
        out["engine_other_s"] = rest
    explained = sum(out.values())
    out["other_s"] = max(0.0, first_token_s - explained)
    return {k: round(v, 3) for k, v in out.items()}


def _collect(ctx: TrialContext) -> dict[str, Any]:
    raw = _raw(ctx)
    timings = json.loads((raw / "timings.json").read_text())
    log = _parsed_log(raw)
    metrics: dict[str, Any] = {"first_token_s": round(timings["first_token_s"], 3)}
    metrics.update(breakdown(timings["first_token_s"], log))
    for key in ("compile_cache_hit", "init_engine_s", "kv_cache_tokens", "weights_load_s", "sleep_s", "wake_s",
                "sleep_freed_gib"):
        if key in log:
            metrics[key] = log[key]
    for key in ("resident_fraction_before", "wake_to_first_token_s", "wake_http_s", "sleep_http_s"):
        if timings.get(key) is not None:
            metrics[key] = timings[key]
    for key in ("gpu_mem_mib_asleep", "gpu_mem_mib_awake"):
        if timings.get(key):
            metrics[key] = sum(timings[key])
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


_REPORT_COLUMNS = ("first_token_s", "weights_s", "compile_s", "graph_capture_s", "kernel_jit_s", "engine_other_s",
                   "other_s",
                   "compile_cache_hit", "resident_fraction_before", "wake_to_first_token_s", "gpu_mem_mib_asleep",
                   "log_errors")


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    metrics = record.get("metrics") or {}
    return [{k: metrics.get(k) for k in _REPORT_COLUMNS}]


def _section(frame: Any, root: Path) -> str:
    from runner.report_charts import startup_chart  # noqa: PLC0415 - pandas and matplotlib: only when a report is built

    lines = ["\n## Startup: time to the first token, and where it went\n",
             "Each bar is one trial (repeats side by side: read the pairs, not a mean). Phases come from the "
             "server log; `other` is what no log line explains (process start, imports, API server).\n"]
    chart = startup_chart(frame, root / "startup.png")
    if chart is not None:
        lines.append(f"![startup phases]({chart.name})\n")
    ok = frame[frame["status"] == "ok"]
    if len(ok):
        cols = ["mode", "repeat", "first_token_s", "weights_s", "compile_s", "graph_capture_s", "kernel_jit_s",
                "engine_other_s", "other_s", "compile_cache_hit", "resident_fraction_before", "wake_to_first_token_s"]

        lines.append(markdown_table(ok[cols]))
    return "\n".join(lines)


KIND = ExperimentKind(
    name="startup",
    summary="wall seconds from the start command to the first token, explained phase by phase",
    phases=(
        Phase("prepare", f"{PLAYBOOKS}/prepare.yml"),
        Phase("measure", f"{PLAYBOOKS}/measure.yml", follow="server.log"),
        Phase("collect", "playbooks/experiments/engine/collect.yml", always=True),
    ),
    modes={mode: _mode_model(mode) for mode in RECIPES},
    default_modes=("first_start", "disk_cold", "page_cache_warm", "enforce_eager", "sleep_wake"),
    resources=_resources,
    collect=_collect,
    diagnose=_diagnose,
    needs_engine=True,
    report=KindReport("startup.csv", _rows, _section),
)
