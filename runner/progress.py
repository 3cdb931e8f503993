"""What the user sees while a campaign runs: trial n/N, host, phase, elapsed, live log line.

``RichProgress`` for a terminal, ``PlainProgress`` (one log line per event) for CI and pipes,
``QuietProgress`` for ``--quiet``. All are called from worker threads and lock internally.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["PlainProgress", "Progress", "QuietProgress", "RichProgress"]

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
            self.running[trial_id] = _Running(self.started, host, time.monotonic())
            return self.started

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
        r = self.state.running.get(trial_id)
        if r is not None:
            r.phase = phase
            logger.info("[%d/%d] %s: phase %s (%.1f s)", r.n, self.state.total, trial_id, phase,
                        time.monotonic() - r.started)

    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None:
        r = self.state.end(trial_id, status)
        n = r.n if r else self.state.done
        suffix = f": {reason}" if reason else ""
        logger.info("[%d/%d] %s: %s in %.1f s%s", n, self.state.total, trial_id, status, seconds, suffix)

    def note(self, message: str) -> None:
        logger.info("%s", message)


class RichProgress(QuietProgress):
    """A live table of running trials, refreshed a few times a second."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=True)
        self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                          get_renderable=self._render)

    def _render(self) -> Any:
        from rich.table import Table

        s = self.state
        table = Table(box=None, show_header=True, header_style="bold", expand=False)
        for col in ("trial", "host", "phase", "elapsed", "now"):
            table.add_column(col, overflow="ellipsis", no_wrap=True, max_width=60 if col == "now" else None)
        now = time.monotonic()
        with s.lock:
            running = list(s.running.items())
        for trial_id, r in running:
            table.add_row(f"[{r.n}/{s.total}] {trial_id}", r.host, r.phase, f"{now - r.started:5.1f} s",
                          r.line or r.task)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(s.counts.items())) or "none finished yet"
        table.caption = f"{s.done}/{s.total} done: {counts}"
        return table

    def start(self, total: int, kept: int) -> None:
        super().start(total, kept)
        if kept:
            self.console.print(f"{kept} trial(s) kept from earlier runs")
        self._live.start()

    def phase(self, trial_id: str, phase: str) -> None:
        r = self.state.running.get(trial_id)
        if r is not None:
            r.phase, r.task, r.line = phase, "", ""

    def task(self, trial_id: str, task: str) -> None:
        r = self.state.running.get(trial_id)
        if r is not None:
            r.task = task

    def log_line(self, trial_id: str, line: str) -> None:
        r = self.state.running.get(trial_id)
        if r is not None:
            r.line = line.strip()

    def trial_finished(self, trial_id: str, status: str, reason: str, seconds: float) -> None:
        from rich.markup import escape

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
