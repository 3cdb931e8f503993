"""Expand a validated campaign into trials: pure and deterministic.

Order is setup-major: experiments as listed, then modes as listed, then repeats, so each engine
configuration is prepared once for its repeats; hosts are the innermost factor, and each host
works through its own trials in this order. Trial ids are readable and stable:
``<experiment>.<mode>.r<repeat>@<host>``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import SpecError
from runner.experiments import KINDS
from runner.experiments.base import Resources, TrialContext
from runner.experiments.node_plan import NodePlan
from runner.paths import PathCheck
from runner.spec import MAX_TRIALS, LoadedCampaign

__all__ = ["Plan", "Trial", "expand", "node_python", "remote_dir", "trial_id"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]+")


def trial_id(experiment: str, mode: str, repeat: int, host: str) -> str:
    raw = f"{experiment}.{mode}.r{repeat}@{host}"
    safe = _UNSAFE.sub("_", raw)
    if safe != raw:  # two hosts differing only in replaced characters must not share a folder
        safe += "-" + hashlib.sha256(host.encode()).hexdigest()[:6]
    return safe


@dataclass(frozen=True)
class Trial:
    id: str
    host: str
    experiment: str
    kind: str
    mode: str
    repeat: int
    params: dict[str, Any]
    engine: dict[str, Any] | None
    timeout_s: float
    resources: Resources = field(default_factory=Resources)
    remote_dir: str = ""  # the trial's own folder on its node
    refusals: tuple[str, ...] = ()  # why the campaign's own settings cannot run it (plan_checks)
    node: NodePlan = field(default_factory=NodePlan)  # what it runs on its node: the engine's launch, each program

    def definition(self) -> dict[str, Any]:
        """Everything that decides what the trial does; a stored result is reused only if equal."""
        return {
            "host": self.host, "experiment": self.experiment, "kind": self.kind, "mode": self.mode,
            "repeat": self.repeat, "params": self.params, "engine": self.engine,
        }

    def definition_hash(self) -> str:
        blob = json.dumps(self.definition(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, **self.definition(), "timeout_s": self.timeout_s,
            "resources": self.resources.as_dict(), "definition_hash": self.definition_hash(),
            "remote_dir": self.remote_dir, "refusals": list(self.refusals), **self._node_dict(),
        }

    def _node_dict(self) -> dict[str, Any]:
        node = self.node.as_dict()
        return {"launch": node.pop("launch"), "node": node}


@dataclass(frozen=True)
class Plan:
    campaign: str
    trials: tuple[Trial, ...]

    def by_host(self) -> dict[str, list[Trial]]:
        out: dict[str, list[Trial]] = {}
        for t in self.trials:
            out.setdefault(t.host, []).append(t)
        return out

    @property
    def refused(self) -> list[Trial]:
        return [t for t in self.trials if t.refusals]

    def as_dict(self) -> dict[str, Any]:
        return {"campaign": self.campaign, "trial_count": len(self.trials),
                "trials": [t.as_dict() for t in self.trials]}


def node_python(loaded: LoadedCampaign) -> str:
    """The node's Python with this repository's nodetools: the campaign's ``node_python``, else the
    controller's own (right for the local inventory: Ansible's ``ansible_playbook_python``, which the
    runner's PATH makes this interpreter; the bench_client role installs one on real nodes)."""
    return loaded.campaign.node_python or sys.executable


def remote_dir(loaded: LoadedCampaign, host: str, leaf: str) -> str:
    # Per host: test hosts (and some clusters) share one filesystem.
    return f"{loaded.campaign.remote_dir.rstrip('/')}/{loaded.campaign.name}/{host}/{leaf}"


def _check_size(loaded: LoadedCampaign) -> None:
    c = loaded.campaign
    count = sum(len(modes) * (exp.repeats or c.defaults.repeats) * len(loaded.hosts)
                for exp, modes in zip(c.experiments, loaded.modes, strict=True))
    if count > MAX_TRIALS:
        raise SpecError([f"{loaded.path}:1: the campaign expands to {count} trials: more than the "
                         f"{MAX_TRIALS} one run may plan (modes x repeats x hosts); split it"])


def expand(loaded: LoadedCampaign, facts: Mapping[str, Mapping[str, Any]] | None = None,
           results: Path | None = None) -> Plan:
    """The trial matrix; ``facts`` (host -> facts of an earlier run) lets plan checks use the
    node's numbers without touching it; with ``results`` (the results folder) every path the run
    will create there is checked too, as those on the node always are."""
    _check_size(loaded)
    c = loaded.campaign
    python = node_python(loaded)
    paths = PathCheck(campaign=c.name, remote_dir=c.remote_dir, results=results)
    trials: list[Trial] = []
    for exp, modes in zip(c.experiments, loaded.modes, strict=True):
        kind = KINDS[exp.kind]
        repeats = exp.repeats or c.defaults.repeats
        timeout = exp.timeout_s or c.defaults.timeout_s
        engine = None
        if c.engine is not None:
            engine = c.engine.model_dump(mode="json")
            engine["args"] = {**engine["args"], **exp.engine_args}
        for mode, params in modes.items():
            for repeat in range(1, repeats + 1):
                for host in loaded.hosts:
                    tid = trial_id(exp.label, mode, repeat, host)
                    ctx = TrialContext(mode=mode, params=params, engine=engine or {}, host=host, trial_id=tid,
                                       remote_dir=remote_dir(loaded, host, tid), campaign=c.name,
                                       facts=(facts or {}).get(host), node_python=python, timeout_s=timeout)
                    trials.append(Trial(
                        id=tid, host=host, experiment=exp.label,
                        kind=exp.kind, mode=mode, repeat=repeat, params=params, engine=engine,
                        timeout_s=timeout, resources=kind.resources(ctx), remote_dir=ctx.remote_dir,
                        refusals=(*kind.plan_checks(ctx),
                                  *paths.refusals(tid, host, [p.name for p in kind.phases])),
                        node=kind.node_plan(ctx),
                    ))
    ids = [t.id for t in trials]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise SpecError([f"{loaded.path}:1: two trials share the id {dup!r}: rename an experiment or host"])
    return Plan(campaign=c.name, trials=tuple(trials))
