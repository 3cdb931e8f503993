"""Charts say what they measured: a stand-in engine or random weights in the subtitle and PNG
metadata; the startup chart's sleep/wake panel shows every repeat on a scale where a wake shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from matplotlib.container import BarContainer
from PIL import Image

from runner.report_charts import (
    STARTUP_TITLE,
    engine_note,
    offload_figure,
    offload_ttft_chart,
    startup_chart,
    startup_figure,
)


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def startup_frame() -> pd.DataFrame:
    rows = [
        {"trial_id": f"s.first_start.r{r}@h", "mode": "first_start", "repeat": r, "host": "h", "status": "ok",
         "first_token_s": 200.0 - r, "weights_s": 3.0, "other_s": 190.0 - r, "wake_to_first_token_s": None}
        for r in (1, 2)
    ] + [
        {"trial_id": f"s.sleep_wake.r{r}@h", "mode": "sleep_wake", "repeat": r, "host": "h", "status": "ok",
         "first_token_s": 60.0 + r, "weights_s": 3.0, "other_s": 50.0, "wake_to_first_token_s": wake}
        for r, wake in ((1, 0.12), (2, 0.18), (3, 0.15))
    ] + [
        {"trial_id": "s.sleep_wake.r4@h", "mode": "sleep_wake", "repeat": 4, "host": "h", "status": "failed",
         "first_token_s": None, "weights_s": None, "other_s": None, "wake_to_first_token_s": None},
    ]
    return pd.DataFrame(rows).convert_dtypes()


def turns_frame() -> pd.DataFrame:
    return pd.DataFrame([{"trial_id": "o.hbm_only.r1@h", "mode": "hbm_only", "repeat": 1, "status": "ok", "turn": t,
                          "ttft_median_s": 0.5 + t, "ttft_p90_s": 0.9 + t, "turn_wall_s": 10.0} for t in range(3)])


def write_trials(root: Path, frame: pd.DataFrame, engine: dict[str, Any],
                 recipe_args: dict[str, Any] | None = None) -> None:
    for trial_id in frame["trial_id"].unique():
        folder = root / "trials" / str(trial_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trial.json").write_text(json.dumps({
            "id": trial_id, "engine": engine, "engine_label": engine["kind"],
            "params": {"recipe": {"args": recipe_args or {}}}}))


@pytest.mark.parametrize(("engine", "recipe_args", "expected"), [
    ({"kind": "stand-in", "model": "/m"}, None, "stand-in engine"),
    ({"kind": "vllm", "model": "/m", "rehearsal_model": "qwen3-0.8b"}, None, "random weights (qwen3-0.8b)"),
    ({"kind": "vllm", "model": "/m"}, {"load-format": "dummy"}, "dummy weights"),
    ({"kind": "vllm", "model": "/m", "args": {"load-format": "dummy"}}, None, "dummy weights"),
])
def test_the_note_comes_from_the_trial_records(tmp_path: Path, engine: dict[str, Any],
                                               recipe_args: dict[str, Any] | None, expected: str) -> None:
    frame = startup_frame()
    write_trials(tmp_path, frame, engine, recipe_args)
    assert engine_note(frame, tmp_path).startswith(expected)


def test_a_config_only_preset_on_dummy_weights_says_both(tmp_path: Path) -> None:
    frame = startup_frame()
    write_trials(tmp_path, frame, {"kind": "vllm", "model": "/m", "rehearsal_model": "qwen3-32b",
                                   "args": {"load_format": "dummy"}})
    note = engine_note(frame, tmp_path)
    assert note.startswith("random weights (qwen3-32b)") and "dummy weights (--load-format dummy)" in note


def test_a_real_engine_on_real_weights_gets_no_note(tmp_path: Path) -> None:
    frame = startup_frame()
    write_trials(tmp_path, frame, {"kind": "vllm", "model": "/m"}, {"load-format": "runai_streamer"})
    assert engine_note(frame, tmp_path) == ""
    path = startup_chart(frame, tmp_path / "startup.png")
    assert path is not None and Image.open(path).text["Title"] == STARTUP_TITLE


def test_a_table_with_an_engine_column_needs_no_records(tmp_path: Path) -> None:
    frame = startup_frame().assign(engine=["vllm", "vllm", "stand-in", "stand-in", "stand-in", "stand-in"])
    assert engine_note(frame, tmp_path) == ("4 of 6 trials: stand-in engine: a rehearsal of the tooling, these "
                                            "timings say nothing about vLLM")


def test_startup_figure_is_subtitled_with_the_note() -> None:
    fig = startup_figure(startup_frame(), "stand-in engine: a rehearsal")
    assert fig is not None
    assert fig.get_suptitle() == "stand-in engine: a rehearsal"
    assert fig.axes[0].get_title() == STARTUP_TITLE
    assert startup_figure(startup_frame()).get_suptitle() == ""


def test_startup_png_says_random_weights(tmp_path: Path) -> None:
    frame = startup_frame()
    write_trials(tmp_path, frame, {"kind": "vllm", "model": "/m", "rehearsal_model": "qwen3-0.8b"})
    path = startup_chart(frame, tmp_path / "startup.png")
    assert path == tmp_path / "startup.png"
    meta = Image.open(path).text
    assert meta["Title"].startswith(STARTUP_TITLE) and "random weights (qwen3-0.8b)" in meta["Title"]
    assert "random weights" in meta["Description"]


def test_sleep_wake_panel_shows_every_repeat_on_a_log_scale() -> None:
    fig = startup_figure(startup_frame())
    assert fig is not None
    wake_ax = fig.axes[1]
    assert wake_ax.get_yscale() == "log"
    starts, wakes = wake_ax.containers[0], wake_ax.containers[1]
    assert [round(b.get_height(), 3) for b in starts] == [61.0, 62.0, 63.0]
    assert [round(b.get_height(), 3) for b in wakes] == [0.12, 0.18, 0.15]  # every repeat, not one median
    low, high = wake_ax.get_ylim()
    assert low < 0.12 and high > 63.0  # the wakes are inside the axis, not clipped at its floor
    assert [t.get_text() for t in wake_ax.get_xticklabels()] == ["r1", "r2", "r3"]


def test_offload_chart_says_stand_in(tmp_path: Path) -> None:
    turns = turns_frame()
    write_trials(tmp_path, turns, {"kind": "stand-in", "model": "/m"})
    path = offload_ttft_chart(turns, tmp_path / "offload_ttft.png")
    assert path is not None and "stand-in engine" in Image.open(path).text["Title"]
    fig = offload_figure(turns, "turn_wall_s", "s", "Offload: turn wall time", note="stand-in engine")
    assert fig is not None and fig.get_suptitle() == "stand-in engine"


def many_starts(repeats: int, hosts: int = 1, wake: bool = False) -> pd.DataFrame:
    """``repeats`` ok trials per mode and host: first_start's phases 10 s, 20 s, ... up the repeats."""
    rows = []
    for h in range(hosts):
        for mode, scale in (("first_start", 1.0), ("sleep_wake" if wake else "disk_cold", 0.5)):
            for r in range(1, repeats + 1):
                weights, other = 10.0 * r * scale, 5.0
                rows.append({"trial_id": f"s.{mode}.r{r}@h{h}", "mode": mode, "repeat": r, "host": f"h{h}",
                             "status": "ok", "first_token_s": weights + other, "weights_s": weights,
                             "other_s": other, "engine": "vllm",
                             "wake_to_first_token_s": 0.1 * r if mode == "sleep_wake" else None})
    return pd.DataFrame(rows).convert_dtypes()


def test_above_the_bar_limit_each_mode_gets_one_bar_of_medians() -> None:
    frame = many_starts(101)  # 202 ok trials
    fig = startup_figure(frame)
    assert fig is not None
    ax = fig.axes[0]
    assert ax.get_title() == ("Startup to first token, by phase: medians of 202 trials per mode (one bar per trial "
                              "up to 60)")
    weights, other = ax.containers[0], ax.containers[1]  # bottom up: weights, then other
    assert [b.get_height() for b in weights] == [510.0, 255.0]  # the median repeat (51) of each mode
    assert [b.get_height() for b in other] == [5.0, 5.0]
    assert len(ax.patches) == 2 * 2  # two phases x two modes: no bar per trial
    assert [t.get_text() for t in ax.get_xticklabels()] == ["first_start (n=101)", "disk_cold (n=101)"]
    marker = ax.containers[2]  # the first token: median, whisker to the 10th and 90th percentiles
    low, high = marker.lines[2][0].get_segments()[0][:, 1]
    assert (low, high) == pytest.approx((115.0, 915.0))
    assert "each phase's median" in ax.get_xlabel()
    assert startup_figure(many_starts(30)).axes[0].get_title() == STARTUP_TITLE  # 60 bars: one a trial


def test_many_hosts_get_a_bar_each_while_the_bars_stay_few(tmp_path: Path) -> None:
    labels = [t.get_text() for t in startup_figure(many_starts(20, hosts=3)).axes[0].get_xticklabels()]
    assert labels[:2] == ["first_start@h0 (n=20)", "first_start@h1 (n=20)"] and len(labels) == 6
    labels = [t.get_text() for t in startup_figure(many_starts(2, hosts=40)).axes[0].get_xticklabels()]
    assert labels == ["first_start (n=80)", "disk_cold (n=80)"]  # 80 bars of mode and host: per mode
    path = startup_chart(many_starts(101), tmp_path / "startup.png")
    assert path is not None and Image.open(path).text["Title"].startswith(f"{STARTUP_TITLE}: medians of 202")


def test_the_wake_panel_shows_medians_above_the_bar_limit() -> None:
    fig = startup_figure(many_starts(70, wake=True))
    wake_ax = fig.axes[1]
    starts, wakes = (c for c in wake_ax.containers if isinstance(c, BarContainer))
    assert [round(b.get_height(), 3) for b in wakes] == [3.55]  # the median of 0.1 ... 7.0
    assert [round(b.get_height(), 3) for b in starts] == [182.5]
    assert wake_ax.get_title() == "sleep_wake: start vs wake, medians of 70 repeats"
