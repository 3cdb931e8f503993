"""The last resort: an exception nobody expected is one line naming what and where, exit 5, and
its traceback in a crash log (the results folder's, else a private temporary file). The faults are
injected (monkeypatch) because every known one is fixed: the handler is for the unknown ones."""

from __future__ import annotations

import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import runner.campaign
import runner.plan
import runner.report
from runner.cli import EXIT_CRASH, main
from tests.support.results_folder import make_results

GOOD = "name: demo\ninventory: inventory\nexperiments:\n  - kind: selftest\n    modes: [noop]\n"


def _crash(capsys: pytest.CaptureFixture[str]) -> tuple[str, Path]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    match = re.search(r"the traceback is in (\S+)\. This is a bug in the runner", line)
    assert match, line
    return line, Path(match.group(1))


def test_a_fault_in_report_is_one_line_and_a_crash_log_in_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    make_results(tmp_path, root)

    def broken(*args: object, **kwargs: object) -> str:
        raise KeyError("boom")

    monkeypatch.setattr(runner.report, "summary_json", broken)  # fault injected
    assert main(["report", str(root)]) == EXIT_CRASH == 5
    line, log = _crash(capsys)
    # Where: the innermost frame of the runner's own code.
    assert re.match(r"error: internal error: KeyError: 'boom' at runner/report\.py:\d+ in build_report; ", line), line
    assert log.parent == root and log.name.startswith("crash-")
    text = log.read_text()
    assert text.startswith(f"command: python -m runner report {root}\n")
    assert "Traceback (most recent call last)" in text and "in build_report" in text


def test_without_a_results_folder_the_log_is_a_private_temporary_file(
        write_campaign: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_campaign(GOOD)

    def broken(*args: object, **kwargs: object) -> None:
        raise RecursionError("maximum recursion depth exceeded\nwhile doing something")

    monkeypatch.setattr(runner.plan, "expand", broken)  # fault injected
    assert main([str(path), "--plan", "--results", str(tmp_path / "nowhere")]) == 5
    line, log = _crash(capsys)
    assert re.search(r"RecursionError: maximum recursion depth exceeded at runner/cli\.py:\d+ in _cmd_run; ", line)
    assert log.parent == Path(tempfile.gettempdir()) and log.name.startswith("gpu-campaign-")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    log.unlink()


def test_a_crash_never_prints_or_logs_a_secret(write_campaign: Callable[[str], Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    planted = "planted-Secret-value-5e1f"
    monkeypatch.setenv("DB_PASS", planted)
    path = write_campaign(GOOD + "engine: {model: m, env_from_controller: [DB_PASS]}\n")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"could not use {planted}")

    monkeypatch.setattr(runner.campaign, "run_campaign", broken)  # fault injected
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 5
    line, log = _crash(capsys)
    assert "RuntimeError: could not use ***" in line and planted not in line
    assert log.parent == results
    assert planted not in log.read_text() and "could not use ***" in log.read_text()
