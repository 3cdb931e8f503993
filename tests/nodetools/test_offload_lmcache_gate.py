"""LMCache's compiled extension, asked of the engine's real Python before any engine starts: a
package whose extension fails to import (a wheel built for another torch) is refused in seconds,
with the import's own error."""

from __future__ import annotations

import sys
from pathlib import Path

from nodetools.offload.lmcache_gate import extension_reasons
from nodetools.offload.preflight import Need, preflight_node


def _lmcache(root: Path, extension: str) -> str:
    """A package named lmcache on a PYTHONPATH of its own, with ``cuda_ops`` as given."""
    package = root / "lmcache"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cuda_ops.py").write_text(extension)
    return str(root)


def test_an_extension_built_for_another_torch_is_refused_with_its_error(tmp_path: Path) -> None:
    path = _lmcache(tmp_path, "raise ImportError('cuda_ops.so: undefined symbol: _ZN3c1017SymbolicShapeMeta')\n")
    (reason,) = extension_reasons(sys.executable, path)
    assert reason.startswith("LMCache's CUDA extension does not import beside the engine, so LMCache would run on "
                             "torch ops (lmcache.cuda_ops: ImportError: cuda_ops.so: undefined symbol: _ZN3c10")
    assert "lmcache.c_ops: ModuleNotFoundError" in reason  # the older name was looked for too
    assert reason.endswith("or set allow_torch_fallback: true in the mode to measure the fallback on purpose")


def test_an_extension_that_imports_passes(tmp_path: Path) -> None:
    assert extension_reasons(sys.executable, _lmcache(tmp_path, "BOUND = True\n")) == []
    assert extension_reasons(str(tmp_path / "no-python"))[0].startswith(
        "LMCache's CUDA extension: could not ask ")


def test_the_preflight_asks_only_when_the_mode_refuses_the_fallback(tmp_path: Path) -> None:
    path = _lmcache(tmp_path, "raise ImportError('undefined symbol')\n")
    need = {"python": sys.executable, "python_module": "lmcache", "pythonpath": path}
    refused = preflight_node({}, Need.from_json({**need, "refuse_torch_ops": True}))["reasons"]
    assert any(r.startswith("LMCache's CUDA extension does not import beside the engine") for r in refused)
    allowed = preflight_node({}, Need.from_json({**need, "refuse_torch_ops": False}))["reasons"]
    assert not any("CUDA extension" in r for r in allowed)
