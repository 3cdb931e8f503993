"""A host's facts kept between runs, so that a run soon after another on the same host need not read
them again: reading them is a play and a module run in the first trial's ansible-playbook, ~0.4 s of
a one-trial campaign's ~2 s on a local connection.

An entry serves only while fresh: read at most ``max_age_s`` ago (``FACTS_MAX_AGE_S``;
``--fresh-facts`` reads them again), for the same host of the same inventory (its sources and a
digest of their files) by the same code (the node_facts module, its module_utils and the playbooks
that run it). Every read replaces the entry. Entries live in ``$GPU_CAMPAIGN_CACHE/facts/`` (default
``~/.cache/gpu-campaign``); a cache that cannot be read or written is skipped, never a failure.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.provenance import REPO_ROOT
from runner.store import FACTS_SHAPE
from runner.user_cache import CACHE_VARIABLE, cache_folder, entry_name, files_digest, read_entry, write_entry

__all__ = ["CACHE_VARIABLE", "FACTS_MAX_AGE_S", "FactsCache"]

FACTS_MAX_AGE_S = 600.0
_ENTRY_SHAPE = {"read_at!": (int, float), "host!": str, "facts!": FACTS_SHAPE}
_READERS = ("plugins/modules/node_facts.py", "plugins/module_utils/node_facts", "playbooks/experiments/host_facts.yml",
            "playbooks/experiments/tasks/read_facts.yml")


@functools.cache
def _readers_digest() -> str:
    """The code that reads a node's facts: an entry another version of it wrote is not used."""
    digest = hashlib.sha256()
    for rel in _READERS:
        path = REPO_ROOT / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class FactsCache:
    folder: Path
    max_age_s: float = FACTS_MAX_AGE_S

    @classmethod
    def default(cls, max_age_s: float = FACTS_MAX_AGE_S) -> FactsCache:
        return cls(cache_folder("facts"), max_age_s)

    def _name(self, sources: Sequence[str], host: str) -> str | None:
        sources_digest = files_digest(sources)  # None: too many files to hash, not cached
        return entry_name("facts", host, sources_digest, _readers_digest()) if sources_digest else None

    def get(self, sources: Sequence[str], host: str) -> tuple[dict[str, Any], float] | None:
        """The host's facts and their age in seconds, while fresh; else None."""
        if self.max_age_s <= 0:
            return None
        try:
            name = self._name(sources, host)
        except OSError:  # an inventory file that cannot be read now: Ansible will say so
            return None
        entry = read_entry(self.folder, name, _ENTRY_SHAPE) if name else None
        if entry is None or entry["host"] != host:
            return None
        age = time.time() - entry["read_at"]
        return (entry["facts"], age) if 0 <= age <= self.max_age_s else None

    def put(self, sources: Sequence[str], host: str, facts: dict[str, Any], read_at: float) -> None:
        try:
            name = self._name(sources, host)
        except OSError:
            return
        if name:
            write_entry(self.folder, name, {"read_at": read_at, "host": host, "facts": facts})
