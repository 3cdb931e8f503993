"""The startup kind end to end on the controller side: a trial's fetched files (a real vLLM 0.24.0
log, the timer's timings.json) become metrics, startup.csv columns, the report's tables and the
chart's stacked phases; the recipes say what first_start and disk_cold start from."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from runner.experiments.base import TrialContext
from runner.experiments.startup import KIND, PHASE_COLUMNS, RECIPES, before_start
from runner.parse.vllm_log import parse_log_file
from runner.report import build_report
from runner.report_charts import STARTUP_PHASES, startup_figure
from tests.unit.runner.test_startup_timeline import FIRST_START, REAL, timings_for

BYTECODE = {"order": ["vllm", "torch"], "packages": {
    "torch": {"modules": 300, "current": 300, "fraction": 1.0},
    "vllm": {"modules": 100, "current": 25, "fraction": 0.25}}}


def trial_files(raw: Path, log: Path, **before: Any) -> dict[str, Any]:
    raw.mkdir(parents=True)
    shutil.copy(log, raw / "server.log")
    _, timings = timings_for(parse_log_file(log))
    timings["before_start"] = {"cache_state": "warm", "cache_files": {"vllm": 3, "triton": 40}, "cache_bytes": 9,
                               "bytecode": BYTECODE, **before}
    (raw / "timings.json").write_text(json.dumps(timings))
    return timings


def test_recipes_start_first_start_from_an_empty_persistent_cache() -> None:
    assert RECIPES["first_start"] == {"cache": "persistent", "empty_cache": True, "page_cache": "drop"}
    assert RECIPES["disk_cold"] == {"cache": "persistent", "page_cache": "drop"}  # warm caches, cold page cache
    assert RECIPES["fresh_container"]["cache"] == "none"
    assert KIND.modes["disk_cold"]().recipe["empty_cache"] is False  # shown in plan.json


def test_before_start_reads_the_cache_state_and_the_main_package_s_bytecode() -> None:
    out = before_start({"before_start": {"cache_state": "empty", "cache_files": {"vllm": 0}, "cache_bytes": 0,
                                         "bytecode": BYTECODE}})
    assert out == {"cache_state": "empty", "cache_files": 0, "cache_bytes": 0, "pyc_warm_fraction": 0.25,
                   "pyc_warm_fraction_all": round(325 / 400, 4)}
    assert before_start({}) == {}  # an older timer: absent, never a zero


def test_collect_turns_the_fetched_files_into_the_timeline_and_the_start_s_state(tmp_path: Path) -> None:
    trial = tmp_path / "trials" / "t"
    timings = trial_files(trial / "raw" / "h", FIRST_START)
    timings.update(gpu_mem_mib_after_stop=[3, 1], node_after_stop={"page_cache_bytes": 3 * 2**30 // 2})
    (trial / "raw" / "h" / "timings.json").write_text(json.dumps(timings))
    metrics = KIND.collect(TrialContext(mode="first_start", params={}, engine={}, trial_dir=trial, host="h"))
    # What the stop left: memory on the GPUs, the page cache the next trial starts from.
    assert (metrics["gpu_mem_mib_after_stop"], metrics["page_cache_gib_after_stop"]) == (4, 1.5)
    assert metrics["first_token_s"] == round(timings["first_token_s"], 3)
    assert set(PHASE_COLUMNS) <= metrics.keys()
    assert metrics["other_s"] <= 0.05 * metrics["first_token_s"]
    assert (metrics["timeline_resolution_s"], metrics["timeline_sources"]) == (1.0, "timer+log+proc")
    assert (metrics["cache_state"], metrics["cache_files"], metrics["pyc_warm_fraction"]) == ("warm", 43, 0.25)
    assert metrics["compile_cache_hit"] is False  # from the log, whatever the cache state says


def results_folder(root: Path) -> None:
    plan = []
    eager = REAL / "vllm-0.24.0-h200-enforce_eager.log"
    for mode, repeat, log in (("first_start", 1, FIRST_START), ("enforce_eager", 1, eager)):
        tid = f"startup.{mode}.r{repeat}@h"
        planned = {"id": tid, "host": "h", "experiment": "startup", "kind": "startup", "mode": mode, "repeat": repeat,
                   "params": {"recipe": {"args": {}}}, "engine": {"kind": "vllm", "model": "/m"}, "timeout_s": 60}
        plan.append(planned)
        trial = root / "trials" / tid
        trial_files(trial / "raw" / "h", log)
        metrics = KIND.collect(TrialContext(mode=mode, params={}, engine={}, trial_dir=trial, host="h"))
        (trial / "trial.json").write_text(json.dumps({**planned, "status": "ok", "reason": "", "duration_s": 1.0,
                                                      "engine_label": "vllm", "metrics": metrics}))
    (root / "plan.json").write_text(json.dumps({"campaign": "demo", "trials": plan}))


def test_the_report_has_the_new_columns_says_the_resolution_and_draws_the_chart(tmp_path: Path) -> None:
    results_folder(tmp_path)
    build_report(tmp_path)
    with (tmp_path / "startup.csv").open() as fh:
        rows = {r["mode"]: r for r in csv.DictReader(fh)}
    for column in (*PHASE_COLUMNS, "other_s", "named_fraction", "timeline_resolution_s", "cache_state",
                   "pyc_warm_fraction"):
        assert column in rows["first_start"], column
    assert rows["enforce_eager"]["compile_s"] == "" and float(rows["enforce_eager"]["kernel_jit_s"]) == 8.0
    report = (tmp_path / "report.md").read_text()
    assert "Phase boundaries: 2 trials to 1 s. vLLM stamps its lines to the whole second" in report
    assert "| mode | repeat | first_token_s | api_imports_s |" in report
    assert "| mode | repeat | compile_cache_hit | cache_state |" in report
    assert (tmp_path / "startup.png").stat().st_size > 10_000


def test_the_chart_stacks_every_timeline_phase_and_keeps_repeats_together() -> None:
    assert [c for c, _ in STARTUP_PHASES] == [*PHASE_COLUMNS, "other_s"]
    rows = []
    for mode, repeat in (("first_start", 1), ("disk_cold", 1), ("disk_cold", 2)):
        parts = {c: 1.0 + i for i, c in enumerate(PHASE_COLUMNS)}
        rows.append({"trial_id": f"s.{mode}.r{repeat}@h", "mode": mode, "repeat": repeat, "host": "h",
                     "status": "ok", "first_token_s": sum(parts.values()), "other_s": 0.0,
                     "timeline_resolution_s": 1.0, **parts})
    fig = startup_figure(pd.DataFrame(rows).convert_dtypes())
    try:
        ax = fig.axes[0]
        assert len(ax.containers) == len(PHASE_COLUMNS)  # other_s is 0 everywhere: not drawn
        tops = [sum(c[i].get_height() for c in ax.containers) for i in range(3)]
        assert tops == [sum(1.0 + i for i in range(len(PHASE_COLUMNS)))] * 3
        x = [bar.get_x() for bar in ax.containers[0]]
        assert x[2] - x[1] < x[1] - x[0]  # disk_cold r1 and r2 side by side, a gap before them
        assert "phase boundaries to 1 s (whole-second log stamps)" in ax.get_xlabel()
    finally:
        plt.close(fig)
