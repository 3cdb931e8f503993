"""The host's first trial is started while its facts are read: one that does not need the node
alone is given its turn at once (it runs beside the read), one that does waits for the facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.cli import main

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_a_first_trial_that_shares_the_node_does_not_wait_for_the_facts(tmp_path: Path) -> None:
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
    assert first["phases"][0]["waited_for_turn_s"] < 0.5  # let go as it started, not after the facts' read
    assert "waited_for_turn_s" not in second["phases"][0]  # the second one starts in its turn
    assert first["host_facts"] == json.loads((results / "hosts/localhost/facts.json").read_text())
