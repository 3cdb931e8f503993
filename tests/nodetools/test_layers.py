"""The node tools' layers hold: the import contract really fails when the library reaches up to a
program or a module is left out of it, and a process group is signalled in ``nodetools/proc.py``
only, where every stop and ``signal_group`` live, so the proof that a group is still the one meant
is never skipped elsewhere."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODETOOLS = REPO / "nodetools"


def _killpg_uses(path: Path) -> list[int]:
    """Lines of ``path`` that call or import ``os.killpg`` (``os.killpg``, ``from os import killpg``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        attribute = isinstance(node, ast.Attribute) and node.attr == "killpg"
        imported = isinstance(node, ast.ImportFrom) and node.module == "os" and "killpg" in {a.name for a in node.names}
        if attribute or imported:
            lines.append(node.lineno)
    return lines


def test_only_proc_signals_a_process_group() -> None:
    found = {str(p.relative_to(NODETOOLS)): lines for p in sorted(NODETOOLS.rglob("*.py"))
             if (lines := _killpg_uses(p))}
    assert set(found) == {"proc.py"}, f"os.killpg outside nodetools/proc.py (use proc.signal_group): {found}"


def test_the_nodetools_contract_fails_when_the_library_reaches_up(tmp_path: Path) -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    copy = tmp_path / "repo"
    for package in ("runner", "nodetools"):
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy / "pyproject.toml")
    ok = subprocess.run([lint], check=False, capture_output=True, text=True, timeout=120, cwd=copy)
    assert ok.returncode == 0, ok.stdout
    # The timer reaching up to a program, inside a function where a module-level scan would miss it,
    # and a new module nobody placed in a layer.
    timer = copy / "nodetools/timer.py"
    timer.write_text(timer.read_text() + "\n\ndef _late() -> None:\n    import nodetools.coldstart  # noqa\n")
    (copy / "nodetools/unplaced.py").write_text('"""Nobody put me in a layer."""\n')
    broken = subprocess.run([lint], check=False, capture_output=True, text=True, timeout=120, cwd=copy)
    assert broken.returncode != 0, broken.stdout
    assert "nodetools.timer -> nodetools.coldstart" in broken.stdout and "- nodetools.unplaced" in broken.stdout
