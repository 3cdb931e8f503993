"""Ansible users' hands: -i, -l, -e and --only change what a campaign file says, -e read as
ansible-playbook reads extra vars (compared with ansible-playbook itself), with errors that name
the option, and "did you mean" for near misses."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main
from runner.errors import SpecError
from runner.overrides import parse_overrides
from runner.plan import expand
from runner.spec import load_campaign, select
from tests.support import ansible_cli
from tests.support.ansible_cli import flatten

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
    (os.fsdecode(b"engine.env.X=\xff"), "holds bytes that are not UTF-8 text"),
    (os.fsdecode(b'{"description": "\xff"}'), "holds bytes that are not UTF-8 text"),
    ('{"description": "\\ud800"}', "half a UTF-16 pair"),
])
def test_text_no_utf8_file_can_hold_is_refused(item: str, message: str) -> None:
    # A byte the locale could not decode (argv holds it as a surrogate) or a JSON "\ud800" escape
    # passed --plan; every trial then failed where Ansible read its variables.
    with pytest.raises(SpecError) as info:
        parse_overrides([item])
    assert len(info.value.lines) == 1 and message in info.value.lines[0]


@pytest.mark.parametrize(("item", "message"), [
    ("novalue", "a word without '='"),
    ("a..b=1", "a key path has an empty part"),
    ("[1, 2]", "could not be made into a mapping"),
    ("/etc/site.yml", "a file name must start with '@'"),
    ("description='unbalanced", "unbalanced quotes"),
    ("{engine: {port: 1}", "not valid YAML"),
])
def test_malformed_overrides_are_one_line(item: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_overrides([item])
    assert len(info.value.lines) == 1 and message in info.value.lines[0]


@pytest.mark.parametrize("index", ["\u00b2", "\u0663"])
def test_a_list_index_is_ascii_digits(write_campaign: Callable[[str], Path], index: str) -> None:
    # str.isdigit() holds for '²' (then int() raised: "invalid literal for int()") and for '٣' (taken as 3).
    with pytest.raises(SpecError) as info:
        load_campaign(write_campaign(CAMPAIGN), overrides=parse_overrides([f"experiments.{index}.repeats=2"]))
    assert info.value.lines == [f"-e experiments.{index}.repeats=2: experiments.{index}: no such list item"]


def test_extra_vars_are_read_as_ansible_playbook_reads_them(tmp_path: Path) -> None:
    """Several pairs in one -e, quoting, text values from key=value, typed values from YAML/JSON
    and @file: the same keys and values as ansible-playbook's own extra vars."""
    (tmp_path / "site.yml").write_text("remote_dir: /srv/campaign\nnode_python: /opt/venv/bin/python\n")
    items = ["engine.served_model_name=x engine.port=9000", "description='two words' engine.version=0.10",
             '{"defaults": {"repeats": 3, "timeout_s": 60.5}}', "{name: from-yaml}", f"@{tmp_path / 'site.yml'}"]
    ours = {".".join(map(str, path)): value for path, value, _ in parse_overrides(items)}
    theirs = flatten(ansible_cli.extra_vars(items, ["engine.served_model_name", "engine.port", "description",
                                                    "engine.version", "defaults", "name", "remote_dir",
                                                    "node_python"], tmp_path))
    assert ours == theirs
    assert ours["engine.port"] == "9000" and ours["engine.version"] == "0.10" and ours["defaults.repeats"] == 3


def test_key_value_text_takes_the_campaigns_types(write_campaign: Callable[[str], Path]) -> None:
    """Read as YAML, "1.10" was the number 1.1 and a version string was refused; as Ansible reads
    it, it is text, and each campaign value converts it to its own type."""
    loaded = load_campaign(write_campaign(CAMPAIGN), overrides=parse_overrides([
        "engine.served_model_name=1.10 engine.port=9000 engine.version=0.10",
        "engine.args.enforce-eager=false engine.args.block-size=32 engine.args.kv-cache-dtype=fp8"]))
    engine = loaded.campaign.engine
    assert engine is not None
    assert (engine.served_model_name, engine.port, engine.version) == ("1.10", 9000, "0.10")
    assert engine.args == {"max-model-len": 4096, "enforce-eager": False, "block-size": 32, "kv-cache-dtype": "fp8"}


def test_the_readmes_json_override_sets_the_repeats(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(CAMPAIGN)
    loaded = load_campaign(path, overrides=parse_overrides(['{"defaults": {"repeats": 3}}']))
    assert loaded.campaign.defaults.repeats == 3
    with pytest.raises(SpecError) as info:
        load_campaign(path, overrides=parse_overrides(['{"repeats": 3}']))
    assert info.value.lines == ["-e {...}: repeats: unknown key: did you mean 'defaults.repeats'?"]


def test_deeply_nested_extra_vars_are_one_line(write_campaign: Callable[[str], Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    assert main([str(write_campaign(CAMPAIGN)), "--plan", "-e", deep]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["-e (the first): line 1: nests deeper than 32 levels: refused"]


def test_an_override_value_is_data_never_a_template(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(CAMPAIGN)
    loaded = load_campaign(path, overrides=parse_overrides(["description={{ lookup('pipe', 'id') }}"]))
    assert loaded.campaign.description == "{{ lookup('pipe', 'id') }}"


def test_inventory_replaces_the_files_and_limit_narrows_its_hosts(write_campaign: Callable[[str], Path],
                                                                  tmp_path: Path) -> None:
    path = write_campaign(CAMPAIGN)
    other = tmp_path / "other"
    other.mkdir()
    (other / "hosts.yml").write_text("all:\n  hosts:\n    n1: {ansible_connection: local}\n"
                                     "    n2: {ansible_connection: local}\n")
    loaded = load_campaign(path, inventory=other, limit="n2")
    assert loaded.inventory.sources == (str(other.resolve()),) and loaded.hosts == ("n2",)
    assert loaded.inventory.from_command_line and loaded.options == (f"-i {other}", "-l n2")
    with pytest.raises(SpecError) as info:
        load_campaign(path, inventory=other, limit="n3")
    assert info.value.lines == [f"-l n3: the limit leaves no host: the campaign's hosts 'all' are n1, n2 in "
                                f"{other.resolve()}, and the limit matches none of them (ansible-playbook -l "
                                "narrows a play's hosts, never adds to them)"]


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


def test_only_selects_an_experiment_whose_name_holds_a_dot(write_campaign: Callable[[str], Path]) -> None:
    # `name: gmu0.9` is a valid name, but --only split it at its first dot: "no experiment 'gmu0'".
    loaded = load_campaign(write_campaign(CAMPAIGN.replace("  - kind: facts\n", "  - {kind: facts, name: gmu0.9}\n")))
    assert [t.id for t in expand(select(loaded, ["gmu0.9"])).trials] == ["gmu0.9.default.r1@localhost"]
    assert [t.id for t in expand(select(loaded, ["gmu0.9.default"])).trials] == ["gmu0.9.default.r1@localhost"]
    with pytest.raises(SpecError) as info:
        select(loaded, ["gmu0.9.nap"])
    assert info.value.lines == ["--only gmu0.9.nap: experiment gmu0.9 has no mode 'nap' (known: default)"]


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
