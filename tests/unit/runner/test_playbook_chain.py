"""Two playbooks in one ansible-playbook (execute.start_phase's ``before``): how the host's first trial
reads the host's facts without a second ansible-playbook start. Real ansible-runner runs against
the local connection: the first playbook runs first, a host it fails is left out of the second,
and a folder name that looks like Jinja is imported as it is, never templated."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from runner.execute import run_phase

REPO = Path(__file__).resolve().parents[3]

STEP = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: {name}
      ansible.builtin.shell:
        cmd: "echo {name} >> {log}"
      changed_when: true
    - name: {name} fails when asked
      ansible.builtin.fail:
        msg: "{name} failed on purpose"
      when: fail_first | bool
"""


def _run(tmp_path: Path, folder: Path, *, fail_first: bool) -> tuple[object, list[str], list[str]]:
    folder.mkdir(parents=True)
    log = tmp_path / "ran.log"
    first, second = folder / "first.yml", folder / "second.yml"
    first.write_text(STEP.format(name="first", log=log))
    second.write_text(STEP.format(name="second", log=log).replace("when: fail_first | bool", "when: false"))
    inventory = tmp_path / "inventory"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    tasks: list[str] = []
    result = run_phase(phase="trial", playbook=second, before=first, project_dir=REPO,
                       private_data_dir=tmp_path / "trial" / "ansible", inventory=inventory, limit="localhost",
                       extravars={"fail_first": fail_first}, timeout_s=120, cancel=threading.Event(),
                       on_task=tasks.append)
    ran = log.read_text().split() if log.exists() else []
    return result, ran, tasks


def test_the_first_playbook_runs_before_the_second_in_one_ansible_playbook(tmp_path: Path) -> None:
    result, ran, tasks = _run(tmp_path, tmp_path / "plays", fail_first=False)
    assert result.ok, result.failures  # type: ignore[attr-defined]
    assert ran == ["first", "second"]
    assert tasks.index("first") < tasks.index("second")
    artifacts = list((tmp_path / "trial/ansible/artifacts").iterdir())
    assert [a.name for a in artifacts] == ["trial"]  # one run, one ident


def test_a_host_the_first_playbook_fails_is_left_out_of_the_second(tmp_path: Path) -> None:
    result, ran, tasks = _run(tmp_path, tmp_path / "plays", fail_first=True)
    assert not result.ok  # type: ignore[attr-defined]
    failure = result.failures[0]  # type: ignore[attr-defined]
    assert failure.task == "first fails when asked" and "first failed on purpose" in failure.message
    assert ran == ["first"] and "second" not in tasks


def test_a_folder_named_like_jinja_is_imported_as_it_is(tmp_path: Path) -> None:
    # A checkout under a folder such as "x{{ 7 * 7 }}" must not be templated into "x49" (nor run).
    result, ran, _ = _run(tmp_path, tmp_path / "x{{ 7 * 7 }}", fail_first=False)
    assert result.ok, result.failures  # type: ignore[attr-defined]
    assert ran == ["first", "second"]
