"""Start the next trial's Ansible run while this trial collects; its first task waits for its turn.

An ansible-playbook run spends 1.4-2.1 s on the H200 (0.9 s on a 2-core VM) before its first task:
imports, inventory, playbook and variables. A host's trials run one at a time, so that start can
overlap the current trial's collect (the measured window is over by then; nothing of the next
trial touches the node before its turn). The phase of the current trial names the task from which
this is safe (``Phase.overlap_from``); the runner then starts the next trial's first phase with
``exp_turn_file`` set, and that playbook's first task (``lookup('turn', ...)``,
plugins/lookup/turn.py) blocks on the file's lock, which :class:`Turn` holds. Once the current
trial is recorded the runner writes ``go`` and lets go; or ``cancel`` (the campaign was stopped,
the host stopped answering), and the waiting run fails before its first real task. A runner that
dies lets go of the lock without a word: the waiting run fails the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from runner.execute import PhaseResult, RunningPhase

__all__ = ["GO", "EarlyRun", "Turn"]

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
    ``task(name)`` for each task (nothing is shown before the turn), given by :meth:`go`."""

    def __init__(self, trial_id: str, trial_dir: Path, turn: Turn) -> None:
        self.trial_id = trial_id
        self.trial_dir = trial_dir
        self.turn = turn
        self.running: RunningPhase | None = None
        self.started = time.time()
        self.go_at: float | None = None
        self._on_task: Callable[[str], None] | None = None

    def task(self, name: str) -> None:
        if self._on_task is not None:
            self._on_task(name)

    def go(self, on_task: Callable[[str], None]) -> None:
        """Its turn: show its tasks from now on, let its first task pass."""
        self._on_task = on_task
        self.go_at = time.time()
        self.turn.release(GO)

    def wait(self) -> PhaseResult:
        assert self.running is not None
        return self.running.wait()

    def waited_s(self) -> float:
        """Seconds between the early start and the turn (what its phase's wall holds beyond its own)."""
        return round((self.go_at or time.time()) - self.started, 3)

    def cancel(self) -> PhaseResult | None:
        """Not its turn after all: its first task fails, nothing ran on the node; its folder goes.
        After :meth:`go` the run is the trial's own: it is waited for, its folder kept."""
        self.turn.release(CANCEL)
        result = self.running.wait() if self.running is not None else None
        if self.go_at is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.trial_dir)
        return result
