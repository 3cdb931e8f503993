"""Node-side preconditions of a trial: each unmet one is a reason to skip, in words a user can act on.

    python -m nodetools.preflight --port 8000 [--gpus 4] [--max-gpu-used-mib 2048]
        [--exists PATH ...] [--python PY --python-module MOD [--pythonpath DIRS]]
        [--docker-image IMG [--docker-module MOD]] [--vllm-subcommand NAME --launch-json JSON]

Prints ``{"reasons": [...]}`` (empty when everything holds) and exits 0: deciding to skip is the
playbook's job (2 for a bad command line, nodetools.exitcodes). The checks are
:mod:`nodetools.node_checks`'s. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import argparse
import json
import sys

from nodetools import exitcodes
from nodetools.gpu import gpu_list
from nodetools.node_checks import check
from nodetools.vllm_cli import subcommand_reasons

__all__ = ["main"]


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
