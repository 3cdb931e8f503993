"""Secrets by reference, the controller's side: the planned launch and the playbooks carry names,
the playbook that starts an engine writes the values to a 0600 file on the node and no artefact of
its run holds one (real ansible-runner, the real task file)."""

from __future__ import annotations

import itertools
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodetools.secret_env import SECRETS_FILE
from runner.execute import start_phase
from runner.experiments.launch import engine_launch

REPO = Path(__file__).resolve().parents[3]
EXPERIMENTS = REPO / "playbooks" / "experiments"
VALUE = "hf_by-reference-0123456789abcdef"

# The playbooks that start an engine, the program they start it with, and their collect.
STARTS = {"startup/trial.yml": "exp_node.commands.trial", "snapshot/measure.yml": "exp_node.commands.measure",
          "offload/measure.yml": "exp_node.commands.run"}
COLLECTS = ("tasks/collect_engine_files.yml", "offload/collect.yml")


def _tasks(node: object) -> list[dict[str, object]]:
    """Every task of a playbook or task file, blocks flattened, in order."""
    out: list[dict[str, object]] = []
    items = node if isinstance(node, list) else [node]
    for item in items:
        if not isinstance(item, dict):
            continue
        if "tasks" in item or "block" in item:
            for key in ("tasks", "block", "always"):
                out += _tasks(item.get(key) or [])
        else:
            out.append(item)
    return out


def test_docker_gets_the_secret_by_name_and_its_value_from_its_own_environment() -> None:
    engine = {"kind": "vllm", "runtime": "docker", "image": "vllm/vllm-openai:v0.24.0", "model": "/models/m",
              "env": {"VLLM_LOGGING_LEVEL": "INFO"}, "env_from_controller": ["HF_TOKEN", "VLLM_API_KEY"]}
    argv = engine_launch(engine, "c")["argv"]
    pairs = list(itertools.pairwise(argv))
    assert ("-e", "HF_TOKEN") in pairs and ("-e", "VLLM_API_KEY") in pairs
    assert ("-e", "VLLM_LOGGING_LEVEL=INFO") in pairs
    assert not any(a.startswith(("HF_TOKEN=", "VLLM_API_KEY=")) for a in argv)


@pytest.mark.parametrize(("playbook", "program"), sorted(STARTS.items()))
def test_each_playbook_that_starts_an_engine_hands_the_secrets_over_just_before(playbook: str, program: str) -> None:
    tasks = _tasks(yaml.safe_load((EXPERIMENTS / playbook).read_text()))
    names = [str(t.get("ansible.builtin.import_tasks", "")) for t in tasks]
    starts = next(i for i, t in enumerate(tasks) if program in json.dumps(t))
    assert names[starts - 1] == "../tasks/write_secrets.yml", names


@pytest.mark.parametrize("collect", COLLECTS)
def test_each_collect_removes_the_secrets_file_first(collect: str) -> None:
    tasks = _tasks(yaml.safe_load((EXPERIMENTS / collect).read_text()))
    included = str(tasks[0].get("ansible.builtin.include_tasks") or "")
    if included:  # collect_engine_files.yml: first, unless the program that takes the file ended cleanly
        when = str(tasks[0]["when"])
        assert "not (engine_stopped_cleanly | default(false) | bool)" in when and " or " in when, when
        tasks = _tasks(yaml.safe_load((EXPERIMENTS / collect).parent.joinpath(included).read_text()))
    assert str(tasks[0].get("ansible.builtin.import_tasks")).endswith("remove_secrets.yml")


def test_a_program_that_ended_cleanly_took_the_secrets_file_before_anything_else(tmp_path: Path) -> None:
    """Why the collect may skip its removal after a clean end (engine_stopped_cleanly: rc 0): the
    trial program takes (and removes) the file first, whatever comes after."""
    (tmp_path / SECRETS_FILE).write_text("{}")
    done = subprocess.run([sys.executable, "-m", "nodetools.coldstart", "trial", "--dir", str(tmp_path),
                           "--launch-json", "{}", "--check"], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and not (tmp_path / SECRETS_FILE).exists(), done.stderr


def test_the_file_the_playbooks_write_is_the_one_the_node_tools_read() -> None:
    names = yaml.safe_load((EXPERIMENTS / "vars/engine.yml").read_text())
    assert names["secrets_file"] == "{{ exp_remote_dir }}/" + SECRETS_FILE
    (task,) = yaml.safe_load((EXPERIMENTS / "tasks/write_secrets.yml").read_text())
    assert task["no_log"] is True


PLAYBOOK = """\
- hosts: localhost
  gather_facts: false
  vars:
    secrets_file: "{{ exp_remote_dir }}/secrets.json"
  tasks:
    - name: Hand the engine's secrets to the node
      ansible.builtin.import_tasks: %s/tasks/write_secrets.yml
"""


def test_the_write_task_makes_a_0600_file_and_no_artefact_holds_the_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("OTHER_TOKEN", VALUE[::-1])  # set, but not named: never written
    (tmp_path / "play.yml").write_text(PLAYBOOK % EXPERIMENTS)
    (tmp_path / "inventory").write_text(f"localhost ansible_connection=local "
                                        f"ansible_python_interpreter={sys.executable}\n")
    node = tmp_path / "node" / "trial"  # no folder yet: the first trial on a node
    private = tmp_path / "results" / "ansible"
    result = start_phase(phase="run", playbook=tmp_path / "play.yml", project_dir=REPO, private_data_dir=private,
                         inventory=tmp_path / "inventory", limit="localhost",
                         extravars={"exp_remote_dir": str(node), "exp_secret_names": ["HF_TOKEN"]}, timeout_s=120,
                         cancel=lambda: False).wait()
    assert result.ok, result.failures
    written = node / SECRETS_FILE
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert json.loads(written.read_text()) == {"HF_TOKEN": VALUE}
    for path in private.rglob("*"):
        if path.is_file():
            assert VALUE.encode() not in path.read_bytes() and VALUE[::-1].encode() not in path.read_bytes(), path
    events = [json.loads(p.read_text()) for p in (private / "artifacts/run/job_events").glob("*.json")]
    (done,) = [e for e in events if e["event"] == "runner_on_ok"]
    assert "output has been hidden" in done["event_data"]["res"]["censored"]  # no_log
