"""What a run writes about itself: at its start the frozen campaign, ``plan.json`` and its entry in
``run.json`` (tools, git state, inventory digest, hosts, argv); at its end that entry's outcome, and
no trial left ``running`` (a stopped or crashed run marks what it left ``interrupted``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any

from runner.errors import ResultsWriteError
from runner.plan import Plan
from runner.provenance import git_state, inventory_digest, tool_versions
from runner.spec import LoadedCampaign
from runner.store import ResultsStore

__all__ = ["close_run", "open_run"]


def open_run(loaded: LoadedCampaign, plan: Plan, store: ResultsStore, argv: list[str]) -> dict[str, Any]:
    """Freeze the campaign and its plan, and add this run to ``run.json``; returns run.json's content."""
    store.freeze_campaign(loaded.text, loaded.path)
    store.write_json("plan.json", plan.as_dict())
    run_info = store.read_run() or {"runs": []}
    run_info.update(
        campaign=loaded.campaign.name, campaign_file=str(loaded.path), tools=tool_versions(), git=git_state(),
        inventory=inventory_digest(loaded.inventory.sources), hosts=list(loaded.hosts),
    )
    run_info["runs"].append({"started": time.time(), "argv": argv})
    store.write_json("run.json", run_info)
    return run_info


def close_run(store: ResultsStore, trial_ids: Iterable[str], run_info: dict[str, Any], counts: dict[str, int],
              interrupted: bool, stopped: str, crashed: str) -> int:
    """Mark what the run left ``running`` as ``interrupted`` (on a full disk, in the room the reserve
    kept) and record the run's end in run.json; returns how many trials were marked."""
    if stopped:
        store.free_reserve()
    why = crashed or (f"the results folder refused a write: {stopped}" if stopped
                      else "stopped by the user (Ctrl-C)" if interrupted else "stopped")
    marked: list[Any] = []
    with contextlib.suppress(ResultsWriteError):  # the disk may still be full: the reason is printed
        marked = list(store.interrupt_running(trial_ids, why) or [])
    run_info["runs"][-1].update(ended=time.time(), counts=counts, interrupted=interrupted, stopped=stopped)
    with contextlib.suppress(ResultsWriteError):
        store.write_json("run.json", run_info)
    store.free_reserve()
    return len(marked)
