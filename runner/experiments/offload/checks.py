"""The offload trial's refusals that need no node: ``--plan`` shows them and exits 3, and a real run
refuses the same before any host is touched.

The context each request needs against ``max-model-len``, the working set against the GPU pool and
the tiers where the campaign fixes them (``sizing``), and, from the facts an earlier run of the same
results folder gathered, the offload tier's host RAM and native buffers against what the node has
in all. The arithmetic is the node preflight's (``nodetools.offload.preflight``), over the need the
plan hands it, so the plan and the node cannot disagree.
"""

from __future__ import annotations

from nodetools.offload.preflight import Need, capacity_reasons
from runner.experiments.base import TrialContext
from runner.experiments.offload.setup import trial_setup
from runner.experiments.offload.sizing import unreached_tier

__all__ = ["plan_checks"]


def plan_checks(ctx: TrialContext) -> list[str]:
    setup = trial_setup(ctx)
    try:
        need = Need.from_json(setup["need"])
    except ValueError:
        return [f"engine.args.max-model-len: {setup['need']['max_model_len']!r} is no length vLLM reads "
                "(an integer, or 32k / 32K)"]
    reasons = capacity_reasons(dict(ctx.facts) if ctx.facts else None, need)
    last_port = max(need.ports, default=0)
    if last_port > _MAX_PORT:  # each copy listens on engine.port + its index
        reasons.append(f"engine_copies: {len(need.ports)} copies listen on ports {need.ports[0]}-{last_port}, past "
                       f"{_MAX_PORT}: lower engine.port")
    tier = unreached_tier(setup["sizing"], bool((ctx.params.get("recipe") or {}).get("fs")))
    return [*reasons, tier] if tier else reasons


_MAX_PORT = 65535
