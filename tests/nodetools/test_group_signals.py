"""A process group is signalled in one place only: ``nodetools/proc.py``, where every stop and
``signal_group`` live, so the proof that a group is still the one meant is never skipped elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

NODETOOLS = Path(__file__).resolve().parents[2] / "nodetools"


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
