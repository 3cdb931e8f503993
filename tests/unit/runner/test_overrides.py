"""Ansible users' hands: -i, -l, -e and --only change what a campaign file says, with errors that
name the option, and "did you mean" for near misses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main
from runner.errors import SpecError
from runner.overrides import parse_overrides
from runner.plan import expand
from runner.spec import load_campaign, select

CAMPAIGN = """\
name: demo
inventory: inventory
engine:
  model: /models/m
  args: {max-model-len: 4096, enforce-eager: true}
experiments:
  - kind: selftest
    modes: {sleep: {seconds: 2}, noop: }
  - kind: facts
"""


def test_key_value_overrides_reach_the_plan(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(CAMPAIGN)
    loaded = load_campaign(path, overrides=parse_overrides([
        "engine.args.max-model-len=8192", "defaults.repeats=2", "experiments.0.modes.sleep.seconds=0.5"]))
    assert loaded.campaign.engine is not None
    assert loaded.campaign.engine.args == {"max-model-len": 8192, "enforce-eager": True}  # one leaf changed
    assert loaded.modes[0]["sleep"]["seconds"] == 0.5
    assert len(expand(loaded).trials) == 6
    assert loaded.options == ("-e defaults.repeats=2", "-e engine.args.max-model-len=8192",
                              "-e experiments.0.modes.sleep.seconds=0.5")


def test_json_and_file_overrides_merge_leaves(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    path = write_campaign(CAMPAIGN)
    extra = tmp_path / "site.yml"
    extra.write_text("engine:\n  port: 9000\n  args: {gpu-memory-utilization: 0.5}\n")
    loaded = load_campaign(path, overrides=parse_overrides(['{"defaults": {"timeout_s": 60}}', f"@{extra}"]))
    engine = loaded.campaign.engine
    assert engine is not None and engine.port == 9000 and loaded.campaign.defaults.timeout_s == 60
    assert engine.args == {"max-model-len": 4096, "enforce-eager": True, "gpu-memory-utilization": 0.5}


def test_an_override_of_one_mode_leaves_the_modes_sharing_its_alias_alone(
        write_campaign: Callable[[str], Path]) -> None:
    """YAML aliases are one object in PyYAML: ``-e ...tiered.workload.sessions=16`` changed every
    mode written ``workload: *load`` or ``<<: *load`` too."""
    path = write_campaign("""\
name: demo
inventory: inventory
engine: {kind: stand-in, model: /models/m}
experiments:
  - kind: offload
    modes:
      hbm_only: {workload: &load {sessions: 8, concurrency: 4}}
      native_cpu: {workload: *load, offload_gib: 1}
      tiered: {workload: {<<: *load, concurrency: 2}, offload_gib: 1}
""")
    loaded = load_campaign(path, overrides=parse_overrides(["experiments.0.modes.hbm_only.workload.sessions=16"]))
    sessions = {mode: params["workload"]["sessions"] for mode, params in loaded.modes[0].items()}
    assert sessions == {"hbm_only": 16, "native_cpu": 8, "tiered": 8}
    assert loaded.modes[0]["tiered"]["workload"]["concurrency"] == 2


def test_an_override_error_names_the_option_not_a_line(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(CAMPAIGN)
    with pytest.raises(SpecError) as info:
        load_campaign(path, overrides=parse_overrides(["defaults.repeats=0", "engine.prot=1"]))
    assert info.value.lines == ["-e defaults.repeats=0: defaults.repeats: must be >= 1",
                                "-e engine.prot=1: engine.prot: unknown key: did you mean 'port'?"]


@pytest.mark.parametrize(("item", "message"), [
    ("novalue", "expected key.path=value, @file.yml or a JSON object"),
    ("a..b=1", "empty key in 'a..b'"),
    ("engine.args={x: 1}", "a key=value override takes a scalar"),
    ("[1, 2]", "expected key.path=value"),
])
def test_malformed_overrides_are_one_line(item: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_overrides([item])
    assert message in info.value.lines[0]


def test_an_override_value_is_data_never_a_template(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(CAMPAIGN)
    loaded = load_campaign(path, overrides=parse_overrides(["description={{ lookup('pipe', 'id') }}"]))
    assert loaded.campaign.description == "{{ lookup('pipe', 'id') }}"


def test_inventory_and_limit_replace_the_files(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    path = write_campaign(CAMPAIGN)
    other = tmp_path / "other"
    other.mkdir()
    (other / "hosts.yml").write_text("all:\n  hosts:\n    n1: {ansible_connection: local}\n"
                                     "    n2: {ansible_connection: local}\n")
    loaded = load_campaign(path, inventory=other, limit="n2")
    assert loaded.inventory_path == other.resolve() and loaded.hosts == ("n2",)
    with pytest.raises(SpecError) as info:
        load_campaign(path, inventory=other, limit="n3")
    assert info.value.lines == [f"-l n3: hosts: host pattern 'n3' matches no host in {other.resolve()}"]


def test_only_keeps_experiments_and_modes_with_the_same_trial_ids(write_campaign: Callable[[str], Path]) -> None:
    loaded = load_campaign(write_campaign(CAMPAIGN))
    full = {t.id for t in expand(loaded).trials}
    subset = expand(select(loaded, ["selftest.noop", "facts"]))
    assert [t.id for t in subset.trials] == ["selftest.noop.r1@localhost", "facts.default.r1@localhost"]
    assert {t.id for t in subset.trials} <= full
    with pytest.raises(SpecError) as info:
        select(loaded, ["selftest.nop", "fact"])
    assert info.value.lines == [
        "--only selftest.nop: experiment selftest has no mode 'nop' (known: sleep, noop): did you mean 'noop'?",
        "--only fact: no experiment 'fact' (known: selftest, facts): did you mean 'facts'?"]


def test_unknown_mode_and_kind_suggest_the_near_miss(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(CAMPAIGN.replace("noop: }", "nop: }").replace("kind: facts", "kind: fatcs"))
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert any(line.endswith("did you mean 'noop'?") for line in info.value.lines)
    assert any("unknown experiment kind 'fatcs'" in line and line.endswith("did you mean 'facts'?")
               for line in info.value.lines)


def test_plan_cli_takes_the_overrides(write_campaign: Callable[[str], Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write_campaign(CAMPAIGN)
    assert main([str(path), "--plan", "--json", "-e", "defaults.repeats=3", "--only", "facts"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [t["id"] for t in plan["trials"]] == [f"facts.default.r{i}@localhost" for i in (1, 2, 3)]
