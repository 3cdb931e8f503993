"""``selftest``: trials that exercise the runner itself, on any host, with no engine.

``noop`` is the runner's overhead baseline (a playbook that does nothing); ``sleep`` writes a line
per interval to a node-side log (to see live following, timeouts and Ctrl-C); ``fail`` fails a
task on purpose and ``skip`` skips by design (to see both recorded with their reasons).
"""

from __future__ import annotations

from pydantic import Field

from runner.experiments.base import MAX_SECONDS, ExperimentKind, ModeParams, Phase

__all__ = ["KIND"]


class NoopParams(ModeParams):
    pass


class SleepParams(ModeParams):
    seconds: float = Field(default=2.0, gt=0, le=MAX_SECONDS, description="How long the node-side task runs.")
    interval_s: float = Field(default=0.5, gt=0, le=MAX_SECONDS, description="Seconds between log lines.")


class FailParams(ModeParams):
    message: str = Field(default="failed on purpose", min_length=1)


class SkipParams(ModeParams):
    reason: str = Field(default="skipped on purpose", min_length=1)


KIND = ExperimentKind(
    name="selftest",
    doc="docs/campaign.md",
    summary="runner overhead baseline and failure drills",
    phases=(Phase("run", "playbooks/experiments/selftest.yml", follow="server.log", waits_for_turn=True),),
    modes={"noop": NoopParams, "sleep": SleepParams, "fail": FailParams, "skip": SkipParams},
    default_modes=("noop",),
)
