"""Credentials a campaign names but never holds: read from the controller's environment at run
time, handed to the node outside any file the runner keeps, and scrubbed from every artifact.

A campaign lists names (``engine.env_from_controller: [HF_TOKEN]``); plan.json, trial.json, the
frozen campaign, the planned launch (``secret_env``) and the playbooks' extra vars
(``exp_secret_names``) hold only those names. The values reach ansible-playbook through its
inherited environment (never its command line or extra vars). ansible-runner records that
environment in ``artifacts/<phase>/command``: runner/execute.py drops its values the moment the
file is written, and again when a run begins. The playbook that starts the engine writes the
values, with ``no_log``, to a file created 0600 in the node's trial folder
(playbooks/experiments/tasks/write_secrets.yml); the node program that starts the engine takes
them from it and removes it (nodetools/secret_env.py), and puts them in the engine's environment
only; the collect removes the file where no program took it. As a last guard, every file of a
finished trial is scrubbed of the values, and each file that held one is logged by name (a leak
to fix, never a value shown).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import SpecError

__all__ = ["REDACTED", "Secrets"]

logger = logging.getLogger(__name__)

REDACTED = "***"
_MIN_LEN = 4  # shorter values would scrub innocent text; a credential is never this short
_MAX_SCRUB_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Secrets:
    values: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_environment(cls, names: Iterable[str], where: str, environ: Mapping[str, str] | None = None) -> Secrets:
        env = os.environ if environ is None else environ
        names = list(names)
        missing = [n for n in names if not env.get(n)]
        if missing:
            raise SpecError([f"{where}: engine.env_from_controller: {', '.join(missing)} "
                             f"{'is' if len(missing) == 1 else 'are'} not set in this shell's environment"])
        short = [n for n in names if len(env[n]) < _MIN_LEN]
        if short:
            raise SpecError([f"{where}: engine.env_from_controller: {short[0]} is shorter than {_MIN_LEN} characters: "
                             "too short to be a credential that can be kept out of the results"])
        return cls({n: env[n] for n in names})

    def scrub_text(self, text: str) -> str:
        for value in self.values.values():
            text = text.replace(value, REDACTED)
        return text

    def scrub_tree(self, root: Path) -> list[Path]:
        """Replace every value in every file under ``root``; returns the files that held one."""
        if not self.values:
            return []
        needles = [v.encode() for v in self.values.values()]
        changed = []
        for path in root.rglob("*"):
            try:
                if not path.is_file() or path.is_symlink() or path.stat().st_size > _MAX_SCRUB_BYTES:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if any(n in data for n in needles):
                for n in needles:
                    data = data.replace(n, REDACTED.encode())
                path.write_bytes(data)
                changed.append(path)
                logger.warning("a secret's value was found in %s: replaced by %s", path, REDACTED)
        return changed
