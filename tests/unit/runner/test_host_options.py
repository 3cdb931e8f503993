"""-i and -l as ansible-playbook has them (compared with ansible-playbook --list-hosts itself):
-l narrows the campaign's hosts, never replaces them; -l @FILE; -i host lists and several -i.
And the rest of the command line an Ansible user tries: --version, --json, subscripts past the end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runner.cli import main
from runner.errors import SpecError
from runner.inventory import patterns
from runner.spec import load_campaign
from tests.support import ansible_cli

INVENTORY = """\
all:
  hosts:
    h200-01: {ansible_connection: local}
  children:
    a100:
      hosts:
        a100-01: {ansible_connection: local}
        a100-02: {ansible_connection: local}
"""


def _campaign(tmp_path: Path, hosts: str) -> Path:
    (tmp_path / "inv.yml").write_text(INVENTORY)
    path = tmp_path / "campaign.yaml"
    path.write_text(f"name: demo\ninventory: inv.yml\nhosts: {hosts!r}\nexperiments:\n  - kind: facts\n")
    return path


@pytest.mark.parametrize(("hosts", "inventories", "limit"), [
    ("all", None, "@limit.txt"),  # one pattern a line, blank lines ignored
    ("all", ["h1,h2,"], None),  # a host list, not a path
    ("all", ["h1,h2,", "inv.yml"], "h1,a100-02"),  # several -i, in order
    ("a100", None, "all[1]"),  # a subscript of the limit
    ("all", None, "!a100"),
    ("a100:h200-01", None, "~a100-0[2-9]"),
])
def test_hosts_are_the_ones_ansible_playbook_lists(tmp_path: Path, hosts: str, inventories: list[str] | None,
                                                   limit: str | None) -> None:
    path = _campaign(tmp_path, hosts)
    (tmp_path / "limit.txt").write_text("a100-02\n\nh200-01\n")
    absolute = [i if "," in i else str(tmp_path / i) for i in inventories or []]
    limit_arg = f"@{tmp_path / 'limit.txt'}" if limit == "@limit.txt" else limit
    theirs = ansible_cli.listed_hosts(hosts, absolute or [str(tmp_path / "inv.yml")], limit_arg, tmp_path)
    loaded = load_campaign(path, inventory=absolute or None, limit=limit_arg)
    # As sets: Ansible's own order of hosts across groups follows the process's hash seed.
    assert sorted(loaded.hosts) == sorted(theirs) and theirs


def test_a_limit_outside_the_campaigns_hosts_leaves_none_as_in_ansible(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """-l h200-01 against hosts: a100 planned trials on h200-01; ansible-playbook runs no host."""
    path = _campaign(tmp_path, "a100")
    assert ansible_cli.listed_hosts("a100", [str(tmp_path / "inv.yml")], "h200-01", tmp_path) == []
    assert main([str(path), "--plan", "-l", "h200-01"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"-l h200-01: the limit leaves no host: the campaign's hosts 'a100' are a100-01, a100-02 in "
        f"{tmp_path / 'inv.yml'}, and the limit matches none of them (ansible-playbook -l narrows a play's hosts, "
        "never adds to them)"]


@pytest.mark.parametrize(("args", "message"), [
    (["-l", "all[99]"], "-l all[99]: No hosts matched the subscripted pattern 'all[99]'"),
    (["-l", "all["], "-l all[: host pattern term 'all[' is malformed"),
    (["-l", "@missing.txt"], "-l @missing.txt: cannot read limit file missing.txt: No such file or directory"),
    (["-i", "nowhere"], "-i nowhere: inventory "),
])
def test_bad_host_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                       message: str) -> None:
    assert main([str(_campaign(tmp_path, "all")), "--plan", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


@pytest.mark.timeout(60)
def test_a_catastrophic_regex_limit_is_refused_within_the_time_limit(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert main([str(_campaign(tmp_path, "all")), "--plan", "-l", "~(.*.*.*.*.*.*)*X"]) == 2
    assert time.monotonic() - started < patterns.MATCH_TIME_LIMIT_S + 5
    assert capsys.readouterr().err.splitlines() == [
        f"-l ~(.*.*.*.*.*.*)*X: matching the host pattern took more than {patterns.MATCH_TIME_LIMIT_S:g} s (a regular "
        "expression with nested repetition, such as (.*)*, can take forever): refused"]


@pytest.mark.timeout(60)
def test_a_catastrophic_regex_in_the_campaigns_hosts_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(patterns, "MATCH_TIME_LIMIT_S", 0.5)
    path = _campaign(tmp_path, "~(.*.*.*.*.*.*)*X")
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert info.value.lines == [f"{path}:3: hosts: matching the host pattern took more than 0.5 s (a regular "
                                "expression with nested repetition, such as (.*)*, can take forever): refused"]
    # A harmless regex is matched the same way, and gives its hosts.
    assert load_campaign(_campaign(tmp_path, "~a100-0[12]")).hosts == ("a100-01", "a100-02")


def test_version_and_json_without_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("gpu-campaign 0.")
    assert main([str(_campaign(tmp_path, "all")), "--json"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "--json: only with --plan (the plan as JSON); a run's machine-readable results are summary.json and "
        "trials/*/trial.json in its results folder"]
