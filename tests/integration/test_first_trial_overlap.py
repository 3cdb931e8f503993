"""The host's first trial reads the host's facts in its own Ansible run, before its own tasks: one
ansible-playbook start for a one-trial campaign, not one for the facts and one for the trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli import main

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _events(phase: dict[str, object]) -> list[dict[str, object]]:
    folder = Path(str(phase["artifact_dir"])) / "job_events"
    events = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    # Ansible's own events only: a "verbose" one (a line Python printed, e.g. a deprecation warning) has no event_data.
    return sorted((e for e in events if "event_data" in e), key=lambda e: int(e["counter"]))


def test_the_first_trial_reads_the_facts_in_its_own_run_before_its_tasks(tmp_path: Path) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(f"""\
name: overlap
inventory: {REPO / 'inventory/local'}
remote_dir: {tmp_path / 'node'}
experiments:
  - kind: selftest
    modes: [noop]
    repeats: 2
""")
    results = tmp_path / "results"
    assert main([str(campaign), "--quiet", "--no-follow", "--results", str(results)]) == 0
    first, second = (json.loads((results / "trials" / f"selftest.noop.r{r}@localhost" / "trial.json").read_text())
                     for r in (1, 2))
    facts = json.loads((results / "hosts/localhost/facts.json").read_text())
    assert first["host_facts"] == second["host_facts"] == facts and facts["memory"]["total_bytes"] > 0
    # No Ansible run of its own for the facts: the first trial's run read them, then ran its playbook.
    assert not (results / "hosts/localhost/ansible").exists()
    assert not (results / "trials/selftest.noop.r1@localhost/ansible/host_facts.json").exists()  # moved
    tasks = [str(e["event_data"]["task"]) for e in _events(first["phases"][0])  # type: ignore[index]
             if e["event"] == "playbook_on_task_start"]
    read = next(i for i, t in enumerate(tasks) if t.startswith("read_facts | Read GPUs"))
    assert read < tasks.index("Reach the node and do nothing (the overhead baseline includes one round trip)")
    assert "waited_for_turn_s" not in first["phases"][0]  # started in its turn: nothing to wait for
    # The second reads no facts of its own: they are read once per host and run.
    assert not any(str(e["event_data"].get("task", "")).startswith("read_facts |")  # type: ignore[union-attr]
                   for e in _events(second["phases"][0]))


def _read_facts_in(trial: dict[str, object]) -> bool:
    return any(str(e["event_data"].get("task", "")).startswith("read_facts |")  # type: ignore[union-attr]
               for e in _events(trial["phases"][0]))  # type: ignore[index]


def test_a_run_soon_after_another_takes_its_fresh_facts_and_fresh_facts_reads_them(tmp_path: Path) -> None:
    """runner/facts_cache.py: the second run's trial reads no facts (its ansible-playbook is the trial's
    alone) and says how old the facts it carries are; --fresh-facts reads them again."""
    campaign = tmp_path / "c.yaml"
    campaign.write_text(f"name: cached\ninventory: {REPO / 'inventory/local'}\nremote_dir: {tmp_path / 'node'}\n"
                        "experiments:\n  - kind: selftest\n    modes: [noop]\n")
    trials = []
    for name, options in (("first", []), ("second", []), ("forced", ["--fresh-facts"])):
        results = tmp_path / name
        assert main([str(campaign), "--quiet", *options, "--results", str(results)]) == 0
        trials.append(json.loads((results / "trials/selftest.noop.r1@localhost/trial.json").read_text()))
        assert trials[-1]["host_facts"] == json.loads((results / "hosts/localhost/facts.json").read_text())
    first, second, forced = trials
    assert _read_facts_in(first) and "host_facts_age_s" not in first
    assert not _read_facts_in(second) and 0 <= second["host_facts_age_s"] < 600
    assert second["host_facts"] == first["host_facts"]
    assert _read_facts_in(forced) and "host_facts_age_s" not in forced
