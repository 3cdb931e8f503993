"""nodetools.preflight's module check: the engine's packages are found with the engine's PYTHONPATH.

On the borrowed H200, vLLM and its loaders live in a ``--target`` folder that only the engine's
PYTHONPATH names; a check without it skipped runai_streamer and fastsafetensors although both were
installed. The CLI is what the startup playbook runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def preflight(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "nodetools.preflight", "--port", "1", *args],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout)["reasons"]


def test_a_module_beside_the_engine_is_found_on_its_pythonpath(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "loader_beside_engine").mkdir(parents=True)
    (site / "loader_beside_engine" / "__init__.py").write_text("")
    need = ["--python", sys.executable, "--python-module", "loader_beside_engine"]
    assert preflight(*need) == [
        f"python module loader_beside_engine is not installed beside the engine ({sys.executable}): the mode needs it"]
    assert preflight(*need, "--pythonpath", str(site)) == []
    assert preflight("--python", str(tmp_path / "no-python"), "--python-module", "x") == [
        f"python {str(tmp_path / 'no-python')!r} for the engine does not exist"]
