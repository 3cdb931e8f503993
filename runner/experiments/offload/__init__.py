"""``offload``: a multi-turn chat load whose working set exceeds the GPU KV pool, per offload mode.

Each mode is an engine configuration rendered from data (``recipe`` in the trial's params, so
plan.json shows the exact flags and environment): no offload, vLLM's native CPU tier, LMCache
(CPU or disk), or the OffloadingConnector's ``TieringOffloadingSpec`` (a RAM tier, then a
file-system tier). Everything else a trial derives (its fs-tier folder, each engine copy's port
and GPUs, the preflight's need, the sizing of the working set against the tiers) is planned in
``setup`` and shown in plan.json as the trial's ``resources.offload``; the playbooks only carry it
to the node tools. Phases: ``prepare`` (the mode's preconditions, the launch file, the preflight
that protects the node), ``measure`` (``nodetools.offload_run run``: engines up, ``/metrics``,
the load, ``/metrics`` again, the quality check, stop) and ``collect`` (always: stop leftovers,
remove the trial's offload files, fetch everything).

Modules: ``params`` (modes and parameters), ``sizing`` (tokens and bytes of the working set and
the tiers), ``setup`` (the plan-time trial setup), ``checks`` (the refusals that need no node:
``--plan``), ``collect`` (figures from the raw files),
``node`` (each engine copy's launch and the node programs' argv), ``report`` (the CSVs and the
report section).
"""

from __future__ import annotations

from runner.experiments.base import ExperimentKind, KindReport, Phase
from runner.experiments.offload.checks import plan_checks
from runner.experiments.offload.collect import collect, diagnose
from runner.experiments.offload.node import node_plan
from runner.experiments.offload.params import MODES, RECIPES
from runner.experiments.offload.report import rows, section
from runner.experiments.offload.setup import resources
from runner.experiments.offload.sizing import working_set

__all__ = ["KIND", "MODES", "RECIPES", "working_set"]

PLAYBOOKS = "playbooks/experiments/offload"

KIND = ExperimentKind(
    name="offload",
    doc="docs/offload.md",
    summary="a multi-turn chat load over a working set larger than the GPU KV pool, per KV offload mode",
    phases=(
        Phase("prepare", f"{PLAYBOOKS}/prepare.yml", waits_for_turn=True),
        Phase("measure", f"{PLAYBOOKS}/measure.yml", follow="server.log"),
        Phase("collect", f"{PLAYBOOKS}/collect.yml", always=True),
    ),
    modes=MODES,
    default_modes=("hbm_only", "native_cpu"),
    resources=resources,
    plan_checks=plan_checks,
    collect=collect,
    diagnose=diagnose,
    node_plan=node_plan,
    needs_engine=True,
    report=KindReport("offload.csv", rows, section),
)
