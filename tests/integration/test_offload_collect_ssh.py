"""The offload collect over SSH and on a local connection: its one archive brings every file the
trial wrote home under the planned name, with the node's facts after the trial. The SSH test host
shares this machine's filesystem, so the test also checks which way the files came: fetched over
SSH (the node keeps its archive, the fetched copy is unpacked and removed), or unpacked where the
node left it (a local connection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.plan import expand
from runner.spec import load_campaign
from tests.support.sshd_hosts import SshHostSet

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
FILES = ("server.log", "requests.jsonl", "run.json", "launch.json", "preflight.json", "facts_before.json",
         "metrics_before.txt", "metrics_after.txt", "quality.jsonl", "dmesg.txt")


def _extravars(tmp_path: Path, inventory: Path, host: str) -> dict[str, Any]:
    text = (REPO / "campaigns/offload-local.yaml").read_text()
    text = text.replace("inventory: ../inventory/local", f"inventory: {inventory}").replace(
        "hosts: all", f"hosts: {host}").replace("remote_dir: /tmp/gpu-campaign", f"remote_dir: {tmp_path / 'node'}")
    (tmp_path / "c.yaml").write_text(text.replace("offload_gib: 0.5", "offload_gib: 0.5\n        engine_copies: 1"))
    trial = next(t for t in expand(load_campaign(tmp_path / "c.yaml")).trials if t.mode == "native_cpu")
    return {"exp_trial_id": trial.id, "exp_engine": trial.engine, "exp_resources": trial.resources.as_dict(),
            "exp_remote_dir": trial.remote_dir, "exp_node": trial.node.as_dict(),
            "exp_results_dir": str(tmp_path / "results"), "exp_secret_names": []}


def _collect(tmp_path: Path, inventory: Path, host: str) -> tuple[Path, Path]:
    extravars = _extravars(tmp_path, inventory, host)
    work = Path(extravars["exp_remote_dir"])
    work.mkdir(parents=True)
    for name in FILES[:-1]:  # dmesg.txt: the cleanup writes it
        (work / name).write_text(json.dumps({"file": name}) if name.endswith(".json") else f"{name}\n")
    raw = tmp_path / "results" / "raw" / host
    raw.mkdir(parents=True)
    (tmp_path / "vars.json").write_text(json.dumps(extravars))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "-l", host,
                           "playbooks/experiments/offload/collect.yml", "-e", f"@{tmp_path / 'vars.json'}"],
                          cwd=REPO, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # as the runner runs it
    assert done.returncode == 0, done.stdout[-3000:]
    return work, raw


def test_over_ssh_the_archive_is_fetched_once_and_unpacked(ssh_hosts: SshHostSet, ssh_inventory: Path,
                                                           tmp_path: Path) -> None:
    work, raw = _collect(tmp_path, ssh_inventory, "h1")
    for name in (*FILES[:-1], "facts_after.json"):
        assert (raw / name).is_file(), name
    assert json.loads((raw / "run.json").read_text()) == {"file": "run.json"}
    assert "memory" in json.loads((raw / "facts_after.json").read_text())
    assert (work / "collect.tar").is_file() and (work / "facts_after.json").is_file()  # written on the node
    assert not (raw.parent / "h1.tar").exists()  # the fetched archive, unpacked and removed


def test_on_a_local_connection_the_nodes_archive_is_unpacked_where_it_lies(tmp_path: Path) -> None:
    work, raw = _collect(tmp_path, REPO / "inventory/local", "localhost")
    for name in (*FILES[:-1], "facts_after.json"):
        assert (raw / name).is_file(), name
    assert not (work / "collect.tar").exists() and not (work / "facts_after.json").exists()
    assert not (raw.parent / "localhost.tar").exists()
