"""What an offload trial runs on its node: each engine copy's launch and every node program's argv.

Built from the trial's planned setup (:mod:`.setup`: the copies' ports and GPUs, the mode's flags
and environment, the preflight's need), so ``--plan`` shows the exact ``vllm serve`` line of each
copy and the playbooks only run what is here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from runner.experiments.base import TrialContext
from runner.experiments.launch import engine_launch
from runner.experiments.node_plan import NodePaths, NodePlan, launch_spec, make_model_argv, reap_argv, to_json
from runner.experiments.offload.setup import trial_setup

__all__ = ["ARCHIVE", "node_plan", "pack_argv"]

ARCHIVE = "collect.tar"  # in the trial's folder: every file the collect brings home, in one transfer
_BRE_SPECIAL = re.compile(r"([.\[\]*^$\\])")


def _launches(ctx: TrialContext, setup: Mapping[str, Any], paths: NodePaths) -> list[dict[str, Any]]:
    engine = ctx.engine
    out = []
    for copy in setup["copies"]:
        copy_engine = {**engine, "port": copy["port"], "image": setup["image"], "gpus": copy["gpus"],
                       "env": setup["env"]}
        launch = engine_launch(copy_engine, paths.container + copy["container_suffix"], engine["cache_root"],
                               engine["model_cache"], setup["args"], paths.python)
        out.append(launch_spec(launch, copy_engine))
    return out


def _literal(name: str) -> str:
    """``name`` as a sed basic regular expression that matches it alone."""
    return _BRE_SPECIAL.sub(r"\\\1", name)


def pack_argv(paths: NodePaths, fetch: Sequence[Sequence[str]]) -> list[str]:
    """One tar of the trial's files (``fetch``: [path in the trial's folder, name in raw/<host>/]),
    each under the name the controller keeps, so one transfer brings them all (a fetch task per
    file cost 5.3 s a trial). A file the trial did not write is left out (a warning, exit 0); a
    symbolic link is archived as what it points to, as a fetch would read it."""
    renames = [f"--transform=s|^{_literal(src)}$|{dest}|" for src, dest in fetch if src != dest]
    return ["tar", "-C", paths.work_dir, "-chf", paths.file(ARCHIVE), "--ignore-failed-read", *renames, "--",
            *(src for src, _ in fetch)]


def node_plan(ctx: TrialContext) -> NodePlan:
    params, engine, paths = ctx.params, ctx.engine, ctx.node_paths()
    setup = trial_setup(ctx)
    tool = [paths.python, "-m", "nodetools.offload_run"]
    cleanup = [*tool, "cleanup", "--dir", paths.work_dir, "--port", str(engine["port"]), "--trial", ctx.trial_id,
               "--lease-dir", paths.lease_dir]
    pack = pack_argv(paths, setup["fetch"])
    if setup["skip"]:
        return NodePlan(skip=setup["skip"], commands={"reap": reap_argv(paths), "cleanup": cleanup, "pack": pack})
    launches = _launches(ctx, setup, paths)
    launch_file = {"copies": launches, "caches": launches[0]["caches"], "fs_dir": setup["fs_dir"],
                   "engine_kind": engine["kind"], "refuse_torch_ops": bool(params["recipe"].get("refuse_torch_ops"))}
    workload = params["workload"]
    return NodePlan(launch=launches[0], copies=tuple(launches) if len(launches) > 1 else (), commands={
        "reap": reap_argv(paths),
        "make_model": make_model_argv(paths, engine, setup["model_maker_args"]),
        "prepare": [paths.python, "-m", "nodetools.coldstart", "prepare", "--dir", paths.work_dir,
                    "--page-cache", "keep", "--launch-json", to_json(launch_file)],
        "clear_leftovers": [*tool, "clear-leftovers"],
        "preflight": [*tool, "preflight", "--facts", "-", "--need", to_json(setup["need"]),
                      "--out", paths.file("preflight.json"), "--facts-out", paths.file("facts_before.json")],
        "run": [*tool, "run", "--launch", paths.file("launch.json"), "--dir", paths.work_dir,
                "--load", to_json(workload), "--quality", to_json(params["quality"]),
                "--max-failed", str(workload["max_failed_requests"]), "--timeout-s", str(params["ready_timeout_s"]),
                "--phase-timeout-s", str(ctx.timeout_s), "--trial", ctx.trial_id, "--lease-dir", paths.lease_dir],
        "cleanup": cleanup,
        "pack": pack,
    })
