"""The host's facts, read by its first trial's run (runner/host_checks.py's HostFacts): kept in
hosts/<host>/facts.json only when that run wrote them, else the reason every trial of the host
fails with. The phase results are what execute returns for such runs (data, not a mock)."""

from __future__ import annotations

import json
from pathlib import Path

from runner.execute import Failure, PhaseResult
from runner.host_checks import HostFacts
from runner.store import ResultsStore

FACTS = {"gpus": [], "memory": {"total_bytes": 2**34}, "numa": [], "kernel": "6.8.0", "page_cache_bytes": 2**30}


def _result(status: str, failures: list[Failure] | None = None) -> PhaseResult:
    return PhaseResult("trial", status, 0 if status == "successful" else 2, 1.0, 2.0, "", failures or [])


def _store(tmp_path: Path) -> tuple[ResultsStore, Path]:
    store = ResultsStore.open(tmp_path / "results")
    return store, store.begin_trial("startup.cold.r1@h1")


def test_facts_the_run_wrote_replace_an_earlier_runs_file(tmp_path: Path) -> None:
    store, trial_dir = _store(tmp_path)
    store.write_json("hosts/h1/facts.json", {**FACTS, "kernel": "an earlier run's"})
    facts = HostFacts(store, "h1")
    assert facts.pending and facts.dest(trial_dir).is_relative_to(trial_dir)  # a new folder: nothing there yet
    facts.dest(trial_dir).parent.mkdir(parents=True)
    facts.dest(trial_dir).write_text(json.dumps(FACTS))
    facts.settle(trial_dir, _result("successful"))
    assert not facts.pending and facts.error == "" and facts.facts == FACTS
    assert json.loads((store.root / "hosts/h1/facts.json").read_text()) == FACTS
    assert not facts.dest(trial_dir).exists()  # moved, not copied


def test_a_run_that_wrote_no_facts_gives_the_reason_and_keeps_the_earlier_file(tmp_path: Path) -> None:
    store, trial_dir = _store(tmp_path)
    store.write_json("hosts/h1/facts.json", FACTS)
    facts = HostFacts(store, "h1")
    unreachable = Failure("unreachable", "trial", "h1", "read_facts | Read GPUs", "Failed to connect to the host")
    facts.settle(trial_dir, _result("failed", [unreachable]))
    assert facts.facts is None
    assert facts.error == ("host preflight failed: unreachable in phase trial: h1: task 'read_facts | Read GPUs': "
                           "Failed to connect to the host")
    assert json.loads((store.root / "hosts/h1/facts.json").read_text()) == FACTS  # still there for --plan


def test_a_run_stopped_before_the_facts_says_so(tmp_path: Path) -> None:
    store, trial_dir = _store(tmp_path)
    facts = HostFacts(store, "h1")
    facts.settle(trial_dir, _result("timeout"))
    assert facts.error == "host preflight failed: no facts were written (the run was timeout)"
    assert not (store.root / "hosts/h1/facts.json").exists()


def test_facts_that_cannot_be_used_are_moved_aside_with_the_reason(tmp_path: Path) -> None:
    store, trial_dir = _store(tmp_path)
    facts = HostFacts(store, "h1")
    facts.dest(trial_dir).parent.mkdir(parents=True)
    facts.dest(trial_dir).write_text('{"memory": {"total_bytes": "lots"}}')
    facts.settle(trial_dir, _result("successful"))
    assert facts.facts is None and facts.error.startswith("host preflight failed: its facts (host_facts.json) "
                                                          "could not be used: ")
    assert "total_bytes" in facts.error and "quarantine" in facts.error
    assert not facts.dest(trial_dir).exists() and not (store.root / "hosts/h1/facts.json").exists()
