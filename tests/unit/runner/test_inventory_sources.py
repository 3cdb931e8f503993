"""Inventories a campaign file names are data: Ansible's script plugin never runs what they hold
(in --plan or in a phase's ansible-playbook), special files and kernel file systems are refused
before Ansible opens them, and host names that are not safe as a folder name are refused."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from runner.cli import main
from runner.errors import SpecError
from runner.execute import run_phase
from runner.inventory import Inventory, InventoryError, InventorySources
from runner.spec import load_campaign

REPO = Path(__file__).resolve().parents[3]
LOCAL = "all:\n  hosts:\n    localhost: {ansible_connection: local}\n"


def _script_inventory(folder: Path, marker: Path) -> None:
    """A valid inventory script that leaves a marker behind when it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "dynamic.py"
    script.write_text(f"#!{sys.executable}\nimport json, pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                      "print(json.dumps({'all': {'hosts': ['scripted']}, "
                      "'_meta': {'hostvars': {'scripted': {'ansible_connection': 'local'}}}}))\n")
    script.chmod(0o755)


def _campaign(tmp_path: Path, inventory: str, hosts: str = "all") -> Path:
    path = tmp_path / "campaign.yaml"
    path.write_text(f"name: demo\ninventory: {inventory}\nhosts: {hosts!r}\nexperiments:\n  - kind: facts\n")
    return path


def test_a_campaign_never_runs_an_inventory_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "the-script-ran"
    _script_inventory(tmp_path / "inv", marker)
    (tmp_path / "inv" / "hosts.yml").write_text(LOCAL)
    path = _campaign(tmp_path, "inv")
    assert main([str(path), "--plan"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:2: inventory: inventory {tmp_path / 'inv'}: {tmp_path / 'inv/dynamic.py'} is executable, and "
        "Ansible would run it as an inventory script: a campaign file names data-only inventories (clear its "
        "executable bit, or pass the inventory with -i to run it)"]
    assert not marker.exists()
    # The user's own choice on the command line: Ansible's plugins, the script included.
    assert set(load_campaign(path, inventory=[tmp_path / "inv"]).hosts) == {"localhost", "scripted"}
    assert marker.exists()


def test_a_campaign_inventory_of_proc_self_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "the-script-ran"
    _script_inventory(tmp_path / "cwd", marker)  # /proc/self/cwd leads here
    monkeypatch.chdir(tmp_path / "cwd")
    assert main([str(_campaign(tmp_path, "/proc/self")), "--plan"]) == 2
    assert "is on a kernel or device file system" in capsys.readouterr().err
    assert not marker.exists()


def test_the_phases_ansible_playbook_reads_a_campaigns_inventory_as_data_only(tmp_path: Path) -> None:
    """Even if a script appears after the plan checked the folder, the run's ansible-playbook gets
    only the data plugins (ANSIBLE_INVENTORY_ENABLED), and never runs it."""
    marker = tmp_path / "the-script-ran"
    inv = tmp_path / "inv"
    _script_inventory(inv, marker)
    (inv / "hosts.yml").write_text(LOCAL.replace("local}", f"local, ansible_python_interpreter: {sys.executable}}}"))
    (tmp_path / "play.yml").write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                                       "    - ansible.builtin.ping:\n")
    result = run_phase(phase="check", playbook=tmp_path / "play.yml", project_dir=REPO,
                       private_data_dir=tmp_path / "run", inventory=InventorySources((str(inv),)),
                       limit="localhost", extravars={}, timeout_s=120, cancel=threading.Event())
    assert result.ok, result.failures
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_a_fifo_in_an_inventory_folder_is_refused_unread(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(LOCAL)
    os.mkfifo(inv / "group_vars")  # would block Ansible's vars plugin forever
    path = _campaign(tmp_path, "inv")
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert info.value.lines == [f"{path}:2: inventory: inventory {inv}: {inv / 'group_vars'} is not a regular file "
                                "(a FIFO, socket or device is never read)"]


def test_an_inventory_of_the_environment_echoes_none_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    secret = "hf_" + "Q7" * 20
    monkeypatch.setenv("HF_TOKEN", secret)
    for inventory in ("/proc/self/environ", "/proc/self"):
        assert main([str(_campaign(tmp_path, inventory)), "--plan"]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "kernel or device file system" in err
        assert secret[:8] not in err and "PATH=" not in err
    # The same content in a plain file: parsed by Ansible as INI, its "host names" never shown.
    (tmp_path / "environ").write_text(f"HF_TOKEN={secret}\nPATH=/usr/bin\n")
    assert main([str(_campaign(tmp_path, "environ")), "--plan"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and secret[:8] not in err and "/usr/bin" not in err, err


@pytest.mark.parametrize(("name", "shown"), [("..", "'..'"), (".", "'.'"), ("a/b", "'a/b'"),
                                            ("h\u0001", "'h\\x01'")])
def test_a_host_name_that_is_not_a_folder_name_is_refused(tmp_path: Path, name: str, shown: str) -> None:
    """A host named '..' made the preflight write its facts into the results root."""
    (tmp_path / "hosts.yml").write_text(f"all:\n  hosts:\n    {json.dumps(name)}: {{ansible_connection: local}}\n")
    path = _campaign(tmp_path, "hosts.yml")
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert len(info.value.lines) == 1
    assert info.value.lines[0].startswith(f"{path}:2: inventory: inventory {tmp_path / 'hosts.yml'}: host {shown} is ")


def test_a_file_no_data_plugin_reads_is_named_not_quoted(tmp_path: Path) -> None:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(LOCAL)
    (inv / "broken.yml").write_text("all: [unclosed\n  hosts: sk-live-0123456789abcdefghij\n")
    with pytest.raises(InventoryError) as info:
        Inventory(InventorySources((str(inv),)))
    assert str(info.value) == (f"inventory {inv / 'broken.yml'}: no inventory plugin (host_list, yaml, ini, toml) "
                               f"could read it (`ansible-inventory -i {inv / 'broken.yml'} --list` says why)")


@pytest.mark.parametrize("where", ["file", "-i"])
def test_a_host_list_longer_than_a_file_name_is_a_host_list(tmp_path: Path, where: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Over 255 bytes, Path.exists() raised ENAMETOOLONG: a crash (exit 5) for a 60-host list.
    hosts = [f"node-{i:03d}" for i in range(60)]
    listed = ",".join(hosts) + ","
    argv = ([str(_campaign(tmp_path, repr(listed)))] if where == "file"
            else [str(_campaign(tmp_path, "nowhere")), "-i", listed])
    assert main([*argv, "--plan", "--json", "--results", str(tmp_path / "results")]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert sorted({t["host"] for t in plan["trials"]}) == hosts
