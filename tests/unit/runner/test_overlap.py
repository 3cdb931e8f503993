"""A trial's Ansible run started early waits for its turn (runner/overlap.py, plugins/lookup/turn.py).

Real ansible-runner runs of a two-task playbook with the project's ansible.cfg: the first task is
the wait, the second stands for the trial's node work (it writes a marker file). The marker must
appear only after ``go``: never after ``cancel``, never when the process holding the turn dies.
Nothing a run started outlives its test: each run has a lease (execute.start_phase gives one to a
run started without), a stopped run is reaped by it, and every test checks so at its end. A test
lets a run go only once ansible-playbook has reached its wait (the task has started), never after a
fixed sleep: under load it took longer than 3 s, and its wait was then shown as the trial's task.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodetools.coldstart import RUNNER_LEASE_ENV, _mark_window_over
from runner.execute import start_phase
from runner.experiments.base import Phase
from runner.overlap import EarlyRun, MarkerWatch, Overlap, Turn
from runner.supervise import LEASE_VARIABLE, reap

REPO = Path(__file__).resolve().parents[3]

PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Wait for the previous trial on this node to end
      ansible.builtin.debug:
        msg: "waited {{ lookup('turn', exp_turn_file, timeout=exp_turn_timeout_s) }} s for the node"
    - name: The trial's node work
      ansible.builtin.command:
        argv: [touch, "{{ marker }}"]
"""


_LEASES: list[str] = []


@pytest.fixture(autouse=True)
def _nothing_outlives_the_test() -> Iterator[None]:
    """Every process of the test's runs is gone at its end (a leftover is stopped, and fails it)."""
    yield
    leases, _LEASES[:] = list(_LEASES), []
    left = {lease: reap(lease, exact=True) for lease in leases}
    assert not any(left.values()), f"processes outlived their run: {left}"


WAIT_TASK = "Wait for the previous trial on this node to end"


class Started(list[str]):
    """Every task the run started, as ansible-runner reported it (before the turn too)."""

    def wait_for(self, name: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while name not in self:
            assert time.monotonic() < deadline, f"task {name!r} never started"
            time.sleep(0.05)


def _early(tmp_path: Path, turn: Turn | None = None,
           playbook: str = PLAYBOOK) -> tuple[EarlyRun, Path, list[str], Started]:
    (tmp_path / "play.yml").write_text(playbook)
    (tmp_path / "inventory").write_text("localhost ansible_connection=local "
                                        f"ansible_python_interpreter={sys.executable}\n")
    trial_dir = tmp_path / "trial"
    turn_file = trial_dir / "ansible" / "turn"
    early = EarlyRun("t.r1@localhost", trial_dir, turn or Turn(turn_file))
    marker = tmp_path / "node-work-done"
    tasks: list[str] = []
    started = Started()

    def on_task(name: str) -> None:
        started.append(name)
        early.task(name)

    early.running = start_phase(
        phase="trial", playbook=tmp_path / "play.yml", project_dir=REPO, private_data_dir=trial_dir / "ansible",
        inventory=tmp_path / "inventory", limit="localhost",
        extravars={"exp_turn_file": str(turn_file), "exp_turn_timeout_s": 60, "marker": str(marker)},
        timeout_s=120, cancel=early.aborted.is_set, on_task=on_task)
    assert early.running.lease  # given one, though the test passed none: what a stop reaps by
    _LEASES.append(early.running.lease)
    return early, marker, tasks, started


def test_the_run_waits_for_go_then_does_its_work(tmp_path: Path) -> None:
    early, marker, tasks, started = _early(tmp_path)
    started.wait_for(WAIT_TASK)
    time.sleep(max(0.0, early.started + 3.0 - time.time()))  # it waits, blocked on the turn
    assert not marker.exists()
    went = time.time()
    early.go(tasks.append)
    result = early.wait()
    assert result.ok, result.failures
    assert marker.exists()
    assert tasks == ["The trial's node work"]  # nothing shown before the turn
    assert early.waited_s() > 2.9 and abs(early.waited_s() - (went - early.started)) < 0.5
    assert (tmp_path / "trial/ansible/turn").read_text().strip() == "go"


def test_a_run_let_go_before_its_trial_runs_then_hands_its_tasks_over_in_order_and_can_be_stopped(
        tmp_path: Path) -> None:
    # The trial before it has left the node (Phase.turn_from) but is still being recorded: the run
    # goes on, its tasks are held for its trial's display, and a failure of the trial before it
    # stops it (it ran on the node: its folder stays for the next run to repeat).
    early, marker, tasks, started = _early(tmp_path, playbook=PLAYBOOK + """\
    - name: The trial's long node work
      ansible.builtin.command:
        argv: [sleep, "60"]
""")
    started.wait_for(WAIT_TASK)  # ansible-playbook blocks on the turn
    early.let_go()
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists()  # its node work ran before its trial called go()
    started.wait_for("The trial's long node work")
    early.go(tasks.append)
    assert tasks == ["The trial's node work", "The trial's long node work"]
    stopping = time.monotonic()
    result = early.cancel()
    assert result is not None and result.status == "canceled" and time.monotonic() - stopping < 30
    assert (tmp_path / "trial").is_dir() and (tmp_path / "trial/ansible/turn").read_text().strip() == "go"


def test_a_cancelled_turn_fails_before_any_node_work_and_leaves_no_folder(tmp_path: Path) -> None:
    early, marker, _, _ = _early(tmp_path)
    time.sleep(1.0)
    result = early.cancel()
    assert result is not None and result.status == "failed"
    assert "not this run's turn: the runner wrote 'cancel'" in result.failures[0].message
    assert not marker.exists()
    assert not (tmp_path / "trial").exists()


def test_a_runner_that_dies_holding_the_turn_lets_no_node_work_happen(tmp_path: Path) -> None:
    turn_file = tmp_path / "trial" / "ansible" / "turn"
    turn_file.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from runner.overlap import Turn; t = Turn(Path(sys.argv[1])); "
                               "print('held', flush=True); time.sleep(60)", str(turn_file)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

        class Borrowed(Turn):  # the lock is the dead process's: this one only names the file
            def __init__(self, path: Path) -> None:
                self.path, self._fd = path, None

        early, marker, _, _ = _early(tmp_path, Borrowed(turn_file))
        time.sleep(1.0)
        holder.send_signal(signal.SIGKILL)
        result = early.wait()
    finally:
        holder.kill()
        holder.wait()
    assert result.status == "failed"
    assert "the runner wrote 'nothing'" in result.failures[0].message
    assert not marker.exists()


def test_the_next_run_starts_when_this_runs_node_program_marks_its_window_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker the timer writes before the engine's stop (nodetools/coldstart.py) starts the next
    trial's run once, from the watch's thread; only a marker with this run's lease counts (over SSH
    the node program has none: the collect's first task starts it, as before)."""
    starts: list[str] = []

    def start() -> Any:  # what starts the next run: here, which thread asked
        starts.append(threading.current_thread().name)
        return object()

    overlap = Overlap(start, "t.r2@localhost", lambda: False)
    phase = Phase("trial", "trial.yml", overlap_from="collect |", overlap_marker="window-over.json")
    marker = tmp_path / "window-over.json"
    watch = overlap.watch(phase, tmp_path, "results:1:t.r1@localhost")
    assert watch is not None
    try:
        marker.write_text('{"lease": "results:2:t.r1@localhost"}')  # an earlier run's
        time.sleep(5 * MarkerWatch.POLL_S)
        marker.write_text('{"lea')  # torn: the timer renames a whole file into place, never this
        time.sleep(5 * MarkerWatch.POLL_S)
        monkeypatch.delenv(LEASE_VARIABLE, raising=False)
        _mark_window_over(marker)  # a program that got no lease (over SSH)
        time.sleep(5 * MarkerWatch.POLL_S)
        assert starts == []
        monkeypatch.setenv(RUNNER_LEASE_ENV, "results:1:t.r1@localhost")
        _mark_window_over(marker)
        deadline = time.monotonic() + 10
        while not starts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert starts == ["overlap-marker"]
        overlap.on_task(phase, "collect | Remove the engine's secrets file")  # the old trigger: not again
    finally:
        watch.stop()
    assert starts == ["overlap-marker"] and overlap.tried
    assert RUNNER_LEASE_ENV == LEASE_VARIABLE  # the runner sets the name the node program reads


def test_a_marker_left_by_an_earlier_attempt_starts_nothing(tmp_path: Path) -> None:
    """An interrupted attempt's marker holds the same lease where the runner got the same pid (a
    container): left in the folder, it must not start the next run during the retry's window."""
    starts: list[str] = []
    overlap = Overlap(lambda: starts.append("start"), "t.r2@localhost", lambda: False)
    phase = Phase("trial", "trial.yml", overlap_from="collect |", overlap_marker="window-over.json")
    marker = tmp_path / "window-over.json"
    marker.write_text('{"lease": "results:1:t.r1@localhost"}')
    os.utime(marker, ns=(time.time_ns() - 5 * 10**9,) * 2)  # written 5 s before this attempt
    watch = overlap.watch(phase, tmp_path, "results:1:t.r1@localhost")
    assert watch is not None
    try:
        time.sleep(5 * MarkerWatch.POLL_S)
        assert starts == []
        marker.write_text('{"lease": "results:1:t.r1@localhost"}')  # this attempt's window is over
        deadline = time.monotonic() + 10
        while not starts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert starts == ["start"]
    finally:
        watch.stop()


def test_without_a_marker_the_collect_starts_the_next_run(tmp_path: Path) -> None:
    starts: list[str] = []

    def start() -> Any:
        starts.append("start")
        return object()

    overlap = Overlap(start, "t.r2@localhost", lambda: False)
    phase = Phase("trial", "trial.yml", overlap_from="collect |", overlap_marker="window-over.json")
    watch = overlap.watch(phase, tmp_path, "results:1:t.r1@localhost")
    assert watch is not None
    try:
        overlap.on_task(phase, "Prepare, then start, time and stop the engine")
        assert starts == []
        overlap.on_task(phase, "collect | Remove the engine's secrets file")
        overlap.on_task(phase, "collect | Done with the node")
    finally:
        watch.stop()
    assert starts == ["start"]
    # No marker named, or nothing to start: no watch at all.
    assert overlap.watch(Phase("trial", "trial.yml"), tmp_path, "x") is None
    assert Overlap(None, "", lambda: False).watch(phase, tmp_path, "x") is None
