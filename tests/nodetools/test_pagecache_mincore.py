"""The page-cache residency of a file, from fincore or, where util-linux lacks it, from mincore(2)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from nodetools import pagecache


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
    cold = pagecache._resident_fraction_mincore([path])
    assert cold is not None and cold < 0.5
    pagecache.warm([str(path)])
    assert pagecache._resident_fraction_mincore([path]) == 1.0
    if shutil.which("fincore"):
        assert pagecache.resident_fraction([str(path)]) == 1.0
    monkeypatch.setattr(pagecache.shutil, "which", lambda name: None)  # a node without fincore
    evict(path)
    assert pagecache.resident_fraction([str(tmp_path)]) == pagecache._resident_fraction_mincore([path]) < 0.5
