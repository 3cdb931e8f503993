# SPDX-License-Identifier: MIT
"""The node_facts module end to end: ansible-playbook runs it on this machine, as a node would.

These prove that Ansible finds the module and ships its module_utils with it (the readers themselves
are tested in test_node_facts_gpus.py, test_node_facts_host.py and test_node_facts_nvidia_smi.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
MODULE_DIR = REPO / "plugins" / "modules"
MODULE_UTILS_DIR = REPO / "plugins" / "module_utils"
FIXTURES = REPO / "tests" / "fixtures" / "node_facts"
SYSFS = FIXTURES / "sysfs"
PROCFS = FIXTURES / "proc"
SMI = FIXTURES / "nvidia_smi"


VENV_BIN = Path(sys.executable).parent
ANSIBLE_PLAYBOOK = VENV_BIN / "ansible-playbook"


def _run_playbook(
    tmp_path: Path, module_args: dict[str, Any], check: bool = False, project_cfg: bool = False
) -> dict[str, Any]:
    """Run node_facts on localhost through ansible-playbook; return the task result dict.

    By default the run is isolated from the project's ansible.cfg and is told where the module and its
    module_utils are; ``project_cfg`` runs with ansible.cfg itself, as the runner and site.yml do.
    """
    playbook = tmp_path / "play.yml"
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
        "tasks": [{"name": "node facts", "node_facts": module_args}],
    }
    playbook.write_text(json.dumps([play]))  # JSON is YAML
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        ANSIBLE_HOME=str(tmp_path / "ansible_home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible_tmp"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_NOCOLOR="1",
    )
    for name in ("ANSIBLE_LIBRARY", "ANSIBLE_MODULE_UTILS"):
        env.pop(name, None)
    if project_cfg:
        env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    else:
        (tmp_path / "ansible.cfg").write_text("[defaults]\n")
        env.update(
            ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
            ANSIBLE_LIBRARY=str(MODULE_DIR),
            ANSIBLE_MODULE_UTILS=str(MODULE_UTILS_DIR),
        )
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(playbook)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["stats"]["localhost"]["failures"] == 0
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


needs_ansible = pytest.mark.skipif(
    not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not next to python"
)


@needs_ansible
@pytest.mark.parametrize("check", [False, True], ids=["normal", "check_mode"])
def test_end_to_end_on_this_machine(tmp_path: Path, check: bool) -> None:
    args: dict[str, Any] = {}
    if shutil.which("nvidia-smi"):  # a GPU machine: force the no-GPU path this test is about
        args["nvidia_smi_path"] = str(tmp_path / "no-nvidia-smi")
    result = _run_playbook(tmp_path, args, check=check)
    assert result["changed"] is False
    facts = result["ansible_facts"]["node_facts"]
    assert result["node_facts"] == facts
    assert facts["gpus"] == []
    assert facts["gpu_count"] == 0
    assert facts["gpu_error"].startswith("nvidia-smi not found")
    assert facts["driver_version"] is None
    assert facts["memory"]["total_bytes"] > 0
    assert facts["page_cache_bytes"] == facts["memory"]["cached_bytes"]
    assert isinstance(facts["numa"], list)
    assert facts["mounts"]
    assert any(m["mountpoint"] == "/" for m in facts["mounts"])
    assert facts["cpu"]["threads"] >= 1
    assert facts["kernel"] == os.uname().release
    assert isinstance(facts["disks"], list)
    assert facts["shm"]["path"] == "/dev/shm"


@needs_ansible
def test_end_to_end_with_fixture_trees_and_a_fake_nvidia_smi(tmp_path: Path) -> None:
    envlog = tmp_path / "lc_all.txt"
    stub = tmp_path / "nvidia-smi"
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "$LC_ALL" > "{envlog}"\n'
        'case "$1" in\n'
        f'  --query-gpu=*) cat "{SMI / "hgx_h200_8gpu_nounits.csv"}" ;;\n'
        f'  --version) cat "{SMI / "version.txt"}" ;;\n'
        f'  *) cat "{SMI / "plain_header.txt"}" ;;\n'
        "esac\n"
    )
    stub.chmod(0o755)
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "vllm_offload_7").write_bytes(b"\0" * 1000)
    args = {
        "sysfs_root": str(SYSFS),
        "procfs_root": str(PROCFS),
        "shm_path": str(shm),
        "nvidia_smi_path": str(stub),
        "mount_timeout": 0,
    }
    result = _run_playbook(tmp_path, args, check=True)
    facts = result["node_facts"]
    assert result["changed"] is False
    assert envlog.read_text().strip() == "C"
    assert facts["gpu_error"] is None
    assert facts["gpu_count"] == 8
    assert facts["driver_version"] == "580.159.04"
    assert facts["cuda_version"] == "13.0"
    assert [g["numa_node"] for g in facts["gpus"]] == [0, 0, 0, 0, 1, 1, None, 1]
    assert [n["node"] for n in facts["numa"]] == [0, 1]
    assert facts["memory"]["total_bytes"] == 2112322492 * 1024
    assert facts["page_cache_bytes"] == 80380392 * 1024
    assert facts["cpu"]["sockets"] == 2
    assert [d["name"] for d in facts["disks"]] == ["loop1", "md0", "nvme0n1", "nvme1n1", "sda"]
    assert facts["shm"]["vllm_offload_files"] == [{"name": "vllm_offload_7", "size_bytes": 1000}]
    assert facts["shm"]["vllm_offload_bytes"] == 1000
    assert [m["mountpoint"] for m in facts["mounts"]] == [
        "/",
        "/dev/shm",
        "/boot/efi",
        "/data",
        "/mnt/model weights",
    ]
    assert all(m["size_bytes"] is None for m in facts["mounts"])  # mount_timeout 0


@needs_ansible
def test_the_project_ansible_cfg_finds_the_module_and_its_module_utils(tmp_path: Path) -> None:
    # No ANSIBLE_LIBRARY / ANSIBLE_MODULE_UTILS: ansible.cfg's library and module_utils paths alone.
    result = _run_playbook(tmp_path, {"procfs_root": str(PROCFS), "sysfs_root": str(SYSFS)}, project_cfg=True)
    facts = result["node_facts"]
    assert facts["memory"]["total_bytes"] == 2112322492 * 1024
    assert facts["cpu"]["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert [n["node"] for n in facts["numa"]] == [0, 1]


@needs_ansible
def test_dest_writes_the_facts_once_and_never_in_check_mode(tmp_path: Path) -> None:
    # The collect of a trial writes facts_after.json with the module itself (one task, not two).
    dest = tmp_path / "trial" / "facts_after.json"  # a skipped trial made no folder
    # Every fact from the fixtures, none from this machine: the live /dev/shm (its used bytes, its
    # vllm_offload_* files) changes whenever another test or program writes there, and then the
    # third run rightly reports a change (it failed 2 runs in 6 so). No statvfs of the mounts either.
    args = {"procfs_root": str(PROCFS), "sysfs_root": str(SYSFS), "mount_timeout": 0,
            "shm_path": str(tmp_path / "no-shm"), "nvidia_smi_path": str(tmp_path / "no-nvidia-smi"),
            "dest": str(dest)}
    checked = _run_playbook(tmp_path, args, check=True)
    assert checked["changed"] is True and not dest.exists()  # it would write, and did not
    written = _run_playbook(tmp_path, args)
    assert written["changed"] is True
    assert json.loads(dest.read_text()) == written["node_facts"]
    assert oct(dest.stat().st_mode & 0o777) == "0o644"
    assert _run_playbook(tmp_path, args)["changed"] is False  # same facts, same file
    shm = tmp_path / "shm"  # a fact that changes (an offload buffer appears): written again
    (shm / "vllm_offload_0").parent.mkdir()
    (shm / "vllm_offload_0").write_bytes(b"kv")
    again = _run_playbook(tmp_path, {**args, "shm_path": str(shm)})
    assert again["changed"] is True and json.loads(dest.read_text())["shm"]["vllm_offload_bytes"] == 2
