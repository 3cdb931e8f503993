"""The startup section of a large campaign: medians per mode where per-trial tables and bars would
run to thousands of rows (every trial stays in startup.csv), and the chart's warning read from the
table, not from every trial's record again."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from PIL import Image

from runner.experiments.startup import KIND
from runner.report_charts import MAX_TRIAL_BARS

SECTION = KIND.report.section if KIND.report is not None else None


def frame(repeats: int) -> pd.DataFrame:
    rows = []
    for mode, base in (("first_start", 100.0), ("disk_cold", 50.0)):
        for r in range(1, repeats + 1):
            rows.append({"trial_id": f"s.{mode}.r{r}@h", "host": "h", "mode": mode, "repeat": r, "status": "ok",
                         "reason": "", "first_token_s": base + r, "weights_s": float(r), "other_s": base,
                         "named_fraction": 0.5, "cache_state": "warm", "cache_files": 3, "compile_cache_hit": True,
                         "stop_s": 1.5, "engine": "stand-in", "rehearsal_model": "", "load_format": ""})
    columns = dict.fromkeys([*rows[0], *KIND.report.rows({})[0]])  # type: ignore[union-attr, arg-type]
    return pd.DataFrame(rows).reindex(columns=list(columns)).convert_dtypes()


def test_a_large_campaign_gets_medians_per_mode_and_says_so(tmp_path: Path) -> None:
    assert SECTION is not None
    text = SECTION(frame(MAX_TRIAL_BARS), tmp_path)  # 120 ok trials
    assert "120 trials are too many to draw one by one: each bar is a mode (and host)" in text
    assert "| mode | n | first_token_s | weights_s | other_s | named_fraction |" in text
    assert "| first_start | 60 | 130.5 | 30.5 | 100.0 | 0.5 |" in text
    assert "| mode | n | cache_files | stop_s |" in text  # words (cache_state, compile_cache_hit) stay in the CSV
    assert text.count("\n| first_start |") == 2 and "| 60 | first_start" not in text
    assert "stand-in engine" in Image.open(tmp_path / "startup.png").text["Title"]  # read from the rows: no trial.json


def test_a_small_campaign_keeps_a_row_and_a_bar_per_trial(tmp_path: Path) -> None:
    assert SECTION is not None
    text = SECTION(frame(3), tmp_path)
    assert "Each bar is one trial" in text
    assert "| mode | repeat | first_token_s |" in text and text.count("\n| first_start | 3 |") == 2


def test_each_row_names_the_engine_its_trial_ran() -> None:
    assert KIND.report is not None
    record = {"engine_label": "vllm", "engine": {"kind": "vllm", "rehearsal_model": "qwen3-0.8b",
                                                 "args": {"load-format": "dummy"}}, "metrics": {"first_token_s": 9.0}}
    row = KIND.report.rows(record)[0]  # type: ignore[arg-type]
    assert (row["engine"], row["rehearsal_model"], row["load_format"], row["first_token_s"]) == (
        "vllm", "qwen3-0.8b", "dummy", 9.0)
