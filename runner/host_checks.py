"""A host's checks around its trials: its facts gathered once per run (the preflight), and, after
an unreachable host or a timed-out phase, whether it still answers within seconds (the probe)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from runner.execute import run_phase
from runner.experiments.facts import PLAYBOOK as FACTS_PLAYBOOK
from runner.plan import remote_dir
from runner.provenance import REPO_ROOT
from runner.spec import LoadedCampaign
from runner.store import ResultsStore
from runner.supervise import lease_id

__all__ = ["PREFLIGHT_TIMEOUT_S", "PROBE_TIMEOUT_S", "gather_facts", "host_answers"]

PROBE_PLAYBOOK = "playbooks/experiments/probe.yml"
PREFLIGHT_TIMEOUT_S = 300
PROBE_TIMEOUT_S = 30


def gather_facts(store: ResultsStore, loaded: LoadedCampaign, host: str,
                 cancel: threading.Event) -> tuple[dict[str, Any] | None, str]:
    """The host's facts (``hosts/<host>/facts.json``), or the reason its preflight failed: an
    unreachable host fails all its trials at once."""
    host_dir = store.make_dir(store.root / "hosts" / host)
    store.read_facts(host)  # an earlier file that cannot be used (a FIFO, a link) is moved aside first
    dest = host_dir / "facts.json"
    result = run_phase(
        phase="preflight", playbook=REPO_ROOT / FACTS_PLAYBOOK, project_dir=REPO_ROOT,
        private_data_dir=host_dir / "ansible", inventory=loaded.inventory, limit=host,
        extravars={"exp_facts_dest": str(dest), "exp_results_dir": str(host_dir),
                   "exp_remote_dir": remote_dir(loaded, host, "preflight"), "exp_turn_file": "",
                   "exp_turn_timeout_s": 0},
        timeout_s=PREFLIGHT_TIMEOUT_S, cancel=cancel, lease=lease_id(store.root, f"preflight@{host}"),
    )
    if not result.ok:
        reason = result.failures[0].one_line() if result.failures else result.status
        return None, f"host preflight failed: {reason}"
    return store.read_facts(host), ""


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
