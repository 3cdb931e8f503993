"""Node-side preconditions of a trial: each unmet one is a reason to skip, in words a user can act on.

    python -m nodetools.preflight --port 8000 [--gpus 4] [--max-gpu-used-mib 2048]
        [--exists PATH ...] [--python PY --python-module MOD [--pythonpath DIRS]]
        [--docker-image IMG [--docker-module MOD]] [--vllm-subcommand NAME --launch-json JSON]

Prints ``{"reasons": [...]}`` (empty when everything holds) and exits 0: deciding to skip is the
playbook's job (2 for a bad command line, nodetools.exitcodes). Stdlib only: this runs on the node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from nodetools import exitcodes
from nodetools.gpu import NO_NVIDIA_SMI, gpu_list, memory_used_by_index
from nodetools.proc import port_open
from nodetools.vllm_cli import subcommand_reasons

__all__ = ["check", "main", "module_reasons"]

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.preflight", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--gpus", default="", help="comma-separated GPU indices")
    p.add_argument("--max-gpu-used-mib", type=int, default=2048)
    p.add_argument("--exists", nargs="*", default=[])
    p.add_argument("--python", default="")
    p.add_argument("--python-module", default="")
    p.add_argument("--pythonpath", default="", help="the engine's PYTHONPATH, for --python-module")
    p.add_argument("--docker-image", default="")
    p.add_argument("--docker-module", default="")
    p.add_argument("--vllm-subcommand", default="", help="a vLLM command the mode needs (preload)")
    p.add_argument("--launch-json", default="{}", help="the engine's launch (argv, env), for --vllm-subcommand")
    args = p.parse_args(argv)
    try:
        gpus = gpu_list(args.gpus, "preflight")
        launch = json.loads(args.launch_json)
        if not isinstance(launch, dict):
            raise ValueError(f"--launch-json must be a JSON object, got {type(launch).__name__}")
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return exitcodes.BAD_INPUT
    reasons = check(args.port, gpus, args.max_gpu_used_mib, args.exists, args.python, args.python_module,
                    args.docker_image, args.docker_module, args.pythonpath)
    if args.vllm_subcommand:
        reasons += subcommand_reasons(launch, args.vllm_subcommand, args.vllm_subcommand)
    sys.stdout.write(json.dumps({"reasons": reasons}) + "\n")
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
