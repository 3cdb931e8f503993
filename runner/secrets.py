"""Credentials a campaign names but never holds: read from the controller's environment at run
time, handed to the node outside any file the runner keeps, and scrubbed from every artifact.

A campaign lists names (``engine.env_from_controller: [HF_TOKEN]``); plan.json, trial.json and the
frozen campaign hold only those names. The values reach ansible-playbook through its inherited
environment (never its command line or extra vars); the playbooks write them, with ``no_log``,
to a 0600 file in the node's trial folder that the node tools read and the collect phase
removes. As a last guard, every text file of a finished trial is scrubbed of the values.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import SpecError

__all__ = ["REDACTED", "Secrets"]

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
        return changed
