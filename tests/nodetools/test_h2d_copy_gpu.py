"""nodetools/h2d_copy.py on a real NVIDIA GPU and driver: the copies run, the bytes come back, and the
GPU it names is the one nvidia-smi calls by that index. Skipped without one (CI). On a GPU node,
from the repository root (the system's Python and pytest alone; no conftest needed):

    python3 -m pytest --noconftest -p no:cacheprovider tests/nodetools/test_h2d_copy_gpu.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodetools import exitcodes, h2d_copy

REPO = Path(__file__).resolve().parents[2]


def _no_gpu() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    try:
        found = h2d_copy.probe()
    except h2d_copy.CudaError as exc:
        return str(exc)
    return str(found["why"])


pytestmark = pytest.mark.skipif(bool(_no_gpu()), reason=f"needs an NVIDIA GPU and driver: {_no_gpu()}")


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodetools.h2d_copy", *args], capture_output=True, text=True,
                          check=False, timeout=300, cwd=REPO)


def _smi(index: int, field: str) -> str:
    return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader", "-i", str(index)],
                          capture_output=True, text=True, check=True).stdout.strip()


def _indices() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True,
                         check=True).stdout
    return [int(i) for i in out.split()]


def _bus(pci: str) -> tuple[int, ...]:
    """'00000000:19:00.0' (nvidia-smi) and '0000:19:00.0' (CUDA) as the same numbers."""
    domain, bus, rest = pci.split(":")
    device, function = rest.split(".")
    return tuple(int(part, 16) for part in (domain, bus, device, function))


def test_real_copies_are_timed_verified_and_name_their_gpu() -> None:
    last = _indices()[-1]  # the last GPU: where CUDA's default order and nvidia-smi's differ, if anywhere
    done = _tool("--size-mib", "512", "--repeats", "3", "--gpu", str(last))
    assert done.returncode == exitcodes.OK, done.stderr
    record = json.loads(done.stdout)
    assert record["verified"] is True and record["size_bytes"] == 512 * 2**20 and record["repeats"] == 3
    # --gpu is nvidia-smi's index: the same device, whatever order CUDA would use by default.
    assert _bus(record["pci_bus_id"]) == _bus(_smi(last, "pci.bus_id"))
    assert record["gpu_name"] == _smi(last, "name")
    assert record["driver_version"] == _smi(last, "driver_version")
    rates = {(c["direction"], c["memory"]): c for c in record["copies"]}
    assert set(rates) == {("h2d", "pinned"), ("d2h", "pinned"), ("h2d", "pageable"), ("d2h", "pageable")}
    for copy in rates.values():
        # Between a slow PCIe 3 x4 link and more than any host link of today (NVLink-C2C: 450 GB/s a way).
        assert 0.5 < copy["gb_s"] <= copy["gb_s_max"] < 1000, copy
        assert len(copy["seconds"]) == 3


def test_an_index_past_the_last_gpu_is_bad_input() -> None:
    count = len(_indices())
    done = _tool("--gpu", str(count), "--size-mib", "1")
    assert done.returncode == exitcodes.BAD_INPUT
    assert done.stderr.startswith(f"h2d_copy: --gpu {count}: this node has {count} GPU")
