"""What a startup mode needs from the engine's vLLM, checked the way the engine runs it.

On the borrowed H200, vLLM and its loaders live in a ``--target`` folder that only the engine's
PYTHONPATH names, and vLLM is ``python -m vllm.entrypoints.cli.main``, not a ``vllm`` on PATH: a
module check without that PYTHONPATH skipped installed loaders, and ``preload`` died with
"No such file or directory: 'vllm'". The vLLM here is a MOCK package (no GPU): its CLI is real
argparse, so a missing subcommand fails as vLLM 0.24.0's does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nodetools import exitcodes
from nodetools.timer import Timer
from tests.support.mock_vllm import mock_vllm_site

REPO = Path(__file__).resolve().parents[2]

MOCK_VLLM_MAIN = '''"""MOCK vllm CLI (tests only): argparse subcommands, as vLLM's main.py has them."""
import argparse, json, os, socket, sys, time
p = argparse.ArgumentParser(prog="main.py")
sub = p.add_subparsers(dest="cmd", required=True)
sub.add_parser("serve")
if os.environ.get("MOCK_VLLM_PRELOAD"):
    pre = sub.add_parser("preload")
    pre.add_argument("--model", required=True)
    pre.add_argument("--weight-cache-health-port", type=int, required=True)
args, _ = p.parse_known_args()
if args.cmd == "preload":
    with open(os.environ["MOCK_VLLM_PRELOAD"], "w") as fh:
        json.dump(sys.argv[1:], fh)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", args.weight_cache_health_port)); s.listen()
    time.sleep(60)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def preflight(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "nodetools.preflight", "--port", "1", *args],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout)["reasons"]


def test_a_module_beside_the_engine_is_found_on_its_pythonpath(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "loader_beside_engine").mkdir(parents=True)
    (site / "loader_beside_engine" / "__init__.py").write_text("")
    need = ["--python", sys.executable, "--python-module", "loader_beside_engine"]
    assert preflight(*need) == [
        f"python module loader_beside_engine is not installed beside the engine ({sys.executable}): the mode needs it"]
    assert preflight(*need, "--pythonpath", str(site)) == []
    assert preflight("--python", str(tmp_path / "no-python"), "--python-module", "x") == [
        f"python {str(tmp_path / 'no-python')!r} for the engine does not exist"]


def launch_of(site: Path, **env: str) -> dict:
    return {"argv": [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/q", "--port", "8000"],
            "env": {"PYTHONPATH": str(site), **env}, "port": free_port(), "model": "/models/q"}


def test_a_vllm_without_preload_is_a_skip_reason_in_its_own_words(tmp_path: Path) -> None:
    launch = launch_of(mock_vllm_site(tmp_path / "site", MOCK_VLLM_MAIN))
    reasons = preflight("--vllm-subcommand", "preload", "--launch-json", json.dumps(launch))
    assert len(reasons) == 1 and reasons[0].startswith(
        f"'{sys.executable} -m vllm.entrypoints.cli.main preload' is not available (this vLLM has no preload "
        "command): main.py: error: argument cmd: invalid choice: 'preload'"), reasons  # argparse's own words
    with_preload = launch_of(tmp_path / "site", MOCK_VLLM_PRELOAD=str(tmp_path / "preload-argv.json"))
    assert preflight("--vllm-subcommand", "preload", "--launch-json", json.dumps(with_preload)) == []
    bad = subprocess.run([sys.executable, "-m", "nodetools.preflight", "--port", "1", "--vllm-subcommand", "preload",
                          "--launch-json", "[1]"], capture_output=True, text=True, check=False, cwd=REPO)
    assert bad.returncode == exitcodes.BAD_INPUT and "--launch-json must be a JSON object" in bad.stderr
    docker = {"argv": ["docker", "run", "img"], "container": "c1"}
    assert preflight("--vllm-subcommand", "preload", "--launch-json", json.dumps(docker)) == [
        "preload runs vLLM as a process on the node (runtime: process), not in a container"]


def test_preload_runs_the_launchs_own_vllm_command(tmp_path: Path) -> None:
    record = tmp_path / "preload-argv.json"
    launch = {**launch_of(mock_vllm_site(tmp_path / "site", MOCK_VLLM_MAIN), MOCK_VLLM_PRELOAD=str(record)),
              "preload_port": free_port()}
    timer = Timer(launch, tmp_path / "server.log", 0.05, 60)
    try:
        assert timer.start_preload() == exitcodes.OK, timer.out
    finally:
        if timer.pre is not None:
            timer.pre.kill()
            timer.pre.wait()
    assert json.loads(record.read_text()) == [
        "preload", "--model", "/models/q", "--weight-cache-health-port", str(launch["preload_port"])]
    assert timer.out["preload_ready_s"] >= 0


def test_a_vllm_that_does_not_answer_is_a_reason_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nodetools import vllm_cli

    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    monkeypatch.setattr(vllm_cli, "HELP_TIMEOUT_S", 0.3)
    launch = {"argv": [str(slow), "-m", "vllm.entrypoints.cli.main", "serve", "/models/q"]}
    assert vllm_cli.subcommand_reasons(launch, "preload", "preload") == [
        f"'{slow} -m vllm.entrypoints.cli.main preload' did not answer --help within 0.3 s"]
    assert vllm_cli.serve_split({"argv": ["vllm", "serve"]}, "preload")[2] == (
        "preload needs the model after serve, not ['vllm', 'serve']")


def test_the_answer_is_kept_for_the_campaigns_later_trials_until_the_install_changes(tmp_path: Path) -> None:
    # Asking imports vLLM (28 s on the H200 for each preload trial): one question per install.
    from nodetools import vllm_cli

    site = mock_vllm_site(tmp_path / "site", MOCK_VLLM_MAIN)
    launch = launch_of(site)
    answers = tmp_path / ".answers"
    first = vllm_cli.subcommand_reasons(launch, "preload", "preload", answers)
    assert first and "this vLLM has no preload command" in first[0]
    (kept,) = answers.glob("vllm-preload-*.json")
    kept.write_text(json.dumps({"reasons": ["the kept answer"]}))  # shows that it is read, not asked again
    assert vllm_cli.subcommand_reasons(launch, "preload", "preload", answers) == ["the kept answer"]
    stamp = site.stat().st_mtime_ns
    os.utime(site, ns=(stamp + 10**9, stamp + 10**9))  # vLLM reinstalled in its --target folder
    assert vllm_cli.subcommand_reasons(launch, "preload", "preload", answers) == first
    assert len(list(answers.glob("vllm-preload-*.json"))) == 2


def test_a_vllm_that_crashes_on_help_is_asked_again_next_time(tmp_path: Path) -> None:
    # Only an answer is kept (it ran, or its parser refused the subcommand): a crash may pass.
    from nodetools import vllm_cli

    site = mock_vllm_site(tmp_path / "site", "NAME = 'preload'\nraise RuntimeError('CUDA driver not ready')\n")
    answers = tmp_path / ".answers"
    reasons = vllm_cli.subcommand_reasons(launch_of(site), "preload", "preload", answers)
    assert reasons and reasons[0].endswith("RuntimeError: CUDA driver not ready")
    assert not answers.exists()


def test_a_subcommand_named_nowhere_in_the_cli_source_is_refused_without_running_vllm(tmp_path: Path) -> None:
    # vLLM 0.24.0's CLI names each subcommand in vllm/entrypoints/cli/ (name = "serve"): no quoted
    # 'preload' there is as definite as its parser's refusal, and costs no 28 s of imports.
    from nodetools import vllm_cli

    ran = tmp_path / "ran"
    site = mock_vllm_site(tmp_path / "site", f"open({str(ran)!r}, 'w').write('asked')\nNAMES = ['serve', 'bench']\n")
    (site / "vllm-0.24.0.dist-info").mkdir()
    reasons = vllm_cli.subcommand_reasons(launch_of(site), "preload", "preload", tmp_path / ".answers")
    assert reasons == [
        f"'{sys.executable} -m vllm.entrypoints.cli.main preload' is not available (this vLLM has no preload "
        f"command): no 'preload' in its command line's source (vLLM 0.24.0, {site / 'vllm' / 'entrypoints' / 'cli'})"]
    assert not ran.exists()
    # Named there (here as vLLM would: a quoted name), it is asked: the parser has the last word.
    (site / "vllm" / "entrypoints" / "cli" / "preload.py").write_text('NAME = "preload"\n')
    assert vllm_cli.subcommand_reasons(launch_of(site), "preload", "preload") == []
    assert ran.read_text() == "asked"


def test_the_cli_source_read_is_the_one_the_engine_s_interpreter_imports(tmp_path: Path) -> None:
    # A venv's `vllm` script names its interpreter in its shebang; that interpreter, with the
    # engine's environment, says where vllm is (not the alphabetical first site folder).
    from nodetools import vllm_cli

    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    assert vllm_cli._engine_python([str(script), "serve"]) == sys.executable
    script.write_text("#!/usr/bin/env python3 -u\n")
    assert vllm_cli._engine_python([str(script), "serve"]) == "python3"
    assert vllm_cli._engine_python([sys.executable, "-m", "vllm.entrypoints.cli.main"]) == sys.executable
    old = mock_vllm_site(tmp_path / "a-old", "NAMES = ['serve']\n")  # sorts first, not on the path
    new = mock_vllm_site(tmp_path / "b-new", "NAMES = ['serve', 'preload']\n")
    env = {**os.environ, "PYTHONPATH": str(new)}
    assert vllm_cli._cli_folder([sys.executable, "-m", "vllm.entrypoints.cli.main"], env) == (
        new / "vllm" / "entrypoints" / "cli")
    assert old.is_dir()
