"""``snapshot``: restore a started engine instead of starting it (CRIU, cuda-checkpoint, vllm snapshot).

The reference campaign never got a number: both of its routes stopped at a CRIU without its CUDA plugin. Here
every precondition is a gate checked on the node before anything runs (a skip with a reason a
user can act on), and every failure of the tools is recognised from their own logs
(``runner.parse.snapshot_logs``) and recorded as the trial's reason with the log tail. Phases:
``prepare`` (gates, launch file), ``measure`` (``nodetools.snapshot``), ``collect`` (always).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from runner.experiments.base import ExperimentKind, KindReport, ModeParams, Phase, Resources, TrialContext
from runner.markdown import markdown_table
from runner.parse.snapshot_logs import classify, explain, last_error_lines

__all__ = ["KIND"]

PLAYBOOKS = "playbooks/experiments/snapshot"


class SnapshotParams(ModeParams):
    criu: str = Field(default="criu", min_length=1, description="CRIU binary on the node (>= 4.1)")
    libdir: str = Field(default="", description="CRIU plugin folder (-L); default: CRIU_LIBS_DIR or its PLUGINDIR")
    cuda_checkpoint: str = Field(default="cuda-checkpoint", min_length=1)
    images_dir: str = Field(default="", description="where images go (default: the trial's node-side folder)")
    revision: str = Field(default="", description="vllm_snapshot: the model's 40-character revision")
    poll_s: float = Field(default=0.05, gt=0, le=1.0)


def _resources(ctx: TrialContext) -> Resources:
    # Dumps share /dev/shm and freeze whole process trees: the node is the trial's.
    return Resources(gpus=tuple(ctx.engine.get("gpus") or ()), exclusive=True)


def _raw(ctx: TrialContext) -> Path:
    assert ctx.trial_dir is not None
    return ctx.trial_dir / "raw" / ctx.host


_TIMINGS = ("first_token_s", "dump_s", "restore_s", "restore_to_first_token_s", "lock_s", "checkpoint_s",
            "unlock_s", "create_s", "image_bytes", "artifact_bytes")


def _collect(ctx: TrialContext) -> dict[str, Any]:
    timings = json.loads((_raw(ctx) / "timings.json").read_text())
    metrics: dict[str, Any] = {k: timings[k] for k in _TIMINGS if timings.get(k) is not None}
    for key in ("image_bytes", "artifact_bytes"):
        if key in metrics:
            metrics[key.replace("_bytes", "_gib")] = round(metrics.pop(key) / 2**30, 3)
    for key in ("gpu_mem_mib_before", "gpu_mem_mib_while", "gpu_mem_mib_after"):
        if timings.get(key):
            metrics[key] = sum(timings[key])
    if metrics.get("first_token_s") and metrics.get("restore_to_first_token_s"):
        metrics["speedup_vs_start"] = round(metrics["first_token_s"] / metrics["restore_to_first_token_s"], 1)
    return metrics


def _diagnose(ctx: TrialContext) -> str:

    raw = _raw(ctx)
    texts = [p.read_text(errors="replace") for p in raw.glob("*.log") if p.is_file()]
    timings = raw / "timings.json"
    if timings.is_file():
        texts.append(str(json.loads(timings.read_text()).get("error", "")))
    labels = classify("\n".join(texts))
    parts = [explain(labels)] if labels else []
    for name in ("dump.log", "restore.log", "snapshot-create.log", "snapshot-restore.log", "server.log"):
        tail = last_error_lines(raw / name)
        if tail:
            parts.append(f"{name} tail: " + " | ".join(tail))
            break
    return "; ".join(parts)


_COLUMNS = ("first_token_s", "dump_s", "image_gib", "restore_s", "restore_to_first_token_s", "speedup_vs_start",
            "lock_s", "checkpoint_s", "unlock_s", "gpu_mem_mib_before", "gpu_mem_mib_while", "gpu_mem_mib_after",
            "create_s", "artifact_gib")


def _rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    metrics = record.get("metrics") or {}
    return [{k: metrics.get(k) for k in _COLUMNS}]


def _section(frame: Any, root: Path) -> str:
    import pandas as pd  # noqa: PLC0415 - pandas costs ~1 s: only when a report is built, never for --plan

    lines = ["\n## Snapshot: restore a started engine instead of starting it\n",
             "Failed and skipped modes stay rows with their reasons, never zero-second results.\n"]
    cols = ["mode", "repeat", "status", *[c for c in _COLUMNS if c in frame.columns and frame[c].notna().any()]]
    lines.append(markdown_table(frame[cols]))
    startup = root / "startup.csv"
    ok = frame[frame["status"] == "ok"]
    if startup.is_file() and len(ok):
        s = pd.read_csv(startup)
        s = s[s["status"] == "ok"]
        side = [{"path to a serving engine": f"restore ({m})", "seconds to first token":
                 round(float(g["restore_to_first_token_s"].median()), 3)} for m, g in ok.groupby("mode")]
        side += [{"path to a serving engine": f"start ({m})", "seconds to first token":
                  round(float(g["first_token_s"].median()), 3)} for m, g in s.groupby("mode")]
        if "wake_to_first_token_s" in s and s["wake_to_first_token_s"].notna().any():
            side.append({"path to a serving engine": "wake from sleep", "seconds to first token":
                         round(float(s["wake_to_first_token_s"].median()), 3)})
        lines.append("\nRestore vs cold start vs sleep/wake (medians of this campaign's repeats):\n")
        lines.append(markdown_table(pd.DataFrame(side)))
    return "\n".join(lines)


KIND = ExperimentKind(
    name="snapshot",
    summary="dump and restore a started engine: CRIU, cuda-checkpoint, vllm snapshot",
    phases=(
        Phase("prepare", f"{PLAYBOOKS}/prepare.yml"),
        Phase("measure", f"{PLAYBOOKS}/measure.yml", follow="server.log"),
        Phase("collect", f"{PLAYBOOKS}/collect.yml", always=True),
    ),
    modes={"criu": SnapshotParams, "cuda_checkpoint": SnapshotParams, "vllm_snapshot": SnapshotParams},
    default_modes=("criu", "cuda_checkpoint", "vllm_snapshot"),
    resources=_resources,
    collect=_collect,
    diagnose=_diagnose,
    needs_engine=True,
    report=KindReport("snapshot.csv", _rows, _section),
)
