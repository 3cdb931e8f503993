"""What the user sees while a campaign runs: trial n/N, host, phase, elapsed, live log line.

``RichProgress`` for a terminal, ``PlainProgress`` (one log line per event) for CI and pipes,
``QuietProgress`` for ``--quiet``. All are called from worker threads and lock internally.

Times say what they measure: ``elapsed`` is the time since the trial started, ``measure for 4.2 s``
the time spent in the current phase, and a plain log line says "phase measure starts at 4.2 s into
the trial (prepare took 3.9 s)".
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.cells import cell_len
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = ["PlainProgress", "Progress", "QuietProgress", "RichProgress", "clock"]

logger = logging.getLogger("runner.progress")


class Progress(Protocol):
    def start(self, total: int, kept: int) -> None: ...
    def trial_started(self, trial_id: str, host: str) -> None: ...
    def phase(self, trial_id: str, phase: str) -> None: ...
    def task(self, trial_id: str, task: str) -> None: ...
    def log_line(self, trial_id: str, line: str) -> None: ...
    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None: ...
    def note(self, message: str) -> None: ...
    def stop(self) -> None: ...


@dataclass
class _Running:
    n: int
    host: str
    started: float
    phase: str = ""
    phase_started: float = 0.0
    task: str = ""
    line: str = ""


@dataclass
class _State:
    total: int = 0
    started: int = 0
    done: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    running: dict[str, _Running] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, trial_id: str, host: str) -> int:
        with self.lock:
            self.started += 1
            now = time.monotonic()
            self.running[trial_id] = _Running(self.started, host, now, phase_started=now)
            return self.started

    def enter_phase(self, trial_id: str, phase: str) -> tuple[_Running, str, float] | None:
        """Start ``phase``; return the trial, and the phase it leaves with the seconds spent in it."""
        with self.lock:
            r = self.running.get(trial_id)
            if r is None:
                return None
            now = time.monotonic()
            left = (r.phase, now - r.phase_started)
            r.phase, r.phase_started, r.task, r.line = phase, now, "", ""
            return r, left[0], left[1]

    def end(self, trial_id: str, status: str) -> _Running | None:
        with self.lock:
            self.done += 1
            self.counts[status] = self.counts.get(status, 0) + 1
            return self.running.pop(trial_id, None)


class QuietProgress:
    """Prints nothing while running; the CLI prints the final summary."""

    def __init__(self) -> None:
        self.state = _State()

    def start(self, total: int, kept: int) -> None:
        self.state.total = total

    def trial_started(self, trial_id: str, host: str) -> None:
        self.state.begin(trial_id, host)

    def phase(self, trial_id: str, phase: str) -> None:
        pass

    def task(self, trial_id: str, task: str) -> None:
        pass

    def log_line(self, trial_id: str, line: str) -> None:
        pass

    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None:
        self.state.end(trial_id, status)

    def note(self, message: str) -> None:
        pass

    def stop(self) -> None:
        pass


class PlainProgress(QuietProgress):
    """One line per event through ``logging``: greppable in CI logs."""

    def start(self, total: int, kept: int) -> None:
        super().start(total, kept)
        logger.info("%d trial(s) to run, %d kept from earlier runs", total, kept)

    def trial_started(self, trial_id: str, host: str) -> None:
        n = self.state.begin(trial_id, host)
        logger.info("[%d/%d] %s on %s: started", n, self.state.total, trial_id, host)

    def phase(self, trial_id: str, phase: str) -> None:
        entered = self.state.enter_phase(trial_id, phase)
        if entered is not None:
            r, left, seconds = entered
            took = f" ({left} took {seconds:.1f} s)" if left else ""
            logger.info("[%d/%d] %s: phase %s starts at %.1f s into the trial%s", r.n, self.state.total, trial_id,
                        phase, r.phase_started - r.started, took)

    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None:
        r = self.state.end(trial_id, status)
        n = r.n if r else self.state.done
        suffix = f": {reason}" if reason else ""
        logger.info("[%d/%d] %s: %s in %.1f s%s", n, self.state.total, trial_id, status, seconds, suffix)

    def note(self, message: str) -> None:
        logger.info("%s", message)


def clock(seconds: float) -> str:
    """A duration to read at a glance: ``4.2 s``, ``12m 03s``, ``1h 02m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


_COLUMNS = ("#", "trial", "host", "phase", "elapsed", "now")
_PADDING = 2  # one space either side of every column
# How the columns give way to a narrow console, in order (column, narrowest it gets at that step):
# the live line first, then the host and the trial id, the phase last. "#" and "elapsed" never shrink.
_SHRINK = (("now", 16), ("host", 16), ("trial", 28), ("now", 0), ("trial", 12), ("host", 4), ("phase", 8),
           ("trial", 6), ("phase", 0))


def fit_widths(natural: dict[str, int], width: int) -> dict[str, int]:
    """Column widths (without padding) that fit ``width``; a column at 0 is left out."""
    widths = dict(natural)
    for col, floor in _SHRINK:
        excess = sum(w + _PADDING for w in widths.values() if w > 0) - width
        if excess <= 0:
            break
        widths[col] = max(min(floor, widths[col]), widths[col] - excess)
        if floor == 0 and widths[col] < 6:  # a sliver says nothing: leave the column out
            widths[col] = 0
    return widths


class _Board:
    """The live table, laid out again for the console's width at every refresh (rich alone would
    squeeze every column alike, and cut the elapsed time first at 120 columns)."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def __rich_console__(self, console: Any, options: Any) -> Any:
        s = self.state
        now = time.monotonic()
        with s.lock:
            running = list(s.running.items())
            counts = ", ".join(f"{k} {v}" for k, v in sorted(s.counts.items())) or "none finished yet"
            caption = f"{s.done}/{s.total} done: {counts}"
        rows = [(f"{r.n}/{s.total}", trial_id, r.host,
                 f"{r.phase} for {clock(now - r.phase_started)}" if r.phase else "starting",
                 clock(now - r.started), r.line or r.task) for trial_id, r in running]
        natural = {col: max([cell_len(col), *(cell_len(row[i]) for row in rows)])
                   for i, col in enumerate(_COLUMNS)}
        widths = fit_widths(natural, options.max_width)
        shown = [i for i, col in enumerate(_COLUMNS) if widths[col] > 0]
        table = Table(box=None, show_header=True, header_style="bold", expand=False, caption=caption)
        for i in shown:
            col = _COLUMNS[i]
            table.add_column(col, width=widths[col], no_wrap=True, overflow="ellipsis",
                             justify="right" if col in ("#", "elapsed") else "left")
        for row in rows:
            table.add_row(*(Text(row[i]) for i in shown))
        yield table


class RichProgress(QuietProgress):
    """A live table of running trials, refreshed a few times a second."""

    def __init__(self, console: Any = None) -> None:
        super().__init__()
        self.console = console or Console(stderr=True)
        self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                          get_renderable=self._render)

    def _render(self) -> Any:
        return _Board(self.state)

    def start(self, total: int, kept: int) -> None:
        super().start(total, kept)
        if kept:
            self.console.print(f"{kept} trial(s) kept from earlier runs")
        self._live.start()

    def phase(self, trial_id: str, phase: str) -> None:
        self.state.enter_phase(trial_id, phase)

    def task(self, trial_id: str, task: str) -> None:
        r = self.state.running.get(trial_id)
        if r is not None:
            r.task = task

    def log_line(self, trial_id: str, line: str) -> None:
        r = self.state.running.get(trial_id)
        if r is not None:
            r.line = line.strip()

    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None:

        r = self.state.end(trial_id, status)
        colour = {"ok": "green", "failed": "red", "skipped": "yellow"}.get(status, "magenta")
        n = f"\\[{r.n}/{self.state.total}] " if r else ""
        suffix = escape(f": {reason}") if reason else ""
        self.console.print(f"{n}{escape(trial_id)} [{colour}]{status}[/] in {seconds:.1f} s{suffix}",
                           highlight=False)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False)

    def stop(self) -> None:
        self._live.stop()
