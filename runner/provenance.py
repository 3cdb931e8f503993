"""Where a result came from: tool versions, the git commit of this checkout, the inventory."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from runner import __version__

__all__ = ["REPO_ROOT", "collect_stamp", "git_state", "inventory_digest", "tool_versions"]

REPO_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("ansible-core", "ansible", "ansible-runner", "pandas", "pydantic", "paramiko", "jinja2")


def tool_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"

    out["runner"] = __version__
    return out


COMMIT_VARIABLE = "GPU_CAMPAIGN_COMMIT"  # the commit of a tree copied without its .git, said by whoever copied it
_EXPORTED = REPO_ROOT / "runner" / "COMMIT"  # `git archive` writes the commit into it (.gitattributes: export-subst)


def git_state(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The commit this tree is (``sha``), whether it has changes (``dirty``: None where unknown) and how
    that is known (``source``): ``GPU_CAMPAIGN_COMMIT`` in the environment when whoever copied the tree
    says so (it wins: a copy may carry a stale .git; git's own answer stays beside it as ``git_sha``),
    else git itself, else the commit ``git archive`` wrote into ``runner/COMMIT``."""
    state = _git_state(repo)
    said = os.environ.get(COMMIT_VARIABLE, "").strip()
    if re.fullmatch(r"[0-9a-f]{40}", said):
        return {"sha": said, "dirty": None, "source": "environment", "git_sha": state["sha"]}
    if state["sha"]:
        return {**state, "source": "git"}
    try:
        exported = _EXPORTED.read_text().strip()
    except OSError:
        exported = ""
    if re.fullmatch(r"[0-9a-f]{40}", exported):
        return {"sha": exported, "dirty": None, "source": "archive"}
    return {"sha": None, "dirty": None, "source": None}


def _git_state(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": bool(dirty) if dirty is not None else None}


def inventory_digest(sources: Sequence[str]) -> dict[str, Any]:
    """Sources and a sha256 over the inventory's files (not their content: it may hold secrets)."""
    digest = hashlib.sha256()
    count = 0
    for source in sources:
        path = Path(source)
        if not path.exists():  # a host list ("h1,h2,")
            digest.update(source.encode())
            continue
        files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
        count += len(files)
        for f in files:
            digest.update(str(f.relative_to(path.parent if path.is_file() else path)).encode())
            digest.update(f.read_bytes())
    return {"path": ", ".join(sources), "files": count, "sha256": digest.hexdigest()}


@functools.cache
def collect_stamp() -> str:
    """A digest of the code that turns a trial's files into its metrics (the kinds and the parsers):
    a trial whose metrics carry the same stamp need not be collected again for a report (10,000
    trials: most of a report's time); any change to that code makes every trial be collected again."""
    digest = hashlib.sha256(__version__.encode())
    for folder in ("experiments", "parse"):
        for path in sorted((REPO_ROOT / "runner" / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
