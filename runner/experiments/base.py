"""What an experiment kind declares: its modes, the playbooks of its phases, resources, metrics.

Each kind lives in its own module of this package and registers one ``ExperimentKind``. The spec
validates mode parameters against ``modes``; the plan asks ``resources``; the executor runs
``phases`` in order; ``collect`` turns the fetched raw files of a finished trial into metrics;
``report`` (optional) adds the kind's own CSV and report section.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from runner.experiments.node_plan import NodePaths, NodePlan
from runner.records import TrialRecord

__all__ = ["MAX_SECONDS", "ExperimentKind", "KindReport", "ModeParams", "NumbersAreNotBooleans", "Phase", "Resources",
           "TrialContext"]


# The longest any one thing a campaign names may take (a phase's timeout_s, a mode's seconds): a week.
MAX_SECONDS = 7 * 24 * 3600


def _leaf_types(annotation: Any) -> set[Any]:
    """The types a field's annotation admits, through Optional, unions, Annotated and list."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _leaf_types(get_args(annotation)[0])
    if origin in (Union, types.UnionType, list):
        return set().union(*(_leaf_types(a) for a in get_args(annotation)))
    return {annotation}


def _is_number(annotation: Any) -> bool:
    leaves = _leaf_types(annotation)
    return bool(leaves & {int, float}) and leaves <= {int, float, type(None)}


class NumbersAreNotBooleans(BaseModel):
    """A field of numbers refuses true/false: pydantic reads ``true`` as 1, so ``repeats: yes`` or
    ``seconds: on`` (YAML 1.1 booleans) planned one repeat, one second, and said nothing."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, bool) for v in items) and info.field_name is not None:
            field_info = cls.model_fields.get(info.field_name)
            if field_info is not None and _is_number(field_info.annotation):
                raise ValueError("must be a number, not true or false")
        return value


class ModeParams(NumbersAreNotBooleans):
    """Base of every mode's parameter model: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


@dataclass(frozen=True)
class Resources:
    """What a trial needs from its host; the scheduler and the report read it."""

    gpus: tuple[int, ...] = ()
    exclusive: bool = False  # drops the page cache or changes sysctls: nothing else may run
    host_ram_gib: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "exclusive": self.exclusive, "host_ram_gib": self.host_ram_gib}


@dataclass(frozen=True)
class Phase:
    """One playbook run of a trial. ``follow`` names a node-side file to tail while it runs."""

    name: str
    playbook: str  # relative to the repository root
    follow: str | None = None  # path relative to exp_remote_dir, e.g. "server.log"
    always: bool = False  # runs even when an earlier phase failed (cleanup, log fetch)
    # A task-name prefix from which the node's measurement is over (the collect): the runner may
    # start the next trial's run then, its first task waiting for its turn (runner/overlap.py;
    # the playbook must begin with that wait).
    overlap_from: str = ""
    # A file (relative to exp_remote_dir) the phase's node program writes when the measurement is
    # over, holding the runner's lease of the run: on a local connection the runner sees it and
    # starts the next trial's run then, before ``overlap_from`` (runner/overlap.py).
    overlap_marker: str = ""
    # The playbook begins by waiting for exp_turn_file when it is set (lookup 'turn'): the runner
    # may start this phase early, as the first phase of the next trial on the host.
    waits_for_turn: bool = False
    # A task-name prefix from which this trial leaves the node alone (what is left copies its files
    # to the controller): the next trial's run, started early, is let go then, while this one's
    # files are copied and its record written.
    turn_from: str = ""


@dataclass(frozen=True)
class TrialContext:
    """What ``resources`` and ``collect`` may look at."""

    mode: str
    params: Mapping[str, Any]
    engine: Mapping[str, Any]
    trial_dir: Path | None = None
    host: str = ""
    trial_id: str = ""
    remote_dir: str = ""  # the trial's folder on the node
    campaign: str = ""
    facts: Mapping[str, Any] | None = None  # the host's facts from an earlier run, when cached
    node_python: str = ""  # the node's Python with nodetools (the campaign's node_python, else the controller's)
    timeout_s: float = 0.0  # each phase's limit

    def node_paths(self) -> NodePaths:
        return NodePaths(self.remote_dir, self.node_python, self.trial_id)


@dataclass(frozen=True)
class KindReport:
    """A kind's own table and report section.

    ``rows`` turns one trial record (whatever its status) into rows of ``csv_name``; the report
    adds ``trial_id``, ``host``, ``mode``, ``repeat``, ``status`` and ``reason`` in front, so a
    failed or skipped trial is a row too; a column whose name starts with ``_`` holds a structure
    for the section only and stays out of the CSV. ``section`` renders the kind's Markdown from the
    whole table and may write figures next to ``report.md`` (it gets the results folder).
    """

    csv_name: str
    rows: Callable[[TrialRecord], list[dict[str, Any]]]
    section: Callable[[Any, Path], str] | None = None  # (pandas.DataFrame, results root) -> Markdown


@dataclass(frozen=True)
class ExperimentKind:
    name: str
    summary: str
    doc: str  # the kind's page under docs/ (what it measures, its modes, its local rehearsal)
    phases: tuple[Phase, ...]
    modes: Mapping[str, type[ModeParams]]
    default_modes: tuple[str, ...] = ()
    resources: Callable[[TrialContext], Resources] = field(default=lambda _ctx: Resources())
    collect: Callable[[TrialContext], dict[str, Any]] = field(default=lambda _ctx: {})
    diagnose: Callable[[TrialContext], str] = field(default=lambda _ctx: "")  # more "why" for a failure
    # Checks that need no node (the campaign's own settings, cached facts): each string refuses the
    # trial before any host is touched, in --plan too.
    plan_checks: Callable[[TrialContext], list[str]] = field(default=lambda _ctx: [])
    # What the trial runs on its node (runner/experiments/node_plan.py): the engine's launch and each
    # node program's argv, shown by --plan and passed to the playbooks as exp_node.
    node_plan: Callable[[TrialContext], NodePlan] = field(default=lambda _ctx: NodePlan())
    needs_engine: bool = False
    report: KindReport | None = None
