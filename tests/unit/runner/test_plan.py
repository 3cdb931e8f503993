"""Plan expansion: deterministic, setup-major, readable stable ids, resources per trial."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runner.plan import expand, trial_id
from runner.spec import load_campaign

CAMPAIGN = """\
name: demo
inventory: inventory
engine: {kind: stand-in, model: /models/m, args: {max-model-len: 4096}, gpus: [0]}
defaults: {repeats: 2, timeout_s: 60}
experiments:
  - kind: selftest
    modes: [sleep, noop]
    engine_args: {enforce-eager: true}
  - kind: facts
    repeats: 1
"""


def test_expansion_is_setup_major_with_stable_ids(write_campaign: Callable[[str], Path]) -> None:
    plan = expand(load_campaign(write_campaign(CAMPAIGN)))
    assert [t.id for t in plan.trials] == [
        "selftest.sleep.r1@localhost", "selftest.sleep.r2@localhost",
        "selftest.noop.r1@localhost", "selftest.noop.r2@localhost",
        "facts.default.r1@localhost",
    ]
    again = expand(load_campaign(write_campaign(CAMPAIGN)))
    assert [t.definition_hash() for t in plan.trials] == [t.definition_hash() for t in again.trials]


def test_trials_carry_merged_engine_args_params_and_timeouts(write_campaign: Callable[[str], Path]) -> None:
    first, *_, last = expand(load_campaign(write_campaign(CAMPAIGN))).trials
    assert first.engine is not None
    assert first.engine["args"] == {"max-model-len": 4096, "enforce-eager": True}
    assert last.engine is not None and last.engine["args"] == {"max-model-len": 4096}
    assert first.params == {"seconds": 2.0, "interval_s": 0.5}
    assert first.timeout_s == 60
    assert first.as_dict()["resources"] == {"gpus": [], "exclusive": False, "host_ram_gib": 0.0}


def test_definition_hash_changes_with_what_the_trial_does(write_campaign: Callable[[str], Path]) -> None:
    before = expand(load_campaign(write_campaign(CAMPAIGN))).trials[0]
    after = expand(load_campaign(write_campaign(CAMPAIGN.replace("modes: [sleep, noop]",
                                                                 "modes: {sleep: {seconds: 3}, noop: }")))).trials[0]
    assert before.id == after.id
    assert before.definition_hash() != after.definition_hash()


def test_trial_ids_are_filename_safe() -> None:
    made_safe = trial_id("start up", "a/b", 3, "node:1")
    assert made_safe.startswith("start_up.a_b.r3@node_1-") and "/" not in made_safe
    assert trial_id("s", "m", 1, "node-1.example") == "s.m.r1@node-1.example"  # unchanged when safe


def test_hosts_differing_only_in_replaced_characters_get_distinct_ids() -> None:
    # Before: a_b and a~b both became ...@a_b and one trial's results overwrote the other's.
    assert trial_id("s", "m", 1, "a_b") != trial_id("s", "m", 1, "a~b")
