"""The results folder of one campaign: atomic writes, resume decisions, nothing ever lost.

Layout (docs/campaign.md, "The results folder")::

    <root>/campaign.yaml  plan.json  run.json
    <root>/hosts/<host>/facts.json
    <root>/trials/<trial_id>/trial.json
    <root>/trials/<trial_id>/raw/<host>/...      fetched files, untouched
    <root>/trials/<trial_id>/ansible/...         ansible-runner artefacts, one ident per phase
    <root>/summary.csv  report.md

Everything is read back through ``results_reader`` (regular files inside the folder, bounded,
typed): a file that cannot be used is moved to ``quarantine/`` and the trial runs again.

A trial's status is one of ``ok``, ``failed``, ``skipped`` (by design, with a reason), ``refused``
(a preflight found that the campaign's settings do not fit the node) or ``interrupted`` (stopped
by Ctrl-C; always run again). A finished trial is kept only while its
definition is unchanged; an earlier attempt is moved to ``previous/``, never deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from runner.errors import ResultsWriteError, RunnerError
from runner.files import atomic_write_text
from runner.plan import Trial
from runner.records import KEPT, TRIAL_SHAPE, TrialRecord, TrialStatus
from runner.results_reader import LOCK_NAME, RESERVE_NAME, ResultsReader

__all__ = ["FACTS_SHAPE", "PLAN_SHAPE", "RUN_SHAPE", "ResultsStore", "atomic_write_text"]

_NUMBER = (int, float)
# What the readers of these files use (runner/results_reader.py has the notation).
PLAN_SHAPE = {"campaign": str, "trials!": [{"id!": str, "experiment!": str, "kind!": str, "mode!": str,
                                              "repeat!": int, "host!": str, "engine": {"kind": str, "args": dict},
                                              "refusals": [str]}]}
RUN_SHAPE = {"campaign": str, "runs!": [dict], "git": {"sha": str, "dirty": bool}, "tools": dict}
FACTS_SHAPE = {"gpus": [{"name": str}], "memory": {"total_bytes": _NUMBER}, "numa": list, "driver_version": str,
               "kernel": str, "page_cache_bytes": _NUMBER}
_FOLDERS = ("trials", "hosts", "previous")
_RESERVE_BYTES = 128 * 1024  # enough to mark a running trial per host interrupted (~11 KB each) and close run.json
_LOOKS_LIKE_RESULTS = ("plan.json", "run.json", "trials")


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def _status_known(record: Any) -> str | None:
    status = record.get("status")
    return None if status in set(TrialStatus) else f"status is {str(status)[:40]!r}, not a trial status"

_MODELINE = re.compile(r"^(#\s*yaml-language-server:\s*\$schema=)(\S+)[ \t]*$", re.MULTILINE)


def _modeline_from(text: str, source_dir: Path, copy_dir: Path) -> str:
    """An editor's schema modeline with a relative path, rewritten for a copy in ``copy_dir``."""

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if "://" in target or target.startswith("/"):
            return match.group(0)  # a URL or an absolute path reads the same from anywhere
        schema = (source_dir / target).resolve()
        if not schema.is_file():
            return f"# (schema modeline of the original, {target}, not found from this copy)"
        return match.group(1) + os.path.relpath(schema, copy_dir)

    return _MODELINE.sub(rewrite, text, count=1)


class ResultsStore:
    def __init__(self, root: Path, *, quarantine: bool = True) -> None:
        self.root = root.resolve()  # playbooks run elsewhere: every path handed out is absolute
        self.trials_dir = self.root / "trials"
        self.reader = ResultsReader(self.root, quarantine=quarantine)

    @classmethod
    def open(cls, root: Path, *, fresh: bool = False) -> ResultsStore:
        """Open (and create) ``root``; with ``fresh`` what it holds is moved aside first (to a
        sibling ``<name>.before-<time>``; the folder itself stays, with its lock)."""
        try:
            root.mkdir(parents=True, exist_ok=True)
            if fresh:
                _move_aside(root)
        except OSError as exc:
            raise ResultsWriteError(root, exc) from exc
        store = cls(root)
        for name in _FOLDERS:  # `trials` replaced by a file: moved aside, so the run can create it
            store.reader.ensure_folder(name)
        return store

    @property
    def problems(self) -> list[str]:
        """Files that could not be used, one line each (what, and where they were moved)."""
        return self.reader.problems

    # --- generic files ------------------------------------------------------------------------

    def write_json(self, rel: str | Path, data: Any) -> Path:
        path = self.root / rel
        atomic_write_text(path, _dump(data))
        return path

    def read_json(self, rel: str | Path, shape: Any = None) -> Any | None:
        """The file's JSON value, or None when it is absent or cannot be used (reported)."""
        return self.reader.json(rel, shape)

    def read_text(self, rel: str | Path) -> str | None:
        return self.reader.text(rel)

    def write_text(self, rel: str | Path, text: str) -> Path:
        path = self.root / rel
        atomic_write_text(path, text)
        return path

    def make_dir(self, path: Path) -> Path:
        """``mkdir -p`` that reports a refusing disk as ``ResultsWriteError``, as every write does."""
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsWriteError(path, exc) from exc
        return path

    def read_plan(self) -> dict[str, Any] | None:
        return self.read_json("plan.json", PLAN_SHAPE)

    def read_run(self) -> dict[str, Any] | None:
        return self.read_json("run.json", RUN_SHAPE)

    def read_facts(self, host: str) -> dict[str, Any] | None:
        return self.read_json(Path("hosts") / host / "facts.json", FACTS_SHAPE)

    def hosts(self) -> list[str]:
        return list(self.reader.folders("hosts"))

    def freeze_campaign(self, text: str, source: Path) -> Path:
        """``campaign.yaml``: the campaign file as it ran, its schema modeline pointing at the same
        schema from here (or, where that schema is not found, a note in its place: one line for one)."""
        return self.write_text("campaign.yaml", _modeline_from(text, source.resolve().parent, self.root))

    # --- trials ------------------------------------------------------------------------------

    def trial_dir(self, trial_id: str) -> Path:
        return self.trials_dir / trial_id

    def load_trial(self, trial_id: str) -> TrialRecord | None:
        def fits(record: Any) -> str | None:
            if record["id"] != trial_id:
                return f"id is {record['id'][:80]!r}, not its folder's name"
            return _status_known(record)

        record = self.reader.json(Path("trials") / trial_id / "trial.json", TRIAL_SHAPE, fits)
        return record if isinstance(record, dict) else None

    def save_trial(self, trial_id: str, record: TrialRecord) -> None:
        self.write_json(Path("trials") / trial_id / "trial.json", record)

    def iter_trials(self) -> Iterator[TrialRecord]:
        for name in self.reader.folders("trials"):
            record = self.load_trial(name)
            if record is not None:
                yield record

    def begin_trial(self, trial_id: str) -> Path:
        """A fresh folder for a trial about to run; an earlier attempt is moved to ``previous/``."""
        path = self.trial_dir(trial_id)
        try:
            if os.path.lexists(path):
                aside = self.root / "previous" / f"{trial_id}.{time.strftime('%Y%m%d-%H%M%S')}"
                n = 1
                while aside.exists():
                    aside = aside.with_name(f"{aside.name.split('~')[0]}~{n}")
                    n += 1
                aside.parent.mkdir(parents=True, exist_ok=True)
                path.rename(aside)
            path.mkdir(parents=True)
        except OSError as exc:
            raise ResultsWriteError(path, exc) from exc
        return path

    def interrupt_running(self, trial_ids: Iterable[str], why: str) -> list[str]:
        """Mark each of these trials whose record still says ``running`` as ``interrupted``
        (a stopped or crashed run); returns their ids. Raises ``ResultsWriteError`` when the disk
        refuses (free the reserve first)."""
        marked = []
        for trial_id in trial_ids:
            record = self.load_trial(trial_id)
            if record is None or record.get("status") != TrialStatus.RUNNING:
                continue
            now = time.time()
            started = record.get("started") or now
            record.update(status=TrialStatus.INTERRUPTED, reason=f"the run stopped before it ended ({why}); "
                          "the next run repeats it", ended=now, duration_s=round(now - started, 3))
            self.save_trial(trial_id, record)
            marked.append(trial_id)
        return marked

    # --- room to record a stop on a full disk -------------------------------------------------

    def hold_reserve(self) -> None:
        """Take a little room now, so that a run the disk stops can still record how it ended."""
        # Not zeros: a compressing filesystem would keep no room for them.
        atomic_write_text(self.root / RESERVE_NAME, os.urandom(_RESERVE_BYTES // 2).hex())

    def free_reserve(self) -> None:
        with contextlib.suppress(OSError):
            (self.root / RESERVE_NAME).unlink()

    def decide(self, trial: Trial, *, retry_failed: bool) -> tuple[bool, str]:
        """Whether ``trial`` must run now, and why (for the log)."""
        record = self.load_trial(trial.id)
        if record is None:
            return True, "new"
        if record.get("definition_hash") != trial.definition_hash():
            return True, "definition changed"
        status = record.get("status")
        if status == TrialStatus.SKIPPED and retry_failed and not _skipped_by_plan(record):
            # The node's state at the time (a GPU another process held, a port in use, fio missing)
            # may have changed since; a plan's skip would only say the same again.
            return True, "retry skipped (the node's state then)"
        if status in KEPT:
            return False, f"kept ({status})"
        if status in (TrialStatus.FAILED, TrialStatus.REFUSED):
            return (True, f"retry {status}") if retry_failed else (False, f"kept ({status}; --retry-failed reruns)")
        return True, f"resume ({status or 'incomplete'})"


def _skipped_by_plan(record: Mapping[str, Any]) -> bool:
    """Whether the plan skipped the trial (this mode cannot run on this engine), not the node."""
    node = record.get("node")
    return isinstance(node, Mapping) and bool(node.get("skip"))


def _move_aside(root: Path) -> None:
    """Move what ``root`` holds to a sibling folder; the folder and its lock file stay."""
    entries = [e for e in root.iterdir() if e.name != LOCK_NAME]
    if not entries:
        return
    if not any((root / name).exists() for name in _LOOKS_LIKE_RESULTS):
        raise RunnerError(f"--fresh: {root} holds files but no plan.json, run.json or trials/: it is not a "
                          "results folder, and nothing of it was moved")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = root.resolve()  # `--results .` or `a/..`: the sibling is named after the folder itself
    aside = root.with_name(f"{root.name[:200]}.before-{stamp}")  # [:200]: the name stays under NAME_MAX
    n = 1
    while os.path.lexists(aside):
        aside = root.with_name(f"{root.name[:200]}.before-{stamp}~{n}")
        n += 1
    aside.mkdir()
    for entry in entries:
        entry.rename(aside / entry.name)
