"""A legal but templated inventory value crashed the whole run in the live-log follower
(``int("{{ base_port }}")``), leaving the trial ``running`` and no summary: the run goes on."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import pytest

from runner.cli import main

pytestmark = pytest.mark.integration

CAMPAIGN = """\
name: follow
inventory: hosts.yml
experiments:
  - kind: selftest
    modes:
      sleep: {seconds: 0.6, interval_s: 0.1}
"""


@pytest.mark.parametrize(("host_vars", "warns"), [
    ('ansible_port: "{{ base_port }}"', False),  # resolved: 2222 (unused by a local connection)
    ('ansible_ssh_common_args: "-o ProxyJump={{ jump_host }}"', True),  # unresolvable: the follower stands down
])
def test_a_templated_inventory_value_never_stops_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         host_vars: str, warns: bool) -> None:
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars:\n    base_port: 2222\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n      {host_vars}\n")
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN)
    results = tmp_path / "results"
    with caplog.at_level(logging.WARNING, logger="runner.livelog"):
        assert main([str(tmp_path / "campaign.yaml"), "--plain", "--results", str(results)]) == 0
    with (results / "summary.csv").open() as fh:
        assert [r["status"] for r in csv.DictReader(fh)] == ["ok"]
    trial = json.loads((results / "trials/selftest.sleep.r1@localhost/trial.json").read_text())
    assert trial["status"] == "ok"
    warnings = [r.getMessage() for r in caplog.records if "not following" in r.getMessage()]
    assert len(warnings) == (1 if warns else 0), warnings


def test_a_quiet_run_follows_no_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """--quiet shows no log line, so it neither resolves a connection nor tails the node's log: the
    inventory that makes a --plain run warn (above) leaves a quiet one silent."""
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
        '      ansible_ssh_common_args: "-o ProxyJump={{ jump_host }}"\n')
    (tmp_path / "campaign.yaml").write_text(CAMPAIGN)
    with caplog.at_level(logging.DEBUG, logger="runner.livelog"):
        assert main([str(tmp_path / "campaign.yaml"), "--quiet", "--results", str(tmp_path / "results")]) == 0
    assert not [r.getMessage() for r in caplog.records if r.name == "runner.livelog"]
