"""Start the next trial's Ansible run once this trial's measurement is over; its first task waits for its turn.

An ansible-playbook run spends 1.4-2.1 s on the H200 (0.9 s on a 2-core VM) before its first task:
imports, inventory, playbook and variables. A host's trials run one at a time, so that start can
overlap the end of the current trial (the measured window is over by then; nothing of the next
trial touches the node before its turn). The phase of the current trial names the file its node
program writes when its windows are over (``Phase.overlap_marker``: seen on a local connection,
:class:`MarkerWatch`, during the engine's stop) and the task from which this is safe anyway
(``Phase.overlap_from``: the collect); the runner then starts the next trial's first phase with
``exp_turn_file`` set, and that playbook's first task (``lookup('turn', ...)``,
plugins/lookup/turn.py) blocks on the file's lock, which :class:`Turn` holds. Once the current
trial has left the node (``Phase.turn_from``: its files are still copied to the controller and
its record written meanwhile), or else once it is recorded, the runner writes ``go`` and lets
go; or ``cancel`` (the campaign was stopped, the host stopped answering), and the waiting run
fails before its first real task. A run let go is its trial's own from then on: it runs and is
recorded even when the campaign stops or the host was lost meanwhile. A runner that dies lets go
of the lock without a word: the waiting run fails the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runner.errors import ResultsWriteError
from runner.execute import PhaseResult, RunningPhase
from runner.experiments.base import Phase

__all__ = ["GO", "EarlyRun", "MarkerWatch", "Overlap", "Turn", "start_early"]

logger = logging.getLogger(__name__)

GO = "go"
CANCEL = "cancel"


class Turn:
    """A file whose exclusive lock this process holds until :meth:`release` says go or cancel."""

    WIDTH = 8  # the file holds this many bytes from the start: writing the word needs no new block

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.pwrite(fd, b" " * self.WIDTH, 0)  # blank: a runner that dies leaves no word
        except OSError:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def release(self, word: str) -> None:
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, word.encode().ljust(self.WIDTH), 0)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class EarlyRun:
    """The next trial's first phase, started early; ``start`` starts it with these callbacks:
    ``task(name)`` for each task, handed to the trial's ``on_task`` given by :meth:`go`. Tasks that
    ran between :meth:`let_go` and :meth:`go` (the trial before it was still being recorded) are
    handed over then, in order: its own overlap with the trial after it starts from them."""

    def __init__(self, trial_id: str, trial_dir: Path, turn: Turn) -> None:
        self.trial_id = trial_id
        self.trial_dir = trial_dir
        self.turn = turn
        self.running: RunningPhase | None = None
        self.started = time.time()
        self.go_at: float | None = None
        self._on_task: Callable[[str], None] | None = None
        self._held: list[str] = []
        self.aborted = threading.Event()  # set by cancel() once let go: its run stops as on Ctrl-C
        self._cancelled = False
        self._lock = threading.Lock()  # task() comes from ansible-runner's thread, go() from the runner's

    def task(self, name: str) -> None:
        with self._lock:
            if self._on_task is None:
                if self.go_at is not None:  # before its turn only its wait for the turn runs: not shown
                    self._held.append(name)
                return
        self._on_task(name)

    def let_go(self) -> None:
        """Its turn: its first task may pass (the trial before it has left the node, or is done).
        Called from ansible-runner's event thread or the runner's: the lock makes one word final."""
        with self._lock:
            if self.go_at is not None or self._cancelled:
                return
            self.go_at = time.time()
            self.turn.release(GO)

    def go(self, on_task: Callable[[str], None]) -> None:
        """Its trial's turn: its tasks go to ``on_task`` from now on, those since it was let go
        first, and its first task passes if it was not let go yet."""
        while True:
            with self._lock:
                held, self._held = self._held, []
                if not held:
                    self._on_task = on_task
                    break
            for name in held:
                on_task(name)
        self.let_go()

    def wait(self) -> PhaseResult:
        assert self.running is not None
        return self.running.wait()

    def waited_s(self) -> float:
        """Seconds between the early start and the turn (what its phase's wall holds beyond its own)."""
        return round((self.go_at or time.time()) - self.started, 3)

    def cancel(self) -> PhaseResult | None:
        """Not its turn after all: its first task fails, nothing ran on the node; its folder goes.
        Once let go it runs on the node: it is stopped (``aborted``, which its run's cancel check
        reads) and waited for, its folder kept for the next run to repeat."""
        with self._lock:
            self._cancelled = True
            if self.go_at is None:
                self.turn.release(CANCEL)
            else:
                self.aborted.set()
        result = self.running.wait() if self.running is not None else None
        if self.go_at is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.trial_dir)
        return result


def start_early(start: Callable[[], EarlyRun], trial_id: str, otherwise: str) -> EarlyRun | None:
    """``start()``, or None when the early start failed (the trial then starts ``otherwise``, in
    its turn): a full results disk or a failed fork must not fail the trial before its turn."""
    try:
        return start()
    except (OSError, ResultsWriteError):
        logger.exception("could not start %s early; it starts %s", trial_id, otherwise)
        return None


class Overlap:
    """The host's next trial, which this trial's phase may start early (``Phase.overlap_from``):
    ``start()`` starts it (None when there is none, or its first playbook does not wait for its
    turn: ``Phase.waits_for_turn``); ``stopped()`` says the campaign is being stopped."""

    def __init__(self, start: Callable[[], EarlyRun] | None, next_trial_id: str,
                 stopped: Callable[[], bool]) -> None:
        self.next_trial_id, self._start, self._stopped = next_trial_id, start, stopped
        self.early: EarlyRun | None = None
        self.tried = False
        self._lock = threading.Lock()  # tasks come from ansible-runner's thread, the marker from a watch's

    def on_task(self, phase: Phase, task: str) -> None:
        """Called for each task of this trial's phase (from ansible-runner's event thread)."""
        with self._lock:
            if self.early is not None and phase.turn_from and task.startswith(phase.turn_from):
                if not self._stopped():  # stopped: the next trial is cancelled, never let go
                    self.early.let_go()  # this trial has left the node: what is left copies its files home
                return
            if phase.overlap_from and task.startswith(phase.overlap_from):
                self._start_once()

    def _start_once(self) -> None:
        if self.tried or self._start is None or self._stopped():
            return
        self.tried = True  # once: a start that failed is not tried again at the next task
        self.early = start_early(self._start, self.next_trial_id, "in its turn")

    def watch(self, phase: Phase, folder: Path, lease: str) -> MarkerWatch | None:
        """Start the next trial's run as soon as ``phase``'s node program writes its marker (in
        ``folder``, the trial's node folder) with ``lease``: only its own program on a local
        connection has it (the runner's environment; over SSH the collect's first task starts it).
        None when there is nothing to start early or to watch."""
        if not phase.overlap_marker or self._start is None:
            return None
        return MarkerWatch(folder / phase.overlap_marker, lease, self._marked).begin()

    def _marked(self) -> None:
        with self._lock:
            self._start_once()

    def cancel(self) -> None:
        if self.early is not None:
            self.early.cancel()
            self.early = None


class MarkerWatch:
    """Calls ``seen()`` once ``path`` holds JSON whose ``lease`` is ``lease``. A poll is one stat
    (0.02 s apart): the watch runs while the phase does (:meth:`stop`)."""

    POLL_S = 0.02

    # A marker older than the watch is an earlier attempt's (same results, same pid in a container):
    # it must not start the next run during this trial's window. The slack covers coarse file times.
    _SLACK_NS = 10_000_000

    def __init__(self, path: Path, lease: str, seen: Callable[[], None]) -> None:
        self.path, self.lease, self._seen = path, lease, seen
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="overlap-marker", daemon=True)
        self._began_ns = 0

    def begin(self) -> MarkerWatch:
        self._began_ns = time.time_ns()
        self._thread.start()
        return self

    def _marked(self) -> bool:
        try:
            found = self.path.stat()  # one stat a poll; a missing file is the usual answer
            if not stat.S_ISREG(found.st_mode) or found.st_mtime_ns < self._began_ns - self._SLACK_NS:
                return False
            return bool(self.lease) and json.loads(self.path.read_text()).get("lease") == self.lease
        except (OSError, ValueError, AttributeError):  # unreadable or not the JSON object the timer writes
            return False

    def _run(self) -> None:
        while not self._ended.wait(self.POLL_S):
            if self._marked():
                self._seen()
                return

    def stop(self) -> None:
        self._ended.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
