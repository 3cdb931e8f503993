"""Run a planned campaign: per-host preflight, trials through their phases, records, resume.

Hosts run concurrently (at most ``parallel`` at a time); each host works through its own trials
one at a time, so trials on one node never overlap and an exclusive trial (page-cache drops,
sysctls) always holds its node alone. Ctrl-C sets ``stop``: running phases are cancelled, their
trials are recorded as ``interrupted`` and the next run picks them up.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.errors import ResultsWriteError
from runner.execute import PhaseResult, RunningPhase, scrub_command_artifacts, start_phase
from runner.experiments import KINDS
from runner.experiments.base import ExperimentKind, Phase, TrialContext
from runner.facts_cache import FactsCache
from runner.host_checks import HOST_FACTS_PLAYBOOK, PROBE_TIMEOUT_S, HostFacts, host_answers
from runner.livelog import LogFollower, start_following
from runner.overlap import EarlyRun, Overlap, Turn
from runner.plan import Plan, Trial, node_python
from runner.progress import Progress
from runner.provenance import REPO_ROOT, collect_stamp
from runner.records import TrialRecord, TrialStatus
from runner.results_reader import ResultsReader
from runner.run_record import close_run, open_run
from runner.secrets import Secrets
from runner.spec import LoadedCampaign
from runner.store import ResultsStore
from runner.supervise import lease_id, reap, results_id

if TYPE_CHECKING:
    from runner.inventory import Inventory

__all__ = ["CampaignOutcome", "run_campaign"]

logger = logging.getLogger(__name__)

REFUSED_PREFIX = "preflight refused"
_DISK_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


@dataclass
class CampaignOutcome:
    counts: dict[str, int] = field(default_factory=dict)  # status -> trials, this run and kept
    interrupted: bool = False
    stopped: str = ""  # why the run stopped early (the results folder refused a write)

    @property
    def failed(self) -> int:
        return self.counts.get(TrialStatus.FAILED, 0)


@dataclass
class _Ctx:
    loaded: LoadedCampaign
    store: ResultsStore
    progress: Progress
    stop: threading.Event
    follow: bool
    inventory: Inventory | None
    secrets: Secrets = field(default_factory=Secrets)
    facts_cache: FactsCache | None = None
    dead_hosts: dict[str, str] = field(default_factory=dict)  # host -> why it is no longer tried
    stopped: list[str] = field(default_factory=list)


def _extravars(ctx: _Ctx, trial: Trial, trial_dir: Path) -> dict[str, Any]:
    return {
        "exp_campaign": ctx.loaded.campaign.name,
        "exp_trial_id": trial.id,
        "exp_experiment": trial.experiment,
        "exp_kind": trial.kind,
        "exp_mode": trial.mode,
        "exp_params": trial.params,
        "exp_repeat": trial.repeat,
        "exp_engine": trial.engine or {},
        "exp_resources": trial.resources.as_dict(),
        "exp_results_dir": str(trial_dir),
        "exp_facts_dest": str(trial_dir / "raw" / trial.host / "facts.json"),  # the facts kind's, by contract
        "exp_remote_dir": trial.remote_dir,
        "exp_repo_dir": str(REPO_ROOT),
        "exp_node_python": node_python(ctx.loaded),
        "exp_node": trial.node.as_dict(),  # the engine's launch and each node program's argv (node_plan)
        "exp_timeout_s": trial.timeout_s,
        "exp_secret_names": sorted(ctx.secrets.values),  # names only: values travel in the environment
        # Set to the turn's file when the run is started early (runner/overlap.py): its first task waits.
        "exp_turn_file": "", "exp_turn_timeout_s": 0,
    }


def _start_follower(ctx: _Ctx, trial: Trial, phase: Phase, extravars: dict[str, Any]) -> LogFollower | None:
    """Tail the node's log (``phase.follow``) for the display while the phase runs."""
    if not (ctx.follow and phase.follow and ctx.inventory is not None):
        return None
    remote = f"{extravars['exp_remote_dir']}/{phase.follow}"
    return start_following(ctx.inventory, trial.host, remote, lambda line: ctx.progress.log_line(trial.id, line))


def _start(ctx: _Ctx, trial: Trial, phase: Phase, trial_dir: Path, extravars: dict[str, Any],
           on_task: Callable[[str], None], timeout_s: float, cancel: Callable[[], bool],
           before: Path | None = None) -> RunningPhase:
    return start_phase(
        phase=phase.name, playbook=REPO_ROOT / phase.playbook, project_dir=REPO_ROOT,
        private_data_dir=trial_dir / "ansible", inventory=ctx.loaded.inventory, limit=trial.host,
        extravars=extravars, timeout_s=timeout_s, cancel=cancel, lease=lease_id(ctx.store.root, trial.id),
        on_task=on_task, before=before,
    )


def _overlap(ctx: _Ctx, next_trial: Trial | None, timeout_s: float) -> Overlap:
    """This trial's overlap with the host's next trial: only one whose first playbook waits for its
    turn starts early, and it may wait this trial's limit and the probe of a lost host after it."""
    if next_trial is None or not KINDS[next_trial.kind].phases[0].waits_for_turn:
        return Overlap(None, "", ctx.stop.is_set)
    wait_s = timeout_s + PROBE_TIMEOUT_S + 60
    return Overlap(lambda: _start_early(ctx, next_trial, wait_s), next_trial.id, ctx.stop.is_set)


def _start_early(ctx: _Ctx, trial: Trial, wait_s: float) -> EarlyRun:
    """Start ``trial``'s first phase now; its first task waits for the turn (runner/overlap.py)."""
    phase = KINDS[trial.kind].phases[0]
    trial_dir = ctx.store.begin_trial(trial.id)
    ctx.store.make_dir(trial_dir / "raw" / trial.host)  # the playbooks' fetch target, by contract
    early = EarlyRun(trial.id, trial_dir, Turn(trial_dir / "ansible" / "turn"))
    try:
        extravars = {**_extravars(ctx, trial, trial_dir), "exp_turn_file": str(early.turn.path),
                     "exp_turn_timeout_s": wait_s}
        # Its limit is its own plus the longest it may wait for its turn.
        early.running = _start(ctx, trial, phase, trial_dir, extravars, early.task, trial.timeout_s + wait_s,
                               lambda: ctx.stop.is_set() or early.aborted.is_set())
    except BaseException:
        early.cancel()
        raise
    return early


def _run_phase_followed(ctx: _Ctx, trial: Trial, phase: Phase, trial_dir: Path, extravars: dict[str, Any],
                        overlap: Overlap, early: EarlyRun | None = None, before: Path | None = None) -> PhaseResult:
    """One phase through ansible-runner (or the one started early: its turn now), after ``before``
    in the same run (the host's facts), tailing the node's log for the display meanwhile."""

    def on_task(task: str) -> None:
        ctx.progress.task(trial.id, task)
        overlap.on_task(phase, task)

    follower = _start_follower(ctx, trial, phase, extravars)
    marker = overlap.watch(phase, Path(extravars["exp_remote_dir"]), lease_id(ctx.store.root, trial.id))
    try:
        if early is not None:
            early.go(on_task)
            return early.wait()
        return _start(ctx, trial, phase, trial_dir, extravars, on_task, trial.timeout_s, ctx.stop.is_set,
                      before).wait()
    finally:
        for watcher in (follower, marker):
            if watcher is not None:
                watcher.stop()


def _skip_reason(trial_dir: Path) -> str | None:
    """A playbook skips by design by writing ``skip.txt`` (its reason) to the trial folder."""
    text = ResultsReader(trial_dir, quarantine=False).text("skip.txt")  # a FIFO there must not hang the run
    if text is None:
        return None
    return text.strip() or "skipped by the playbook"


def _run_trial(ctx: _Ctx, trial: Trial, host: HostFacts, early: EarlyRun | None = None,
               next_trial: Trial | None = None) -> tuple[TrialStatus, EarlyRun | None]:
    """Run ``trial`` (its first phase already started when ``early``; its first phase reads the
    host's facts first while they are ``pending``); returns its status and the next trial's run if
    one of this trial's phases started it early."""
    kind = KINDS[trial.kind]
    trial_dir = early.trial_dir if early is not None else ctx.store.begin_trial(trial.id)
    record: TrialRecord = {
        **trial.as_dict(), "status": TrialStatus.RUNNING, "reason": "", "phases": [], "metrics": {},
        "engine_label": (trial.engine or {}).get("kind", "none"), "host_facts": host.facts,
        "started": time.time(),
    }
    if host.cached_age_s is not None:  # read by an earlier run, this long before this one began
        record["host_facts_age_s"] = host.cached_age_s
    ctx.store.save_trial(trial.id, record)
    ctx.progress.trial_started(trial.id, trial.host)
    extravars = _extravars(ctx, trial, trial_dir)
    if early is None:
        ctx.store.make_dir(trial_dir / "raw" / trial.host)  # the playbooks' fetch target, by contract
    overlap = _overlap(ctx, next_trial if not host.error else None, trial.timeout_s)
    try:
        return _run_phases(ctx, trial, kind, trial_dir, record, extravars, host, early, overlap), overlap.early
    except BaseException:  # the next trial's early run must not outlive this one's failure
        overlap.cancel()
        raise


def _run_phases(ctx: _Ctx, trial: Trial, kind: ExperimentKind, trial_dir: Path, record: TrialRecord,
                extravars: dict[str, Any], host: HostFacts, early: EarlyRun | None,
                overlap: Overlap) -> TrialStatus:
    """The trial's phases, its status and reason, its record saved."""
    failures = []
    canceled = lost = False
    if host.error:
        failures.append(host.error)
    for index, phase in enumerate(kind.phases if not host.error else ()):
        # The first phase always runs (the folder is new: a skip.txt there is its own, written by a
        # run let go early, which may have ended before this trial's turn came).
        if index > 0 and (failures or canceled or _skip_reason(trial_dir) is not None) and not phase.always:
            continue
        ctx.progress.phase(trial.id, phase.name)
        first_early = early if index == 0 else None
        reads_facts = index == 0 and early is None and host.pending
        result = _run_phase_followed(
            ctx, trial, phase, trial_dir,
            {**extravars, "exp_host_facts_dest": str(host.dest(trial_dir))} if reads_facts else extravars,
            overlap, first_early, HOST_FACTS_PLAYBOOK if reads_facts else None)
        phase_record = result.as_dict()
        if first_early is not None:
            phase_record["waited_for_turn_s"] = first_early.waited_s()
        record["phases"].append(phase_record)
        canceled = canceled or result.status == "canceled"
        if not result.ok and not canceled:
            failures.append(result.failures[0].one_line() if result.failures else result.status)
            lost = lost or any(f.kind in ("unreachable", "timeout") for f in result.failures)
        if reads_facts:
            host.settle(trial_dir, result)
            record["host_facts"] = host.facts
            if host.error:  # the host is given up for this run: its other trials fail with the reason
                failures.insert(0, host.error)
                lost = False
    if early is not None and early.go_at is None:  # its first phase never came: nothing of it ran
        early.cancel()
    skip = _skip_reason(trial_dir)
    trial_ctx = TrialContext(trial.mode, trial.params, trial.engine or {}, trial_dir, trial.host)
    status: TrialStatus
    if canceled:
        status, reason = TrialStatus.INTERRUPTED, "stopped by the user (Ctrl-C); the next run repeats it"
    elif failures:
        status, reason = TrialStatus.FAILED, failures[0]
        try:
            more = kind.diagnose(trial_ctx)
        except Exception:  # a diagnosis must never hide the failure itself
            logger.exception("diagnose failed for %s", trial.id)
            more = ""
        if more:
            reason = f"{reason}; {more}"
    elif skip is not None:
        # A node preflight refusing the campaign's own settings is no skip by design: it is counted
        # apart, and the run's exit code says so.
        status = TrialStatus.REFUSED if skip.startswith(REFUSED_PREFIX) else TrialStatus.SKIPPED
        reason = skip
    else:
        status, reason = TrialStatus.OK, ""
        try:
            record["metrics"] = kind.collect(trial_ctx)
            record["collected_with"] = collect_stamp()
        except Exception as exc:
            logger.exception("collect failed for %s", trial.id)
            status, reason = TrialStatus.FAILED, f"collect: {exc}"
    record.update(status=status, reason=reason, ended=time.time())
    record["duration_s"] = round(record["ended"] - record["started"], 3)
    ctx.store.save_trial(trial.id, record)
    ctx.secrets.scrub_tree(trial_dir)
    ctx.progress.trial_finished(trial.id, status, reason, record["duration_s"])
    if lost and not canceled and not host_answers(ctx.store.root, ctx.loaded, trial.host, ctx.stop):
        ctx.dead_hosts[trial.host] = f"host {trial.host} stopped answering during {trial.id} ({reason})"
    return status


def _record_not_tried(ctx: _Ctx, trial: Trial, facts: dict[str, Any] | None, reason: str) -> TrialStatus:
    now = time.time()
    ctx.store.begin_trial(trial.id)
    ctx.store.save_trial(trial.id, {
        **trial.as_dict(), "status": TrialStatus.FAILED, "reason": f"not tried: {reason}", "phases": [], "metrics": {},
        "engine_label": (trial.engine or {}).get("kind", "none"), "host_facts": facts,
        "started": now, "ended": now, "duration_s": 0.0,
    })
    ctx.progress.trial_finished(trial.id, TrialStatus.FAILED, f"not tried: {reason}", 0.0)
    return TrialStatus.FAILED


def _host_worker(ctx: _Ctx, host: str, trials: list[Trial]) -> dict[str, int]:
    counts: dict[str, int] = {}
    if ctx.stop.is_set():
        return counts
    # Read by the first trial's first run (runner/host_checks.py), unless an earlier run's are fresh.
    facts = HostFacts(ctx.store, host, ctx.facts_cache, ctx.loaded.inventory.sources)
    early: EarlyRun | None = None
    try:
        if facts.use_cache():  # in here: a disk that refuses its facts.json stops the run as any write does
            ctx.progress.note(f"{host}: facts read {facts.cached_age_s:.0f} s ago by an earlier run (--fresh-facts "
                              "reads them again)")
        for index, trial in enumerate(trials):
            if facts.error and early is not None:  # the host's facts were not read: nothing more of it runs
                early.cancel()
                early = None
            # Let go while the trial before it copied its files: it runs already, and is recorded.
            running = early is not None and early.go_at is not None
            if ctx.stop.is_set() and not running:
                break
            if host in ctx.dead_hosts and not running:
                if early is not None:
                    early.cancel()
                    early = None
                status = _record_not_tried(ctx, trial, facts.facts, ctx.dead_hosts[host])
            else:
                following = trials[index + 1] if index + 1 < len(trials) else None
                mine, early = early, None  # the trial owns its early run from here on
                try:
                    status, early = _run_trial(ctx, trial, facts, mine, following)
                except BaseException:
                    if mine is not None:  # not given its turn: nothing ran; let go already: it is stopped
                        mine.cancel()
                    raise
            counts[status] = counts.get(status, 0) + 1
    except ResultsWriteError as exc:  # a full disk stops the run; every file already written is whole
        ctx.stopped.append(str(exc))
        ctx.stop.set()
    except OSError as exc:  # the same, met by a write outside the store (an artifact scrubbed in place)
        if exc.errno not in _DISK_REFUSALS:
            raise
        ctx.stopped.append(str(ResultsWriteError(exc.filename or ctx.store.root, exc)))
        ctx.stop.set()
    finally:
        if early is not None:  # started early, never given its turn: nothing of it ran on the node
            early.cancel()
    return counts


def _warm_report_imports(plan: Plan) -> None:
    """Import pandas (0.5-1 s) in a thread while the hosts' playbooks run, most of it waiting on
    their processes, where the report built after the run needs it: for a kind's own section only
    (runner/report_table.py writes the rest); the runner's start never does."""
    if any(KINDS[t.kind].report is not None for t in plan.trials):
        threading.Thread(target=importlib.import_module, args=("pandas",), name="warm-imports").start()


def run_campaign(loaded: LoadedCampaign, plan: Plan, store: ResultsStore, progress: Progress, *,
                 retry_failed: bool = False, parallel: int = 8, follow: bool = True,
                 argv: list[str] | None = None, secrets: Secrets | None = None,
                 facts_cache: FactsCache | None = None) -> CampaignOutcome:
    """Run what the plan still needs. The caller holds the results folder's lock. ``facts_cache``:
    where fresh facts of an earlier run serve instead of reading them (None: always read)."""
    orphans = reap(results_id(store.root) + ":")
    if orphans:
        progress.note(f"stopped {len(orphans)} process(es) an earlier, killed run of this folder left behind")
    secrets = secrets or Secrets()
    scrub_command_artifacts(store.root)  # what a killed run left: before previous/ keeps it for good
    try:
        store.hold_reserve()
        run_info = open_run(loaded, plan, store, argv or [])
    except ResultsWriteError as exc:
        return CampaignOutcome(stopped=str(exc))
    todo: dict[str, list[Trial]] = {}
    outcome = CampaignOutcome()
    kept = 0
    for trial in plan.trials:
        must_run, why = store.decide(trial, retry_failed=retry_failed)
        logger.debug("%s: %s", trial.id, why)
        if must_run:
            todo.setdefault(trial.host, []).append(trial)
        else:
            kept += 1
            status = (store.load_trial(trial.id) or {}).get("status", "?")
            outcome.counts[status] = outcome.counts.get(status, 0) + 1
    stop = threading.Event()
    inventory = None
    if follow:  # the connection a log follower uses: Ansible's import (~0.25 s) only then
        from runner.inventory import Inventory  # noqa: PLC0415 - see above
        inventory = Inventory(loaded.inventory)
    ctx = _Ctx(loaded, store, progress, stop, follow, inventory, secrets, facts_cache)
    progress.start(sum(len(t) for t in todo.values()), kept, [(t.id, h) for h, ts in todo.items() for t in ts])
    if todo:
        _warm_report_imports(plan)
    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(todo) or 1)), thread_name_prefix="host")
    futures: set[Future[dict[str, int]]] = {pool.submit(_host_worker, ctx, h, ts) for h, ts in todo.items()}
    crashed = ""
    try:
        while futures:
            done, futures = wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
            for f in done:
                for status, n in f.result().items():
                    outcome.counts[status] = outcome.counts.get(status, 0) + n
    except KeyboardInterrupt:
        outcome.interrupted = True
        stop.set()
        progress.note("stopping: cancelling running phases; finished trials are kept")
        for f in futures:
            for status, n in f.result().items():
                outcome.counts[status] = outcome.counts.get(status, 0) + n
    except BaseException as exc:  # a crash (the CLI reports it, exit 5): the other hosts stop too
        stop.set()
        crashed = f"the runner failed: {type(exc).__name__}"
        raise
    finally:
        pool.shutdown(wait=True)
        progress.stop()
        reap(f"{results_id(store.root)}:{os.getpid()}:")  # nothing of this run outlives it
        outcome.stopped = "; ".join(ctx.stopped)
        marked = close_run(store, (t.id for trials in todo.values() for t in trials), run_info, outcome.counts,
                           outcome.interrupted, outcome.stopped, crashed)
        if marked:
            outcome.counts[TrialStatus.INTERRUPTED] = outcome.counts.get(TrialStatus.INTERRUPTED, 0) + marked
    return outcome

