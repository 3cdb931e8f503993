"""fio's input checks (roles/fio/tasks/validate.yml) run by ansible-playbook on the controller, as
playbooks/provision/preflight.yml runs them: the defaults pass, a bad value stops with its name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: fio
        tasks_from: validate
"""


def _validate(tmp_path: Path, extra: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "play.yml").write_text(PLAY)
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_NOCOLOR": "1"}
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    return subprocess.run([ansible_playbook, "-i", "localhost,", str(tmp_path / "play.yml"), "-e", json.dumps(extra)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_the_defaults_pass(tmp_path: Path) -> None:
    result = _validate(tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("extra", "said"), [
    ({"fio_packages": []}, "fio: fio_packages is []"),
    ({"fio_packages": "fio"}, 'fio: fio_packages is "fio"'),
    ({"fio_apt_cache_valid_time": "a day"}, 'fio: fio_apt_cache_valid_time is "a day"'),
])
def test_a_bad_input_stops_with_its_name(tmp_path: Path, extra: dict[str, object], said: str) -> None:
    result = _validate(tmp_path, extra)
    assert result.returncode != 0 and said in result.stdout, result.stdout + result.stderr
