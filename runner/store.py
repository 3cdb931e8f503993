"""The results folder of one campaign: atomic writes, resume decisions, nothing ever lost.

Layout (docs/campaign.md, "The results folder")::

    <root>/campaign.yaml  plan.json  run.json
    <root>/hosts/<host>/facts.json
    <root>/trials/<trial_id>/trial.json
    <root>/trials/<trial_id>/raw/<host>/...      fetched files, untouched
    <root>/trials/<trial_id>/ansible/...         ansible-runner artefacts, one ident per phase
    <root>/summary.csv  report.md

A trial's status is one of ``ok``, ``failed``, ``skipped`` (by design, with a reason), ``refused``
(a preflight found that the campaign's settings do not fit the node) or ``interrupted`` (stopped
by Ctrl-C; always run again). A finished trial is kept only while its
definition is unchanged; an earlier attempt is moved to ``previous/``, never deleted.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.files import atomic_write_text
from runner.plan import Trial
from runner.records import KEPT, TrialRecord, TrialStatus

__all__ = ["ResultsStore", "atomic_write_text"]


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


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
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()  # playbooks run elsewhere: every path handed out is absolute
        self.trials_dir = self.root / "trials"

    @classmethod
    def open(cls, root: Path, *, fresh: bool = False) -> ResultsStore:
        """Open (and create) ``root``; with ``fresh`` an existing folder is moved aside first."""
        if fresh and root.exists() and any(root.iterdir()):
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = root.with_name(f"{root.name}.before-{stamp}")
            root.rename(aside)
        root.mkdir(parents=True, exist_ok=True)
        return cls(root)

    # --- generic files ------------------------------------------------------------------------

    def write_json(self, rel: str | Path, data: Any) -> Path:
        path = self.root / rel
        atomic_write_text(path, _dump(data))
        return path

    def read_json(self, rel: str | Path) -> Any | None:
        path = self.root / rel
        if not path.is_file():
            return None
        return json.loads(path.read_text())

    def write_text(self, rel: str | Path, text: str) -> Path:
        path = self.root / rel
        atomic_write_text(path, text)
        return path

    def freeze_campaign(self, text: str, source: Path) -> Path:
        """``campaign.yaml``: the campaign file as it ran, its schema modeline pointing at the same
        schema from here (or, where that schema is not found, a note in its place: one line for one)."""
        return self.write_text("campaign.yaml", _modeline_from(text, source.resolve().parent, self.root))

    # --- trials ------------------------------------------------------------------------------

    def trial_dir(self, trial_id: str) -> Path:
        return self.trials_dir / trial_id

    def load_trial(self, trial_id: str) -> TrialRecord | None:
        record = self.read_json(Path("trials") / trial_id / "trial.json")
        return record if isinstance(record, dict) else None

    def save_trial(self, trial_id: str, record: TrialRecord) -> None:
        self.write_json(Path("trials") / trial_id / "trial.json", record)

    def iter_trials(self) -> Iterator[TrialRecord]:
        if not self.trials_dir.is_dir():
            return
        for d in sorted(self.trials_dir.iterdir()):
            record = self.load_trial(d.name) if d.is_dir() else None
            if record is not None:
                yield record

    def begin_trial(self, trial_id: str) -> Path:
        """A fresh folder for a trial about to run; an earlier attempt is moved to ``previous/``."""
        path = self.trial_dir(trial_id)
        if path.exists():
            aside = self.root / "previous" / f"{trial_id}.{time.strftime('%Y%m%d-%H%M%S')}"
            n = 1
            while aside.exists():
                aside = aside.with_name(f"{aside.name.split('~')[0]}~{n}")
                n += 1
            aside.parent.mkdir(parents=True, exist_ok=True)
            path.rename(aside)
        path.mkdir(parents=True)
        return path

    def decide(self, trial: Trial, *, retry_failed: bool) -> tuple[bool, str]:
        """Whether ``trial`` must run now, and why (for the log)."""
        record = self.load_trial(trial.id)
        if record is None:
            return True, "new"
        if record.get("definition_hash") != trial.definition_hash():
            return True, "definition changed"
        status = record.get("status")
        if status in KEPT:
            return False, f"kept ({status})"
        if status in (TrialStatus.FAILED, TrialStatus.REFUSED):
            return (True, f"retry {status}") if retry_failed else (False, f"kept ({status}; --retry-failed reruns)")
        return True, f"resume ({status or 'incomplete'})"
