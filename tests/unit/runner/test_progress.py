"""The live display: the elapsed time and the trial ids are always whole, whatever the width (an id
wider than its column wraps, never cut); times say whether they are an offset into the trial or a
duration; the caption says about how long is left."""

from __future__ import annotations

import io
import logging
import time

import pytest
from rich.console import Console

from runner.progress import Eta, PlainProgress, RichProgress, clock, fit_widths

LONG_ID = "startup_long_experiment_name.page_cache_warm_with_a_long_suffix.r12@gpu-node-with-a-long-hostname-01"
LONG_HOST = "gpu-node-with-a-long-hostname-01"
LONG_TASK = "Wait for the first token of the engine the launch file started [bold]not markup[/bold] " * 2


def render(width: int, elapsed_s: float = 1234.5, phase_s: float = 4.2) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    progress = RichProgress(console=console)
    progress.start(12, 0)
    progress.stop()  # the live refresh is not under test: one render is
    progress.trial_started(LONG_ID, LONG_HOST)
    progress.trial_started("selftest.noop.r1@h", "h")
    progress.phase(LONG_ID, "measure")
    progress.task(LONG_ID, LONG_TASK)
    running = progress.state.running[LONG_ID]
    now = time.monotonic()
    running.started, running.phase_started = now - elapsed_s, now - phase_s
    console.print(progress._render())
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [120, 80])
def test_elapsed_is_whole_at_common_widths(width: int) -> None:
    lines = render(width)
    assert all(len(line) <= width for line in lines)
    header = next(line for line in lines if "elapsed" in line)
    row = next(line for line in lines if "1/12" in line)
    assert "20m 34s" in row  # 1234.5 s, whole
    assert "measure for 4.2 s" in row  # the time in the phase, said to be a duration
    assert header.index("elapsed") < row.index("20m 34s") + len("20m 34s")
    other = next(line for line in lines if "2/12" in line)
    assert "selftest.noop.r1@h" in other and "starting" in other


def test_wide_console_shows_everything_and_no_markup_is_read_from_a_log_line() -> None:
    lines = render(400)
    row = next(line for line in lines if "1/12" in line)
    assert LONG_ID in row and LONG_HOST in row and "[bold]not markup[/bold]" in row


def trial_column(lines: list[str], first_row: str) -> str:
    """The trial column's text of the row starting at ``first_row``, its wrapped lines joined."""
    header = next(line for line in lines if "elapsed" in line)
    start = header.index("trial")
    end = min(i for i in (header.find(c, start + 5) for c in (" host", " phase", " elapsed")) if i > 0)
    at = lines.index(first_row)
    pieces = [lines[at][start:end].strip()]
    for line in lines[at + 1:]:
        if line[:start].strip():  # the next row (or the caption)
            break
        pieces.append(line[start:end].strip())
    return "".join(pieces)


@pytest.mark.parametrize("width", [120, 80, 60])
def test_trial_ids_are_never_cut(width: int) -> None:
    lines = render(width)
    assert all(len(line) <= width for line in lines)
    assert trial_column(lines, next(line for line in lines if "1/12" in line)) == LONG_ID  # wrapped, whole


def test_the_id_of_the_issue_fits_on_one_line_at_80_columns() -> None:
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    progress = RichProgress(console=console)
    progress.start(3, 0)
    progress.stop()
    progress.trial_started("startup.first_start.r1@localhost", "localhost")
    progress.phase("startup.first_start.r1@localhost", "trial")
    progress.log_line("startup.first_start.r1@localhost", "INFO 05-20 10:00:01 [core.py:114] Initializing a V1 LLM")
    console.print(progress._render())
    row = next(line for line in console.export_text().splitlines() if "1/3" in line)
    assert "startup.first_start.r1@localhost" in row and "trial for" in row


def test_the_time_left_comes_from_the_finished_trials_of_each_kind_and_mode() -> None:
    planned = [("startup.cold.r1@a", "a"), ("startup.cold.r2@a", "a"), ("startup.warm.r1@a", "a"),
               ("startup.cold.r1@b", "b"), ("offload.x.r1@b", "b")]
    eta = Eta(planned)
    assert eta.seconds_left({}) is None  # nothing finished: no estimate
    eta.finished("startup.cold.r1@a", 100.0)
    # a: cold r2 100 + warm (no warm yet: the mean of all, 100); b: cold 100 + offload 100; longest host
    assert eta.seconds_left({}) == 200.0
    eta.finished("startup.warm.r1@a", 20.0)
    eta.finished("startup.cold.r1@b", 0.0)  # not tried: says nothing
    assert eta.key("startup.warm.r1@a") == "startup.warm" and eta.key("odd") == "odd"
    # a: cold r2 running for 30 s of its 100; b: offload, unseen: the mean of 100 and 20
    assert eta.seconds_left({"startup.cold.r2@a": ("a", 30.0)}) == 70.0
    assert eta.seconds_left({"startup.cold.r2@a": ("a", 30.0), "offload.x.r1@b": ("b", 59.0)}) == 70.0
    assert eta.seconds_left({"startup.cold.r2@a": ("a", 130.0)}) == 60.0  # over its time: 0, not negative


def test_the_caption_says_about_how_long_is_left() -> None:
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    progress = RichProgress(console=console)
    progress.start(3, 0, [("s.m.r1@h", "h"), ("s.m.r2@h", "h"), ("s.m.r3@h", "h")])
    progress.stop()
    progress.trial_started("s.m.r1@h", "h")
    progress.trial_finished("s.m.r1@h", "ok", "", 90.0)
    progress.trial_started("s.m.r2@h", "h")
    console.print(progress._render())
    caption = console.export_text()
    assert "1/3 done: ok 1; about 3m 00s left" in caption or "1/3 done: ok 1; about 2m 59s left" in caption


def test_fit_widths_never_shrinks_the_number_or_the_elapsed_time() -> None:
    natural = {"#": 5, "trial": 100, "host": 40, "phase": 20, "elapsed": 7, "now": 90}
    for width in (200, 120, 80, 60, 45):
        widths = fit_widths(natural, width)
        assert (widths["#"], widths["elapsed"]) == (5, 7)
        assert sum(w + 2 for w in widths.values() if w > 0) <= width


@pytest.mark.parametrize(("seconds", "text"), [(4.24, "4.2 s"), (59.9, "59.9 s"), (61, "1m 01s"), (1234.5, "20m 34s"),
                                               (3725, "1h 02m"), (-1, "0.0 s")])
def test_clock(seconds: float, text: str) -> None:
    assert clock(seconds) == text


def test_plain_phase_line_says_offset_and_duration(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="runner.progress")
    progress = PlainProgress()
    progress.start(1, 0)
    progress.trial_started("t", "h")
    progress.phase("t", "prepare")
    progress.state.running["t"].phase_started -= 3.0
    progress.state.running["t"].started -= 4.0
    progress.phase("t", "measure")
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("[1/1] t: phase prepare starts at ") and m.endswith(" s into the trial") for m in lines)
    measure = next(m for m in lines if "phase measure" in m)
    assert measure.removeprefix("[1/1] t: ") == "phase measure starts at 4.0 s into the trial (prepare took 3.0 s)"
