"""Molecule run by hand in a role folder, outside scripts/test-roles.sh (docs/roles.md, "Running one
scenario by hand"): with the venv's ``bin/`` on ``PATH``, ``molecule list`` works, and the create step
stops with one line saying what to run. Nothing is created: the create playbook is run as molecule
runs it, without the harness's variables, and stops at its first task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _env(home: Path) -> dict[str, str]:
    """A user's shell with the venv activated: nothing of the harness (no RT_RUN, RT_NETNS, RT_DIR)."""
    return {"HOME": str(home), "PATH": f"{VENV_BIN}{os.pathsep}/usr/bin:/bin", "LANG": "C.UTF-8",
            "ANSIBLE_FORCE_COLOR": "0", "PY_COLORS": "0", "NO_COLOR": "1"}  # fmt: skip


def test_molecule_list_in_a_role_folder_lists_its_scenario(tmp_path: Path) -> None:
    pytest.importorskip("molecule", reason="molecule is a dev extra (scripts/test-roles.sh installs it)")
    done = subprocess.run([str(VENV_BIN / "molecule"), "list"], cwd=REPO / "roles" / "fio", env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rt-fio" in out and "default" in out
    assert "Traceback" not in out


def test_create_outside_the_harness_stops_with_one_line_saying_what_to_run(tmp_path: Path) -> None:
    variables = tmp_path / "molecule.json"  # what molecule passes the create playbook
    variables.write_text(json.dumps({
        "molecule_yml": {"platforms": [{"name": "rt-fio", "rt_kind": "container", "rt_args": ["1G"]}]},
        "molecule_instance_config": str(tmp_path / "instance_config.yml"),
    }))  # fmt: skip
    env = {**_env(tmp_path), "MOLECULE_SCENARIO_NAME": "default"}
    done = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(REPO / "tests/roles/molecule/create.yml"),
         "-e", f"@{variables}"],
        cwd=REPO / "roles" / "fio", env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    failed = [line for line in out.splitlines() if line.startswith("fatal: [localhost]: FAILED!")]
    assert len(failed) == 1, out
    assert "in this role folder run sudo ../../scripts/test-roles.sh --shell molecule test -s default" in failed[0]
    assert "ok=0" in out and "changed=0" in out  # stopped at its first task: nothing started
    assert not (tmp_path / "instance_config.yml").exists()
