"""The node's GPUs as nvidia-smi reports them: memory in use and in total, the driver, persistence
mode, the processes holding a CUDA context. Every query answers "unknown" (None, or nothing) on a
node without nvidia-smi instead of failing. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess

__all__ = ["NO_NVIDIA_SMI", "compute_app_pids", "driver_major", "gpu_list", "memory_total_mib",
           "memory_used_by_index", "memory_used_mib", "persistence_off", "query"]

NO_NVIDIA_SMI = "nvidia-smi is not on this node"


def query(fields: str, timeout: float = 60) -> tuple[list[list[str]] | None, str]:
    """``nvidia-smi --query-gpu=FIELDS`` as rows of stripped values, one row per GPU; ``(None, why)``
    when nvidia-smi is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None, NO_NVIDIA_SMI
    done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=False, timeout=timeout)
    if done.returncode != 0:
        return None, f"nvidia-smi failed: {(done.stderr or done.stdout).strip().splitlines()[:1]}"
    return [[value.strip() for value in line.split(",")] for line in done.stdout.splitlines() if line.strip()], ""


def _per_index(fields: str, timeout: float = 60) -> tuple[dict[int, int] | None, str]:
    """``index,<number field>`` per GPU index (rows that are not two numbers are passed over)."""
    rows, error = query(fields, timeout)
    if rows is None:
        return None, error
    return {int(r[0]): int(r[1]) for r in rows if len(r) == 2 and r[0].isdigit() and r[1].isdigit()}, ""


def memory_used_by_index(timeout: float = 60) -> tuple[dict[int, int] | None, str]:
    """MiB in use per GPU index; ``(None, why)`` when nvidia-smi cannot tell."""
    return _per_index("index,memory.used", timeout)


def memory_used_mib(gpus: list[int], timeout: float = 30) -> list[int] | None:
    """MiB in use on each of ``gpus`` (every GPU when empty), or None without nvidia-smi."""
    used, _ = memory_used_by_index(timeout)
    if used is None:
        return None
    return [used[g] for g in gpus if g in used] if gpus else list(used.values())


def memory_total_mib(timeout: float = 60) -> dict[int, int]:
    """Each GPU's memory in MiB by index (empty without nvidia-smi)."""
    return _per_index("index,memory.total", timeout)[0] or {}


def driver_major(timeout: float = 60) -> int | None:
    """The NVIDIA driver's major version (580 for 580.159.04), or None without a driver."""
    rows, _ = query("driver_version", timeout)
    first = rows[0][0].split(".")[0] if rows and rows[0] else ""
    return int(first) if first.isdigit() else None


def persistence_off(timeout: float = 60) -> list[str]:
    """The indices of the GPUs whose persistence mode is off."""
    rows, _ = query("index,persistence_mode", timeout)
    return [r[0] for r in rows or [] if "Disabled" in r[1:]]


def compute_app_pids(timeout: float = 60) -> list[int]:
    """The pids nvidia-smi lists as holding a CUDA context (none in some VMs and containers)."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False, timeout=timeout)
    pids = []
    for word in done.stdout.split():
        with contextlib.suppress(ValueError):
            pids.append(int(word))
    return pids


def gpu_list(text: str, prog: str) -> list[int]:
    """``--gpus 0,1`` as indices; ``ValueError`` with the one-line message a tool prints otherwise."""
    try:
        return [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise ValueError(f"{prog}: --gpus {text!r} is not a comma-separated list of GPU indices") from None
