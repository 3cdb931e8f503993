"""The page-cache residency of a file, from fincore or, where util-linux lacks it, from mincore(2)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from nodetools import pagecache, residency, startprep


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_mincore_agrees_with_fincore_and_is_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(16 << 20))
    evict(path)
    cold = residency._resident_fraction_mincore([path])
    assert cold is not None and cold < 0.5
    residency.warm([str(path)])
    assert residency._resident_fraction_mincore([path]) == 1.0
    if shutil.which("fincore"):
        assert residency.resident_fraction([str(path)]) == 1.0
    monkeypatch.setattr(residency.shutil, "which", lambda name: None)  # a node without fincore
    evict(path)
    assert residency.resident_fraction([str(tmp_path)]) == residency._resident_fraction_mincore([path]) < 0.5


def test_evict_drops_only_the_named_files_and_says_what_it_achieved(tmp_path: Path) -> None:
    model, other = tmp_path / "model", tmp_path / "other.bin"
    model.mkdir()
    for i in range(3):
        (model / f"shard-{i}.safetensors").write_bytes(os.urandom(4 << 20))
    other.write_bytes(os.urandom(4 << 20))
    residency.warm([str(model), str(other)])
    assert residency.resident_fraction([str(model)]) == 1.0
    result = residency.evict([str(model)])
    assert result["method"] == "files" and result["files"] == 3 and result["bytes"] == 3 * (4 << 20)
    assert isinstance(result["resident_after"], float) and result["resident_after"] < 0.1
    assert residency.resident_fraction([str(model)]) == result["resident_after"]
    assert residency.resident_fraction([str(other)]) == 1.0  # the rest of the machine's cache is untouched


def test_evict_from_the_command_line_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(1 << 20))
    assert pagecache.main(["evict", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"] == 1 and out["resident_after"] < 0.5
    assert pagecache.main(["evict"]) == 2  # no path: bad input


def test_auto_drop_scope_is_polite_for_the_stand_in_and_global_for_a_real_engine() -> None:
    assert startprep.drop_scope("auto", "stand-in") == "files"
    assert startprep.drop_scope("auto", "vllm") == "global"
    assert startprep.drop_scope("global", "stand-in") == "global" and startprep.drop_scope("files", "vllm") == "files"
