"""What every playbook run inherits: ansible-runner would turn host-key checking off unless told."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.execute import _envvars, host_key_checking

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
