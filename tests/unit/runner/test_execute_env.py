"""What every playbook run inherits, and what its artefacts keep of it: ansible-runner would turn
host-key checking off unless told, and writes the whole environment (secrets included) to
``artifacts/<phase>/command``, 0600 like every artefact."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from runner.execute import _envvars, host_key_checking, scrub_command_artifacts, start_phase
from runner.files import _umask

UMASK = _umask()
LOCAL = f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"

REPO = Path(__file__).resolve().parents[3]


def test_the_projects_ansible_cfg_keeps_host_keys_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    assert host_key_checking(REPO) == "True"  # ansible.cfg says so; ansible-runner's default would be False
    assert _envvars(REPO)["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_the_environment_and_the_cfg_decide_in_that_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    assert host_key_checking(tmp_path) == "False"
    assert host_key_checking(tmp_path / "nothing-here") == "True"  # Ansible's own default
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "True")
    assert host_key_checking(tmp_path) == "True"


# --- the environment's values in ansible-runner's ``command`` artifact -----------------------------

VALUE = "db-pAsSwOrD-planted-0123456789"

WAITING_PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Say the run has started
      ansible.builtin.command:
        argv: [touch, "{{ marker }}"]
    - name: Wait to be let go
      ansible.builtin.wait_for:
        path: "{{ release }}"
        timeout: 60
"""


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_the_command_artifact_holds_no_value_while_the_phase_runs_nor_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DB_PASSWORD", VALUE)
    monkeypatch.setenv("HF_TOKEN", VALUE[::-1])
    (tmp_path / "play.yml").write_text(WAITING_PLAYBOOK)
    (tmp_path / "inventory").write_text(LOCAL)
    marker, release, private = tmp_path / "started", tmp_path / "release", tmp_path / "trial" / "ansible"
    running = start_phase(phase="run", playbook=tmp_path / "play.yml", project_dir=REPO, private_data_dir=private,
                          inventory=tmp_path / "inventory", limit="localhost",
                          extravars={"marker": str(marker), "release": str(release)}, timeout_s=120,
                          cancel=lambda: False)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the playbook never started"
        command = private / "artifacts" / "run" / "command"
        during = command.read_text()
        assert VALUE not in during and VALUE[::-1] not in during
        env = json.loads(during)["env"]
        assert env["DB_PASSWORD"] == env["HF_TOKEN"] == "***"  # the names stay, to say what it ran with
        assert env["PATH"] == os.environ["PATH"] or Path(sys.executable).parent.as_posix() in env["PATH"]
    finally:
        release.touch()
        result = running.wait()
    assert result.ok, result.failures
    for path in _files(private):
        text = path.read_bytes()
        assert VALUE.encode() not in text and VALUE[::-1].encode() not in text, path


def test_the_artefacts_get_the_modes_of_the_rest_of_the_results_folder(tmp_path: Path) -> None:
    (tmp_path / "play.yml").write_text("- hosts: localhost\n  gather_facts: false\n  tasks: []\n")
    (tmp_path / "inventory").write_text(LOCAL)
    private = tmp_path / "trial" / "ansible"
    result = start_phase(phase="run", playbook=tmp_path / "play.yml", project_dir=REPO, private_data_dir=private,
                         inventory=tmp_path / "inventory", limit="localhost", extravars={}, timeout_s=120,
                         cancel=lambda: False).wait()
    assert result.ok, result.failures
    modes = {oct(p.stat().st_mode & 0o777) for p in _files(private)}
    folders = {oct(p.stat().st_mode & 0o777) for p in [private, *private.rglob("*")] if p.is_dir()}
    assert len(_files(private)) > 5  # command, stdout, status, rc, extravars, job events ...
    assert modes == {oct(0o666 & ~UMASK)} and folders == {oct(0o777 & ~UMASK)}


def test_a_resume_scrubs_what_a_killed_run_left_before_it_keeps_it_in_previous(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin", "DB_PASSWORD": VALUE, "ANSIBLE_FORKS": "5", "GPU_CAMPAIGN_LEASE": "x:1:t"}
    planted = [tmp_path / "trials/t.r1@h/ansible/artifacts/trial/command",
               tmp_path / "previous/t.r1@h.20260101-000000/ansible/artifacts/prepare/command",
               tmp_path / "hosts/h/ansible/artifacts/facts/command", tmp_path / "hosts/h/probe/artifacts/probe/command"]
    for path in planted:
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"command": ["ansible-playbook"], "cwd": "/", "env": env}))
    elsewhere = tmp_path / "trials/t.r1@h/raw/h/command"  # a trial's own file of that name is not ansible-runner's
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text(VALUE)
    assert sorted(scrub_command_artifacts(tmp_path)) == sorted(planted)
    for path in planted:
        kept = json.loads(path.read_text())["env"]
        assert kept == {"PATH": "/usr/bin", "DB_PASSWORD": "***", "ANSIBLE_FORKS": "5", "GPU_CAMPAIGN_LEASE": "x:1:t"}
    assert scrub_command_artifacts(tmp_path) == []  # nothing left to drop: nothing rewritten
    assert elsewhere.read_text() == VALUE
