"""Where run.json's commit comes from: git, the environment (a copied tree), an exported archive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner import provenance

REPO = Path(__file__).resolve().parents[3]


def test_a_checkout_says_its_commit_from_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert provenance.git_state() == {**provenance.git_state(), "sha": head, "source": "git"}


def test_the_environment_wins_over_a_stale_git(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "a" * 40)
    state = provenance.git_state()
    assert (state["sha"], state["source"], state["dirty"]) == ("a" * 40, "environment", None)
    assert state["git_sha"]  # git's own answer kept beside it
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "not a sha")
    assert provenance.git_state()["source"] == "git"


def test_an_exported_tree_says_the_commit_git_archive_wrote(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "runner"], capture_output=True, check=True)
    subprocess.run(["tar", "x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    code = "from runner.provenance import git_state; print(git_state())"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=env).stdout
    assert f"'sha': '{head}'" in out and "'source': 'archive'" in out
