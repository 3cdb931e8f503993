"""Node-side preconditions of a trial: each unmet one is a reason to skip, in words a user can act on.

The port free, the GPUs there and idle, the paths the mode needs, a module beside the engine's
Python or in its image. ``python -m nodetools.preflight`` prints them; the startup trial's
``prepare`` (:mod:`nodetools.startprep`) and the offload preflight ask them directly. Stdlib only:
this runs on the node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from nodetools.gpu import NO_NVIDIA_SMI, memory_used_by_index
from nodetools.proc import port_open

__all__ = ["check", "module_reasons"]

_IMPORT_CHECK = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
IMPORT_TIMEOUT_S = 120  # a Python that cannot look a module up in this long will not start an engine either


def _gpu_reasons(gpus: list[int], max_used_mib: int) -> list[str]:
    if not gpus:
        return []
    used, error = memory_used_by_index()
    if used is None:
        return [f"GPUs {gpus} requested but {NO_NVIDIA_SMI}" if error == NO_NVIDIA_SMI else error]
    reasons = [f"GPU {g} does not exist on this node (it has {sorted(used)})" for g in gpus if g not in used]
    reasons += [f"GPU {g} has {used[g]} MiB in use (limit {max_used_mib}): another process holds it"
                for g in gpus if used.get(g, 0) > max_used_mib]
    return reasons


def module_reasons(python: str, module: str, pythonpath: str = "") -> list[str]:
    """Why ``module`` cannot be imported by the engine's Python with the engine's PYTHONPATH (a vLLM
    installed with ``--target`` and the packages beside it are found only there), or nothing."""
    if not python or not Path(python).exists():
        return [f"python {python!r} for the engine does not exist"]
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    try:
        done = subprocess.run([python, "-c", _IMPORT_CHECK, module], check=False, capture_output=True, env=env,
                              timeout=IMPORT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"python {python} did not say within {IMPORT_TIMEOUT_S} s whether it has module {module}"]
    if done.returncode == 0:
        return []
    where = f" (PYTHONPATH {pythonpath})" if pythonpath else ""
    return [f"python module {module} is not installed beside the engine ({python}{where}): the mode needs it"]


def check(port: int, gpus: list[int], max_gpu_used_mib: int, exists: list[str], python: str, python_module: str,
          docker_image: str, docker_module: str, pythonpath: str = "") -> list[str]:
    """Every unmet precondition in words (empty when all hold); a module is looked up with the
    engine's Python and ``pythonpath``, or in ``docker_image``."""
    reasons = []
    if port_open(port, timeout=0.5):
        reasons.append(f"port {port} already answers: another server runs on this node")
    reasons += _gpu_reasons(gpus, max_gpu_used_mib)
    reasons += [f"{path} does not exist" for path in exists if not Path(path).exists()]
    if python_module:
        reasons += module_reasons(python, python_module, pythonpath)
    if docker_image:
        if shutil.which("docker") is None:
            reasons.append("runtime docker but no docker on this node")
        elif subprocess.run(["docker", "image", "inspect", docker_image], check=False,
                            capture_output=True).returncode != 0:
            reasons.append(f"image {docker_image} is not on the node (the vllm_images role pulls or loads it)")
        elif docker_module and subprocess.run(
                ["docker", "run", "--rm", "--entrypoint", "python3", docker_image, "-c", _IMPORT_CHECK, docker_module],
                check=False, capture_output=True).returncode != 0:
            reasons.append(f"python module {docker_module} is not installed in {docker_image}")
    return reasons
