"""Every kind's first phase waits for its turn, so the runner can start it while the trial before it
collects (its ansible-playbook start, 1-2 s, is not paid after that trial)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runner.experiments import KINDS

REPO = Path(__file__).resolve().parents[3]


def _first_task(playbook: Path) -> dict[str, object]:
    plays = yaml.safe_load(playbook.read_text())
    return plays[0]["tasks"][0]


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kinds_first_playbook_begins_by_waiting_for_its_turn(name: str) -> None:
    phase = KINDS[name].phases[0]
    assert phase.waits_for_turn, name
    task = _first_task(REPO / phase.playbook)
    imported = str(task.get("ansible.builtin.import_tasks") or "")
    inline = "lookup('turn', exp_turn_file" in str(task)
    assert imported.endswith("tasks/wait_for_turn.yml") or inline, f"{phase.playbook}: {task}"


def test_no_later_phase_claims_to_wait() -> None:
    later = [f"{k.name}.{p.name}" for k in KINDS.values() for p in k.phases[1:] if p.waits_for_turn]
    assert later == []  # only a trial's first phase is ever started early
