"""Results store: atomic writes, resume decisions, earlier attempts kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.errors import ResultsLockedError, ResultsWriteError, RunnerError
from runner.plan import Trial
from runner.results_lock import ResultsLock
from runner.store import ResultsStore, atomic_write_text


def make_trial(mode: str = "noop", params: dict[str, object] | None = None) -> Trial:
    return Trial(id=f"x.{mode}.r1@h", host="h", experiment="x", kind="selftest", mode=mode, repeat=1,
                 params=params or {}, engine=None, timeout_s=10)


def test_atomic_write_leaves_old_content_when_the_write_fails(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "trial.json"
    atomic_write_text(target, "old\n")

    def boom(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(ResultsWriteError, match=f"cannot write {target}: disk full"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["trial.json"]  # no temp file left behind


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_results_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    # Before: mkstemp's 0600 made results unreadable to the team while charts were 0644.
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.json", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize(("status", "retry", "expected"), [
    ("ok", False, False), ("skipped", False, False), ("failed", False, False), ("failed", True, True),
    ("interrupted", False, True), ("running", False, True),
])
def test_resume_decisions(tmp_path: Path, status: str, retry: bool, expected: bool) -> None:
    store = ResultsStore.open(tmp_path / "r")
    trial = make_trial()
    assert store.decide(trial, retry_failed=retry) == (True, "new")
    store.begin_trial(trial.id)
    store.save_trial(trial.id, {**trial.as_dict(), "status": status})
    assert store.decide(trial, retry_failed=retry)[0] is expected


@pytest.mark.parametrize(("node", "retry", "expected"), [
    # Skipped on the node (another process held the GPU): --retry-failed runs it again, a plain resume keeps it.
    ({"skip": ""}, True, True), ({"skip": ""}, False, False), (None, True, True),
    # Skipped by the plan (the mode cannot run on this engine): running it again would only skip it again.
    ({"skip": "vLLM 0.24.0 reloads weights only through its default loader"}, True, False),
])
def test_retry_failed_reruns_a_skip_the_node_gave_not_one_the_plan_gave(
        tmp_path: Path, node: dict[str, str] | None, retry: bool, expected: bool) -> None:
    store = ResultsStore.open(tmp_path / "r")
    trial = make_trial()
    store.begin_trial(trial.id)
    record = {**trial.as_dict(), "status": "skipped",
              "reason": "GPU 0 has 2379 MiB in use (limit 2048): another process holds it"}
    if node is not None:
        record["node"] = node
    store.save_trial(trial.id, record)
    must_run, why = store.decide(trial, retry_failed=retry)
    assert must_run is expected
    assert why == ("retry skipped (the node's state then)" if expected else "kept (skipped)")


def test_changed_definition_reruns_and_keeps_the_old_attempt(tmp_path: Path) -> None:
    store = ResultsStore.open(tmp_path / "r")
    old = make_trial(params={"seconds": 1})
    store.begin_trial(old.id)
    store.save_trial(old.id, {**old.as_dict(), "status": "ok"})
    new = make_trial(params={"seconds": 2})
    assert store.decide(new, retry_failed=False) == (True, "definition changed")
    store.begin_trial(new.id)
    (kept,) = (store.root / "previous").iterdir()
    assert (kept / "trial.json").is_file()
    assert store.load_trial(new.id) is None


def test_fresh_moves_earlier_results_aside(tmp_path: Path) -> None:
    root = tmp_path / "camp"
    store = ResultsStore.open(root)
    store.write_json("run.json", {"runs": [1]})
    ResultsStore.open(root, fresh=True)
    assert not (root / "run.json").exists()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("camp.before-")]
    assert (aside / "run.json").is_file()


def test_fresh_keeps_the_folder_and_its_lock(tmp_path: Path) -> None:
    # The lock is inside the folder: --fresh moves what it holds, never the folder, so a second run
    # that starts meanwhile still finds the first one's lock.
    root = tmp_path / "camp"
    with ResultsLock(root):
        ResultsStore.open(root).write_json("plan.json", {"trials": []})
        inode = root.stat().st_ino
        ResultsStore.open(root, fresh=True)
        assert root.stat().st_ino == inode and [p.name for p in root.iterdir()] == [".lock"]
        with pytest.raises(ResultsLockedError):
            ResultsLock(root).acquire()


def test_fresh_never_moves_a_folder_that_holds_no_results(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(RunnerError, match="not a results folder, and nothing of it was moved"):
        ResultsStore.open(tmp_path, fresh=True)
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_stopped_run_marks_its_running_trials_interrupted(tmp_path: Path) -> None:
    store = ResultsStore.open(tmp_path / "r")
    running, done = make_trial("noop"), make_trial("sleep")
    for trial, status in ((running, "running"), (done, "ok")):
        store.begin_trial(trial.id)
        store.save_trial(trial.id, {**trial.as_dict(), "status": status, "started": 1.0})
    assert store.interrupt_running([running.id, done.id, "x.never.r1@h"], "the runner failed: KeyError") == [running.id]
    record = store.load_trial(running.id)
    assert record is not None and record["status"] == "interrupted"
    assert record["reason"] == "the run stopped before it ended (the runner failed: KeyError); the next run repeats it"
    assert (store.load_trial(done.id) or {}).get("status") == "ok"


def test_a_folder_the_disk_refuses_in_begin_trial_is_a_write_error(tmp_path: Path) -> None:
    # Before: a bare OSError out of a host's worker (a full disk's ENOSPC the same): a traceback.
    store = ResultsStore.open(tmp_path / "r")
    (store.root / "trials").write_text("in the way\n")
    with pytest.raises(ResultsWriteError, match=r"cannot write .*/trials/x\.noop\.r1@h: Not a directory"):
        store.begin_trial("x.noop.r1@h")
