"""What a trial's ``trial.json`` holds: its status and its record, typed.

The record is JSON on disk (``results/<campaign>/trials/<id>/trial.json``) and a ``dict`` in
memory; ``TrialRecord`` names its keys so the writer (``campaign``), the keeper (``store``) and
the readers (``report``, the kinds' collectors) agree on them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypedDict

__all__ = ["FINISHED", "KEPT", "TRIAL_SHAPE", "TrialRecord", "TrialStatus"]


class TrialStatus(StrEnum):
    """A ``StrEnum``: it is written to JSON and compared with what is read back as a plain string."""

    PENDING = "pending"  # planned, not started (report rows only; never in a trial.json)
    RUNNING = "running"  # started; a killed run leaves it so, and the next run repeats the trial
    OK = "ok"
    FAILED = "failed"  # a phase failed, timed out or lost its host: the reason says which
    SKIPPED = "skipped"  # by design: the mode cannot run on this engine or node (the reason says why)
    REFUSED = "refused"  # a preflight found the campaign's own settings do not fit the node
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C: always run again


# Statuses a resumed run keeps as they are (failed and refused only with --retry-failed).
KEPT = frozenset({TrialStatus.OK, TrialStatus.SKIPPED})
# Statuses of a trial that ran to its end, whatever the outcome.
FINISHED = frozenset({TrialStatus.OK, TrialStatus.FAILED, TrialStatus.SKIPPED, TrialStatus.REFUSED})


class TrialRecord(TypedDict, total=False):
    """``trial.json``: the trial's definition (from the plan), then what happened."""

    # From the plan (plan.Trial.as_dict)
    id: str
    experiment: str
    kind: str
    mode: str
    repeat: int
    host: str
    params: dict[str, Any]
    engine: dict[str, Any] | None
    timeout_s: float
    resources: dict[str, Any]
    definition_hash: str
    remote_dir: str
    refusals: list[str]
    launch: dict[str, Any] | None  # the engine's command line as planned (node_plan), None when none starts
    node: dict[str, Any]  # every node program's argv, the skip known before the node is asked
    # What happened
    status: TrialStatus
    reason: str  # empty when ok; never empty otherwise
    phases: list[dict[str, Any]]  # execute.PhaseResult.as_dict() per phase run
    metrics: dict[str, Any]  # the kind's collect(); empty unless ok
    collected_with: str  # provenance.collect_stamp() of the code that collected the metrics
    engine_label: str
    host_facts: dict[str, Any] | None
    host_facts_age_s: float  # only where an earlier run read them (runner/facts_cache.py): how long before
    started: float
    ended: float
    duration_s: float


_NUMBER = (int, float)
# The shape a trial.json must have to be used (runner/results_reader.py: "!" marks a required key;
# null stands for absent): a record a reader would trip over is moved aside instead.
TRIAL_SHAPE = {
    "id!": str, "experiment!": str, "kind!": str, "mode!": str, "repeat!": int, "host!": str, "status!": str,
    "params": dict, "engine": {"kind": str, "args": dict}, "timeout_s": _NUMBER, "resources": dict,
    "definition_hash": str, "remote_dir": str, "refusals": [str], "reason": str, "phases": [dict],
    "metrics": dict, "engine_label": str, "host_facts": dict, "host_facts_age_s": _NUMBER, "started": _NUMBER,
    "ended": _NUMBER, "duration_s": _NUMBER,
}
