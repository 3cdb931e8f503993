"""``facts``: what every later experiment needs to know about a node (``node_facts`` module).

The trial stores ``raw/<host>/facts.json``; its metrics are the few figures a report compares
across nodes. The same playbook runs as the runner's per-host preflight, so every trial's
``trial.json`` carries the facts of its host.
"""

from __future__ import annotations

import json
from typing import Any

from runner.experiments.base import ExperimentKind, ModeParams, Phase, TrialContext

__all__ = ["KIND", "PLAYBOOK", "facts_metrics"]

PLAYBOOK = "playbooks/experiments/facts.yml"
GIB = 2**30


class FactsParams(ModeParams):
    pass


def facts_metrics(facts: dict[str, Any]) -> dict[str, Any]:
    """The comparable figures of one host's facts; absent facts stay absent."""
    out: dict[str, Any] = {"gpu_count": len(facts.get("gpus") or [])}
    if facts.get("driver_version"):
        out["driver_version"] = facts["driver_version"]
    memory = facts.get("memory") or {}
    if "total_bytes" in memory:
        out["mem_total_gib"] = round(memory["total_bytes"] / GIB, 2)
    if "page_cache_bytes" in facts:
        out["page_cache_gib"] = round(facts["page_cache_bytes"] / GIB, 2)
    out["numa_nodes"] = len(facts.get("numa") or [])
    return out


def _collect(ctx: TrialContext) -> dict[str, Any]:
    assert ctx.trial_dir is not None
    path = ctx.trial_dir / "raw" / ctx.host / "facts.json"
    if not path.is_file():
        return {}
    return facts_metrics(json.loads(path.read_text()))


KIND = ExperimentKind(
    name="facts",
    doc="docs/campaign.md",
    summary="GPUs, NUMA memory, /dev/shm, page cache, CPU, kernel, disks and mounts of each node",
    phases=(Phase("run", PLAYBOOK, waits_for_turn=True),),
    modes={"default": FactsParams},
    default_modes=("default",),
    collect=_collect,
)
