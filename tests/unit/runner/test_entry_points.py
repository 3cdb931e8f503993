"""The command a user types: ``gpu-campaign`` is ``python -m runner``, and the layer contract that
keeps the runner's imports one-way really fails on a back-edge."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def test_console_script_is_the_runner() -> None:
    script = shutil.which("gpu-campaign", path=str(BIN))
    assert script, f"gpu-campaign is not installed in {BIN} (scripts/setup.sh installs the project)"
    out = subprocess.run([script, str(REPO / "campaigns/local.yaml"), "--plan", "--json"],
                         check=False, capture_output=True, text=True, timeout=60, cwd=REPO)
    via_module = subprocess.run([sys.executable, "-m", "runner", str(REPO / "campaigns/local.yaml"), "--plan",
                                 "--json"], check=False, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == via_module.returncode == 0, out.stderr
    assert out.stdout == via_module.stdout
    bad = subprocess.run([script, str(REPO / "campaigns/local.yaml"), "-e", "repeats=0", "--plan"],
                         check=False, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2 and "repeats" in bad.stderr


def test_the_layer_contract_fails_on_a_back_edge(tmp_path: Path) -> None:
    lint = shutil.which("lint-imports", path=str(BIN))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "runner", copy / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "nodetools", copy / "nodetools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    ok = subprocess.run([lint], check=False, capture_output=True, text=True, timeout=120, cwd=copy)
    assert ok.returncode == 0, ok.stdout
    # A bottom layer reaching up, inside a function where a module-level scan would miss it.
    errors = copy / "runner/errors.py"
    errors.write_text(errors.read_text() + "\n\ndef _late() -> None:\n    import runner.report  # noqa\n")
    broken = subprocess.run([lint], check=False, capture_output=True, text=True, timeout=120, cwd=copy)
    assert broken.returncode != 0 and "runner.errors -> runner.report" in broken.stdout, broken.stdout
