"""nodetools.gpu: nvidia-smi's answers read once for every tool (a fake nvidia-smi on the PATH)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodetools import gpu
from nodetools.node_checks import check

SMI = """#!/bin/sh
case "$1" in
  --query-gpu=index,memory.used) printf '0, 100\\n1, 4096\\n[N/A], x\\n';;
  --query-gpu=index,memory.total) printf '0, 143771\\n1, 143771\\n';;
  --query-gpu=driver_version) echo "580.159.04";;
  --query-gpu=index,persistence_mode) printf '0, Enabled\\n1, Disabled\\n';;
  --query-compute-apps=pid) printf '11\\n12\\nno\\n';;
esac
"""


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str = SMI) -> None:
    path = tmp_path / "nvidia-smi"
    path.write_text(script)
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_the_queries_read_what_nvidia_smi_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, monkeypatch)
    assert gpu.memory_used_by_index() == ({0: 100, 1: 4096}, "")
    assert gpu.memory_used_mib([1]) == [4096] and gpu.memory_used_mib([]) == [100, 4096]
    assert gpu.memory_total_mib() == {0: 143771, 1: 143771}
    assert gpu.driver_major() == 580
    assert gpu.persistence_off() == ["1"]
    assert gpu.compute_app_pids() == [11, 12]
    assert check(1, [1, 2], 2048, [], "", "", "", "") == [
        "GPU 2 does not exist on this node (it has [0, 1])",
        "GPU 1 has 4096 MiB in use (limit 2048): another process holds it"]


def test_without_nvidia_smi_everything_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu.memory_used_by_index() == (None, gpu.NO_NVIDIA_SMI)
    assert gpu.memory_used_mib([0]) is None and gpu.driver_major() is None
    assert gpu.memory_total_mib() == {} and gpu.persistence_off() == [] and gpu.compute_app_pids() == []
    assert check(1, [0], 2048, [], "", "", "", "") == ["GPUs [0] requested but nvidia-smi is not on this node"]


def test_a_failing_nvidia_smi_is_a_reason_in_its_own_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, monkeypatch, "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert check(1, [0], 2048, [], "", "", "", "") == ["nvidia-smi failed: ['NVIDIA-SMI has failed']"]
    assert gpu.memory_used_mib([0]) is None
