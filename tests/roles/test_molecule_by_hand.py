"""Molecule run by hand in a role folder, outside scripts/test-roles.sh (docs/roles.md, "Running one
scenario by hand"): a bare ``.venv/bin/molecule list``, with nothing of the venv on ``PATH``, works
(the launcher scripts/install-molecule-launcher.sh writes in place of pip's script), and the create
step stops with one line saying what to run. Nothing is created: the create playbook is run as
molecule runs it, without the harness's variables, and stops at its first task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
BARE_PATH = "/usr/bin:/bin"  # what sudo or a fresh shell gives: no venv on it


def _env(home: Path, path: str = f"{VENV_BIN}{os.pathsep}{BARE_PATH}") -> dict[str, str]:
    """A user's shell (by default with the venv activated): nothing of the harness (no RT_RUN, RT_NETNS, RT_DIR)."""
    return {"HOME": str(home), "PATH": path, "LANG": "C.UTF-8",
            "ANSIBLE_FORCE_COLOR": "0", "PY_COLORS": "0", "NO_COLOR": "1"}  # fmt: skip


def _molecule_list(molecule: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(molecule), "list"], cwd=REPO / "roles" / "fio", env=_env(home, BARE_PATH),
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def _assert_lists_fio(done: subprocess.CompletedProcess[str]) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rt-fio" in out and "default" in out
    assert "Traceback" not in out


def _venv_copy(root: Path) -> Path:
    """This venv again under ``root``, made of links (its packages, its programs but ``molecule``):
    its python (``root/bin/python``) runs with ``root`` as its prefix, so the launcher is installed
    and run there without touching the venv the tests run in."""
    real = VENV_BIN.parent
    (root / "bin").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "bin":
            (root / entry.name).symlink_to(entry)
    for program in VENV_BIN.iterdir():
        if program.name != "molecule":
            (root / "bin" / program.name).symlink_to(program)
    return root


def _pip_script(python: Path) -> str:
    """The console script pip writes for molecule's entry point."""
    (entry,) = entry_points(group="console_scripts", name="molecule")
    module, func = entry.value.split(":")
    return (f"#!{python}\nimport sys\nfrom {module} import {func}\nif __name__ == '__main__':\n"
            f"    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n    sys.exit({func}())\n")


def test_bare_molecule_list_in_a_role_folder_lists_its_scenario(tmp_path: Path) -> None:
    """The venv's molecule as scripts/setup.sh --dev leaves it, called by its path with no venv on PATH."""
    pytest.importorskip("molecule", reason="molecule is a dev extra (scripts/test-roles.sh installs it)")
    _assert_lists_fio(_molecule_list(VENV_BIN / "molecule", tmp_path))


def test_the_launcher_is_what_makes_bare_molecule_work(tmp_path: Path) -> None:
    pytest.importorskip("molecule", reason="molecule is a dev extra (scripts/test-roles.sh installs it)")
    venv = _venv_copy(tmp_path / "venv")
    molecule = venv / "bin" / "molecule"
    molecule.write_text(_pip_script(venv / "bin" / "python"))
    molecule.chmod(0o755)
    done = _molecule_list(molecule, tmp_path)  # pip's script: ansible-compat finds no ansible-config
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "FileNotFoundError" in out and "'ansible-config'" in out, out

    installer = [str(REPO / "scripts/install-molecule-launcher.sh"), str(venv)]
    subprocess.run(installer, check=True, timeout=60)
    first = molecule.read_bytes()
    assert first.startswith(f"#!{venv}/bin/python\n".encode())
    subprocess.run(installer, check=True, timeout=60)  # again: one file, the same bytes, no temp file left
    assert molecule.read_bytes() == first
    assert sorted(p.name for p in (venv / "bin").glob("molecule*")) == ["molecule"]
    assert os.access(molecule, os.X_OK)
    _assert_lists_fio(_molecule_list(molecule, tmp_path))


def test_the_launcher_works_from_a_venv_whose_path_has_a_space(tmp_path: Path) -> None:
    """The kernel splits a shebang at a space: there sh starts the venv's python, as pip's scripts do."""
    pytest.importorskip("molecule", reason="molecule is a dev extra (scripts/test-roles.sh installs it)")
    venv = _venv_copy(tmp_path / "my venvs" / "venv")
    subprocess.run([str(REPO / "scripts/install-molecule-launcher.sh"), str(venv)], check=True, timeout=60,
                   env={**os.environ, "CDPATH": str(tmp_path)})  # cd would print the folder under CDPATH
    molecule = venv / "bin" / "molecule"
    assert molecule.read_text().startswith("#!/bin/sh\n")
    _assert_lists_fio(_molecule_list(molecule, tmp_path))


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
