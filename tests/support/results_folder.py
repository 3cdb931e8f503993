"""A results folder as a run of the selftest campaign leaves it, written without running Ansible:
the plan from the real expansion, a trial.json per trial, run.json and a host's facts.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

from runner.plan import Plan, expand
from runner.spec import load_campaign

CAMPAIGN = """\
name: hostile
inventory: inventory
experiments:
  - kind: selftest
    modes: [noop, sleep, fail]
"""
FACTS = {"hostname": "vm", "kernel": "6.1.0", "driver_version": None, "gpus": [{"name": "H200", "index": 0}],
         "memory": {"total_bytes": 64 * 2**30}, "numa": [{"cpus": "0-1"}], "page_cache_bytes": 2**30}
STATUS = {"noop": "ok", "sleep": "ok", "fail": "failed"}


def write_inventory(folder: Path) -> Path:
    inv = folder / "inventory"
    inv.mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n")
    return inv


def make_results(folder: Path, results: Path) -> tuple[Path, Plan]:
    """Write the campaign (beside its inventory) and its results folder; return the campaign file and plan."""
    write_inventory(folder)
    campaign = folder / "campaign.yaml"
    campaign.write_text(CAMPAIGN)
    loaded = load_campaign(campaign)
    plan = expand(loaded)
    (results / "hosts" / "localhost").mkdir(parents=True)
    (results / "hosts" / "localhost" / "facts.json").write_text(json.dumps(FACTS))
    (results / "campaign.yaml").write_text(CAMPAIGN)
    (results / "plan.json").write_text(json.dumps(plan.as_dict()))
    now = time.time()
    (results / "run.json").write_text(json.dumps({"campaign": "hostile", "runs": [{"started": now, "argv": []}],
                                                  "git": {"sha": "0" * 40, "dirty": False}, "tools": {}}))
    for trial in plan.trials:
        status = STATUS[trial.mode]
        folder_ = results / "trials" / trial.id
        (folder_ / "raw" / trial.host).mkdir(parents=True)
        record = {**trial.as_dict(), "status": status, "reason": "" if status == "ok" else "failed on purpose",
                  "phases": [], "metrics": {"wall_s": 1.5} if status == "ok" else {}, "engine_label": "none",
                  "host_facts": FACTS, "started": now, "ended": now + 1.5, "duration_s": 1.5}
        (folder_ / "trial.json").write_text(json.dumps(record, indent=2))
    return campaign, plan
