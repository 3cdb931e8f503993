"""What the user sees while a campaign runs: trial n/N, host, phase, elapsed, live log line.

``RichProgress`` for a terminal, ``PlainProgress`` (one log line per event) for CI and pipes,
``QuietProgress`` for ``--quiet``. All are called from worker threads and lock internally.

Times say what they measure: ``elapsed`` is the time since the trial started, ``measure for 4.2 s``
the time spent in the current phase, and a plain log line says "phase measure starts at 4.2 s into
the trial (prepare took 3.9 s)". The live table never cuts a trial id (it wraps one wider than the
console; the host column, which the id already names, goes first), and its caption estimates the
time left (:class:`Eta`) from this run's finished trials.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.cells import cell_len
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = ["Eta", "PlainProgress", "Progress", "QuietProgress", "RichProgress", "clock"]

logger = logging.getLogger("runner.progress")


class Progress(Protocol):
    def start(self, total: int, kept: int, planned: Sequence[tuple[str, str]] = ()) -> None: ...
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


_KIND_MODE = re.compile(r"^(?P<key>.+)\.r\d+@")


class Eta:
    """The time left, from this run's finished trials: each kind and mode (a trial id's
    ``<experiment>.<mode>`` before ``.r<n>@<host>``) takes what its finished trials took on average
    (one with none yet, what every finished trial took); a host works through its trials one after
    the other, hosts side by side, so the time left is the longest host's. None before any trial
    finished."""

    def __init__(self, planned: Sequence[tuple[str, str]] = ()) -> None:
        self.waiting: dict[str, str] = dict(planned)  # trial id -> host, not started yet
        self.took: dict[str, list[float]] = {}

    @staticmethod
    def key(trial_id: str) -> str:
        match = _KIND_MODE.match(trial_id)
        return match.group("key") if match else trial_id

    def finished(self, trial_id: str, seconds: float) -> None:
        self.waiting.pop(trial_id, None)
        if seconds > 0:  # a trial not tried (its host was lost) says nothing about the others
            self.took.setdefault(self.key(trial_id), []).append(seconds)

    def _expected(self, trial_id: str, overall: float) -> float:
        took = self.took.get(self.key(trial_id))
        return sum(took) / len(took) if took else overall

    def seconds_left(self, running: dict[str, tuple[str, float]]) -> float | None:
        """``running``: trial id -> (host, seconds since it started)."""
        every = [s for took in self.took.values() for s in took]
        if not every:
            return None
        overall = sum(every) / len(every)
        per_host: dict[str, float] = {}
        for trial_id, (host, elapsed) in running.items():
            per_host[host] = per_host.get(host, 0.0) + max(0.0, self._expected(trial_id, overall) - elapsed)
        for trial_id, host in self.waiting.items():
            if trial_id not in running:
                per_host[host] = per_host.get(host, 0.0) + self._expected(trial_id, overall)
        return max(per_host.values(), default=0.0)


@dataclass
class _State:
    total: int = 0
    started: int = 0
    done: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    running: dict[str, _Running] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    eta: Eta = field(default_factory=Eta)

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

    def end(self, trial_id: str, status: str, seconds: float = 0.0) -> _Running | None:
        with self.lock:
            self.done += 1
            self.counts[status] = self.counts.get(status, 0) + 1
            self.eta.finished(trial_id, seconds)
            return self.running.pop(trial_id, None)

    def seconds_left(self, now: float) -> float | None:
        with self.lock:
            return self.eta.seconds_left({t: (r.host, now - r.started) for t, r in self.running.items()})


class QuietProgress:
    """Prints nothing while running; the CLI prints the final summary."""

    def __init__(self) -> None:
        self.state = _State()

    def start(self, total: int, kept: int, planned: Sequence[tuple[str, str]] = ()) -> None:
        """``planned``: (trial id, host) of every trial this run will try, for the time left."""
        self.state.total = total
        self.state.eta = Eta(planned)

    def trial_started(self, trial_id: str, host: str) -> None:
        self.state.begin(trial_id, host)

    def phase(self, trial_id: str, phase: str) -> None:
        pass

    def task(self, trial_id: str, task: str) -> None:
        pass

    def log_line(self, trial_id: str, line: str) -> None:
        pass

    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None:
        self.state.end(trial_id, status, seconds)

    def note(self, message: str) -> None:
        pass

    def stop(self) -> None:
        pass


class PlainProgress(QuietProgress):
    """One line per event through ``logging``: greppable in CI logs."""

    def start(self, total: int, kept: int, planned: Sequence[tuple[str, str]] = ()) -> None:
        super().start(total, kept, planned)
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
        r = self.state.end(trial_id, status, seconds)
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
# the live line first, then the host (the trial id ends with it), the phase last. "#" and "elapsed"
# never shrink; the trial column, narrowed, wraps its ids onto more lines: an id is never cut.
_SHRINK = (("now", 16), ("host", 0), ("now", 0), ("trial", 28), ("phase", 8), ("trial", 12), ("phase", 0))


def fit_widths(natural: dict[str, int], width: int) -> dict[str, int]:
    """Column widths (without padding) that fit ``width``; a column at 0 is left out; the trial
    column narrower than its natural width wraps its ids."""
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
        left = s.seconds_left(now)
        if left is not None and s.done < s.total:
            caption += f"; about {clock(left)} left"
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
            whole = col == "trial"  # an id is never cut: it folds onto a second line
            table.add_column(col, width=widths[col], no_wrap=not whole, overflow="fold" if whole else "ellipsis",
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

    def start(self, total: int, kept: int, planned: Sequence[tuple[str, str]] = ()) -> None:
        super().start(total, kept, planned)
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
        r = self.state.end(trial_id, status, seconds)
        colour = {"ok": "green", "failed": "red", "skipped": "yellow"}.get(status, "magenta")
        n = f"\\[{r.n}/{self.state.total}] " if r else ""
        suffix = escape(f": {reason}") if reason else ""
        self.console.print(f"{n}{escape(trial_id)} [{colour}]{status}[/] in {seconds:.1f} s{suffix}",
                           highlight=False)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False)

    def stop(self) -> None:
        self._live.stop()
