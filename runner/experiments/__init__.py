"""The registry of experiment kinds a campaign may name."""

from __future__ import annotations

from runner.experiments import facts, offload, selftest, snapshot, startup, storage
from runner.experiments.base import ExperimentKind

__all__ = ["KINDS", "get_kind"]

KINDS: dict[str, ExperimentKind] = {
    k.name: k for k in (facts.KIND, selftest.KIND, startup.KIND, offload.KIND, snapshot.KIND, storage.KIND)
}


def get_kind(name: str) -> ExperimentKind:
    return KINDS[name]
