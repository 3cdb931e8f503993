"""A host's checks around its trials: its facts read once per run (the preflight), and, after an
unreachable host or a timed-out phase, whether it still answers within seconds (the probe).

The facts are read by the host's first trial of the run, in its first ansible-playbook: the runner
runs ``host_facts.yml`` and that trial's first playbook as one (``execute.start_phase``'s
``before``), so a one-trial campaign starts one ansible-playbook, not two (each start costs 1-2 s
of CPU), and the facts are still read first, on a node at rest. Its run writes them into the
trial's folder; the runner moves them to ``hosts/<host>/facts.json`` once the run ends, so that
file, once there, was read by this run (an earlier run's file stays until then). A host whose facts
could not be read fails that trial with the reason and its other trials without running them.
Facts read by a run soon before, on the same host, serve instead while fresh (runner/facts_cache.py):
then no trial reads them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import ResultsWriteError
from runner.execute import PhaseResult, run_phase
from runner.facts_cache import FactsCache
from runner.provenance import REPO_ROOT
from runner.spec import LoadedCampaign
from runner.store import FACTS_SHAPE, ResultsStore
from runner.supervise import lease_id

__all__ = ["HOST_FACTS_PLAYBOOK", "PROBE_TIMEOUT_S", "HostFacts", "host_answers"]

HOST_FACTS_PLAYBOOK = REPO_ROOT / "playbooks/experiments/host_facts.yml"
PROBE_PLAYBOOK = "playbooks/experiments/probe.yml"
PROBE_TIMEOUT_S = 30
PREFLIGHT_FAILED = "host preflight failed"


@dataclass
class HostFacts:
    """A host's facts in this run: ``pending`` until its first trial's first phase has run, then
    ``facts`` (``hosts/<host>/facts.json``) or ``error``, the reason every trial of it fails; or,
    from the start, fresh facts of an earlier run (``cached_age_s``: how old)."""

    store: ResultsStore
    host: str
    cache: FactsCache | None = None
    sources: Sequence[str] = field(default_factory=tuple)  # the inventory's: part of the cache's key
    pending: bool = True
    facts: dict[str, Any] | None = None
    error: str = ""
    cached_age_s: float | None = None
    _started: float = field(default_factory=time.time)

    def use_cache(self) -> bool:
        """Take fresh cached facts, written to ``hosts/<host>/facts.json`` as a read would; False if none."""
        cached = self.cache.get(self.sources, self.host) if self.cache is not None else None
        if cached is None:
            return False
        self.store.make_dir(self.store.root / "hosts" / self.host)
        self.store.read_facts(self.host)  # an earlier file that cannot be replaced (a folder) is moved aside
        self.store.write_json(Path("hosts") / self.host / "facts.json", cached[0])
        self.facts, self.cached_age_s, self.pending = cached[0], round(cached[1], 1), False
        return True

    def dest(self, trial_dir: Path) -> Path:
        """Where the first trial's run writes the facts (``exp_host_facts_dest``): the trial's
        folder is new, so a file there was written by this run."""
        return trial_dir / "ansible" / "host_facts.json"

    def settle(self, trial_dir: Path, result: PhaseResult) -> None:
        """After the first trial's first phase: keep the facts its run read, or say why there are none."""
        self.pending = False
        fresh = self.dest(trial_dir)
        written = os.path.lexists(fresh)
        self.facts = self.store.read_json(fresh.relative_to(self.store.root), FACTS_SHAPE)  # bounded, typed
        if self.facts is None:
            if written:
                why = f"its facts ({fresh.name}) could not be used: {'; '.join(self.store.problems[-1:])}"
            elif result.failures:
                why = result.failures[0].one_line()
            else:
                why = f"no facts were written (the run was {result.status})"
            self.error = f"{PREFLIGHT_FAILED}: {why}"
            return
        host_dir = self.store.make_dir(self.store.root / "hosts" / self.host)
        self.store.read_facts(self.host)  # an earlier file that cannot be replaced (a folder) is moved aside
        try:
            fresh.replace(host_dir / "facts.json")
        except OSError as exc:
            raise ResultsWriteError(host_dir / "facts.json", exc) from exc
        if self.cache is not None:
            self.cache.put(self.sources, self.host, self.facts, self._started)


def host_answers(root: Path, loaded: LoadedCampaign, host: str, cancel: threading.Event) -> bool:
    """After an unreachable host or a phase timeout: does the host still answer, within seconds?
    A frozen sshd or a dead node must not make every remaining trial wait its whole timeout."""
    result = run_phase(
        phase="probe", playbook=REPO_ROOT / PROBE_PLAYBOOK, project_dir=REPO_ROOT,
        private_data_dir=root / "hosts" / host / "probe", inventory=loaded.inventory,
        limit=host, extravars={}, timeout_s=PROBE_TIMEOUT_S, cancel=cancel,
        lease=lease_id(root, f"probe@{host}"),
    )
    return result.ok
