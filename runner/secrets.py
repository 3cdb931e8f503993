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

What counts as a credential is named here too (``is_secret_name``, ``looks_like_credential``), so
the campaign checks and the ``-e`` reader (a lower layer) hide the same ones in their messages.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import SpecError

__all__ = ["REDACTED", "Secrets", "is_secret_name", "looks_like_credential", "shown_name"]

logger = logging.getLogger(__name__)

REDACTED = "***"
_MIN_LEN = 4  # shorter values would scrub innocent text; a credential is never this short
_MAX_SCRUB_BYTES = 256 * 1024 * 1024


_SECRET_WORDS = {"SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
_KEY_QUALIFIERS = {"API", "ACCESS", "PRIVATE", "SECRET", "AUTH", "SIGNING"}
# Prefixes of widely used credentials (OpenAI-style, Hugging Face, GitHub, GitLab, Slack, AWS, Google, JWT).
_CREDENTIAL_PREFIXES = ("sk-", "hf_", "ghp_", "gho_", "ghs_", "ghu_", "github_pat_", "glpat-", "xoxb-", "xoxp-",
                        "AKIA", "ASIA", "AIza", "eyJ")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, DB_PASS, OPENAI_API_KEY, api-key are credentials; STANDIN_KV_CAPACITY_TOKENS is not."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(w == "KEY" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words)):
        return True
    # HF_TOKEN, ACCESS_TOKEN; not BYTES_PER_TOKEN or MAX_TOKENS (token counts are everywhere here)
    return bool(words) and words[-1] == "TOKEN" and (len(words) == 1 or words[-2] not in {"PER", "MAX", "MIN", "NUM"})


def looks_like_credential(text: str) -> bool:
    """A name or value that may be a credential itself: ``name=value`` in one string, a known
    credential prefix, or a long word mixing letters and digits (no flag or key word does)."""
    if "=" in text:
        return True
    bare = text.lstrip("-")
    # hf_ + 34 characters is a Hugging Face token; hf_overrides is a vLLM flag.
    if any(bare.startswith(p) and len(bare) >= len(p) + 16 for p in _CREDENTIAL_PREFIXES):
        return True
    return any(len(w) >= 16 and re.search(r"\d", w) and re.search(r"[A-Za-z]", w)
               for w in re.split(r"[-_.:/\s]+", text))


def shown_name(name: object) -> str:
    """A key or name for a message: quoted (control characters escaped) unless it may be a
    credential pasted in the wrong place, or file content such as ``KEY=value``."""
    text = str(name)
    if len(text) <= 64 and not looks_like_credential(text):
        return ascii(text) if not _PLAIN_NAME.match(text) else repr(text)
    return f"(a {len(text)}-character name, not shown: it may hold a credential)"


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
