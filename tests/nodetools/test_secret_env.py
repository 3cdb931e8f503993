"""The engine's secrets on the node (nodetools/secret_env.py): taken once from the 0600 file the
playbook wrote, the file removed, the values in the engine's environment and nowhere else.

The end-to-end case runs ``nodetools.coldstart trial`` (prepare, then the timer) on a real engine
program that records a hash of what its environment holds and answers completions over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodetools import exitcodes
from nodetools.proc import launch_env
from nodetools.secret_env import SECRETS_FILE, SecretsError, secret_names, take_secrets
from tests.nodetools.conftest import REPO, free_port
from tests.nodetools.test_coldstart_timeline import ENGINE as TIMELINE_ENGINE

VALUE = "hf_sEcReT-test-value-0123456789"
OTHER = "other-sEcReT-never-asked-for"

# The timeline test's engine (it answers completions over HTTP), which first writes what its
# environment holds: hashes, never the values, to the file SEEN_OUT names.
ENGINE = """\
import hashlib, json, os
seen = {k: hashlib.sha256(os.environ[k].encode()).hexdigest() for k in ("HF_TOKEN", "OTHER_TOKEN") if k in os.environ}
open(os.environ["SEEN_OUT"], "w").write(json.dumps(seen))
""" + TIMELINE_ENGINE


def write_secrets(folder: Path, values: dict[str, str], mode: int = 0o600) -> Path:
    """What playbooks/experiments/tasks/write_secrets.yml leaves: a JSON object, created 0600."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SECRETS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(values))
    path.chmod(mode)
    return path


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_take_reads_the_named_values_and_removes_the_file(tmp_path: Path) -> None:
    path = write_secrets(tmp_path, {"HF_TOKEN": VALUE, "OTHER_TOKEN": OTHER})
    assert take_secrets(tmp_path, ["HF_TOKEN"]) == {"HF_TOKEN": VALUE}
    assert not path.exists()


def test_no_name_asked_for_still_removes_a_file_there(tmp_path: Path) -> None:
    path = write_secrets(tmp_path, {"HF_TOKEN": VALUE})
    assert take_secrets(tmp_path, []) == {}
    assert not path.exists()
    assert take_secrets(tmp_path / "no-folder", []) == {}


@pytest.mark.parametrize(("case", "expected"), [
    ("missing", "missing: the engine needs HF_TOKEN from the controller"),
    ("readable", "mode 0644 lets others read it (must be 0600)"),
    ("symlink", "cannot read it"),
    ("no value", "no value for HF_TOKEN"),
    ("not an object", "not a JSON object"),
    ("not json", "not JSON"),
])
def test_a_file_that_cannot_be_trusted_or_lacks_a_name_is_refused_without_its_content(
        tmp_path: Path, case: str, expected: str) -> None:
    path = tmp_path / SECRETS_FILE
    if case == "readable":
        write_secrets(tmp_path, {"HF_TOKEN": VALUE}, mode=0o644)
    elif case == "symlink":
        target = write_secrets(tmp_path / "elsewhere", {"HF_TOKEN": VALUE})
        path.symlink_to(target)
    elif case == "no value":
        write_secrets(tmp_path, {"OTHER_TOKEN": OTHER, "HF_TOKEN": ""})
    elif case == "not an object":
        write_secrets(tmp_path, [VALUE])  # type: ignore[arg-type]
    elif case == "not json":
        path.write_text(VALUE + "{")
        path.chmod(0o600)
    with pytest.raises(SecretsError) as refused:
        take_secrets(tmp_path, ["HF_TOKEN"])
    assert expected in str(refused.value) and str(path) in str(refused.value)
    assert VALUE not in str(refused.value) and OTHER not in str(refused.value)
    assert not path.exists() and not path.is_symlink()  # never left behind, whatever it was


def test_launch_env_adds_only_the_names_the_launch_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    launch = {"env": {"A": 1}, "secret_env": ["HF_TOKEN"]}
    env = launch_env(launch, {"HF_TOKEN": VALUE, "OTHER_TOKEN": OTHER})
    assert env["HF_TOKEN"] == VALUE and env["A"] == "1" and "OTHER_TOKEN" not in env
    assert "HF_TOKEN" not in launch_env(launch)  # no values given: none added
    assert secret_names([launch, {"secret_env": ["B_TOKEN", "HF_TOKEN"]}, {}]) == ["B_TOKEN", "HF_TOKEN"]


def node_trial(work: Path, launch: dict[str, object], lock_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "OTHER_TOKEN")}
    return subprocess.run([sys.executable, "-m", "nodetools.coldstart", "trial", "--dir", str(work),
                           "--launch-json", json.dumps(launch), "--poll-s", "0.05", "--timeout-s", "60",
                           "--lock-dir", str(lock_dir)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False)


def test_the_engine_gets_the_value_and_the_trial_folder_keeps_none(tmp_path: Path) -> None:
    port, seen = free_port(), tmp_path / "seen.json"
    (tmp_path / "engine.py").write_text(ENGINE)
    work = tmp_path / "trial"
    (work / "server.log").parent.mkdir(parents=True)
    (work / "server.log").write_text("an earlier attempt's log\n")  # the prepare empties the folder
    write_secrets(work, {"HF_TOKEN": VALUE, "OTHER_TOKEN": OTHER})
    launch = {"argv": [sys.executable, str(tmp_path / "engine.py"), str(port)], "env": {"SEEN_OUT": str(seen)},
              "port": port, "model": "m", "secret_env": ["HF_TOKEN"]}
    done = node_trial(work, launch, tmp_path)
    assert done.returncode == exitcodes.OK, done.stderr
    assert json.loads(seen.read_text()) == {"HF_TOKEN": sha(VALUE)}  # what was asked for, and only that
    assert not (work / SECRETS_FILE).exists()
    for path in work.rglob("*"):
        if path.is_file():
            assert VALUE.encode() not in path.read_bytes() and OTHER.encode() not in path.read_bytes(), path
    assert VALUE not in done.stdout + done.stderr


def test_a_launch_naming_a_secret_without_its_file_starts_nothing(tmp_path: Path) -> None:
    port, seen = free_port(), tmp_path / "seen.json"
    (tmp_path / "engine.py").write_text(ENGINE)
    launch = {"argv": [sys.executable, str(tmp_path / "engine.py"), str(port)], "env": {"SEEN_OUT": str(seen)},
              "port": port, "model": "m", "secret_env": ["HF_TOKEN"]}
    done = node_trial(tmp_path / "trial", launch, tmp_path)
    assert done.returncode == exitcodes.BAD_INPUT
    assert "secrets.json: missing: the engine needs HF_TOKEN from the controller" in done.stderr
    assert not seen.exists()
