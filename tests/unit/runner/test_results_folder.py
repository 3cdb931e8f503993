"""Results folders that cannot be one, paths a run could not create, and the folder's lock: each
a one-line refusal with its exit code, found before anything runs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runner.cli import main
from runner.paths import PathCheck
from runner.results_lock import ResultsLock

GOOD = "name: demo\ninventory: inventory\nexperiments: [{kind: selftest, modes: [noop]}]\n"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a filesystem")


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    return line


@pytest.fixture
def campaign(write_campaign: Callable[[str], Path]) -> Path:
    return write_campaign(GOOD)


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    points: list[Path] = []

    def mount(*args: str) -> Path:
        point = tmp_path / f"mnt{len(points)}"
        point.mkdir()
        subprocess.run(["mount", *args, str(point)], check=True)
        points.append(point)
        return point

    yield mount
    for point in reversed(points):
        subprocess.run(["umount", "-l", str(point)], check=False)


# --- folders that cannot be results folders ----------------------------------------------------

def test_a_results_folder_under_a_file_is_bad_input(campaign: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "afile").write_text("x")
    results = tmp_path / "afile" / "results"
    for args in (["--plan"], ["--quiet"]):
        assert main([str(campaign), *args, "--results", str(results)]) == 2
        assert _one_error(capsys) == f"--results {results}: cannot be a results folder: {tmp_path / 'afile'} is " \
                                     "not a folder"


@pytest.mark.parametrize("results", ["/proc/self/results", "/proc/results/x", "/proc/self"])
def test_a_results_folder_inside_proc_is_bad_input(campaign: Path, results: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(campaign), "--quiet", "--results", results]) == 2
    assert _one_error(capsys).startswith(f"error: --results {results}: cannot ")


def test_a_results_name_over_name_max_is_bad_input(campaign: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / ("r" * 256)
    assert main([str(campaign), "--plan", "--results", str(results)]) == 2
    line = _one_error(capsys)
    assert line.startswith(f"--results {results}: cannot be a results folder: the name rrrrrrrrrrrr")
    assert "is 256 bytes, over the 255-byte limit of its filesystem (NAME_MAX)" in line


def test_a_250_character_results_name_can_be_locked(campaign: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the lock file beside it (.<name>.lock) overflowed NAME_MAX: a traceback.
    results = tmp_path / ("r" * 250)
    assert main([str(campaign), "--plan", "--results", str(results)]) == 0
    with ResultsLock(results):
        assert (results / ".lock").is_file()


@ROOT_ONLY
def test_a_results_folder_on_a_read_only_filesystem_refuses_in_one_line(
        campaign: Path, mounted: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    disk = mounted("-t", "tmpfs", "-o", "ro", "tmpfs")
    assert main([str(campaign), "--quiet", "--results", str(disk / "results")]) == 4
    assert _one_error(capsys) == f"error: cannot write {disk / 'results'}: Read-only file system"
    assert main(["report", str(disk)]) == 4  # not even its lock can be written
    assert _one_error(capsys) == f"error: cannot write {disk}: Read-only file system"


# --- paths a run would create --------------------------------------------------------------------

def test_a_long_host_and_experiment_are_refused_by_the_plan(write_campaign: Callable[[str], Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Before: --plan passed, and the run died with ENAMETOOLONG making the trial folder.
    host, experiment = "h" * 200, "e" * 64
    (tmp_path / "inventory" / "hosts.yml").write_text(f"all:\n  hosts:\n    {host}:\n      ansible_connection: local\n")
    path = write_campaign(GOOD.replace("kind: selftest", f"kind: selftest, name: {experiment}"))
    results = tmp_path / "results"
    assert main([str(path), "--plan", "--results", str(results)]) == 3
    refused = [line for line in capsys.readouterr().out.splitlines() if "refused:" in line]
    (line,) = refused
    assert f"refused: path /tmp/gpu-campaign/demo/{'h' * 24}...{'h' * 12}/{'e' * 24}" in line
    assert f"on the node cannot be created: the name {'e' * 24}...{'h' * 12} is 273 bytes" in line
    assert main([str(path), "--quiet", "--results", str(results)]) == 3  # a run refuses the same, touching nothing
    err = capsys.readouterr().err
    assert err.startswith(f"{experiment}.noop.r1@{host}: refused: path ")
    assert not results.exists()


def test_a_long_results_path_is_checked_for_every_file_a_run_makes(tmp_path: Path) -> None:
    # The trial's id fits NAME_MAX, but previous/<id>.<time>~N (an earlier attempt) would not.
    check = PathCheck(campaign="demo", remote_dir="/tmp/n", results=tmp_path / "r")
    trial = "e" * 64 + ".noop.r1@" + "h" * 170
    (line,) = check.refusals(trial, "h" * 170, ["run"])
    assert line.startswith("path ") and "/previous/eeeeeeeeeeeeeeeeeeeeeeee...1-000000~999/trial.json " in line
    assert "in the results folder cannot be created" in line
    assert check.refusals("e.noop.r1@h", "h", ["run"]) == []


@pytest.mark.parametrize("host", ["..", "."])
def test_a_host_name_that_leaves_its_folder_is_refused(tmp_path: Path, host: str) -> None:
    check = PathCheck(campaign="demo", remote_dir="/tmp/n", results=tmp_path / "r")
    (line,) = check.refusals(f"x.noop.r1@{host}", host, ["run"])
    assert f"the name {host!r} would put it outside its folder" in line


def test_a_path_over_path_max_on_the_node_is_refused() -> None:
    deep = "/" + "/".join(["d" * 250] * 16)  # 4 KB of remote_dir
    (line,) = PathCheck(campaign="demo", remote_dir=deep, results=None).refusals("x.noop.r1@h", "h", ["run"])
    assert "on the node cannot be created: the path is" in line and "(PATH_MAX)" in line


# --- the lock -----------------------------------------------------------------------------------

@ROOT_ONLY
def test_the_lock_holds_the_folder_through_a_bind_mount(tmp_path: Path, mounted: Callable[..., Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: the lock was named after the path, so the same folder through a bind mount let a second run in.
    real = tmp_path / "results"
    real.mkdir()
    other = mounted("--bind", str(tmp_path))
    with ResultsLock(real):
        with pytest.raises(Exception, match="is in use by another run") as info:
            ResultsLock(other / "results").acquire(["c.yaml"])
        assert type(info.value).__name__ == "ResultsLockedError"


def test_a_refusal_names_the_holders_command(campaign: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    holder = ResultsLock(results)
    holder.acquire(["campaigns/x.yaml", "--results", "r", "-e", "repeats=2"])
    try:
        assert main([str(campaign), "--quiet", "--results", str(results)]) == 4
        line = _one_error(capsys)
        assert line.startswith(f"error: {results} is in use by another run (pid {os.getpid()} on host ")
        assert ": python -m runner campaigns/x.yaml --results r -e repeats=2); wait for it" in line
        (results / "plan.json").write_text('{"trials": []}')
        assert main(["report", str(results)]) == 4  # a report during a live run is refused at once
        line = _one_error(capsys)
        assert line.startswith(f"error: {results} is in use by a run (pid {os.getpid()}")
        assert "the run writes its report when it ends" in line
    finally:
        holder.release()
    assert main(["report", str(results)]) == 0


def test_reports_share_the_lock_and_a_run_waits_for_none(campaign: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    reading = ResultsLock(results)
    reading.acquire(["report", str(results)], shared=True)
    try:
        (results / "plan.json").write_text('{"trials": []}')
        assert main(["report", str(results)]) == 0  # two reports at once
        capsys.readouterr()
        assert main([str(campaign), "--quiet", "--results", str(results)]) == 4
        line = _one_error(capsys)
        assert f"is in use by a report (pid {os.getpid()}" in line and f"python -m runner report {results}" in line
    finally:
        reading.release()


def test_a_lock_file_that_is_not_a_file_is_refused(campaign: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    results.mkdir()
    os.mkfifo(results / ".lock")
    assert main([str(campaign), "--quiet", "--results", str(results)]) == 2
    assert _one_error(capsys) == f"error: --results {results}: its lock file {results / '.lock'} is not a regular " \
                                 "file: remove it"


def test_fresh_in_the_working_folder_moves_it_aside_beside_itself(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # `--results . --fresh` (or '') was a crash: Path('.') has no name to build the sibling's from.
    from runner.store import ResultsStore

    here = tmp_path / "results"
    here.mkdir()
    (here / "plan.json").write_text("{}")
    monkeypatch.chdir(here)
    ResultsStore.open(Path(), fresh=True)  # what --results . and an empty path were
    (aside,) = tmp_path.glob("results.before-*")
    assert (aside / "plan.json").is_file() and not (here / "plan.json").exists()


@pytest.mark.parametrize(("results", "why"), [
    ("/", "it is the file system's root"),
    (os.fsdecode(b"/tmp/r\xff"), "the path is not UTF-8 text (its trials would fail where Ansible reads it)"),
])
def test_a_results_folder_no_run_can_use_is_bad_input(campaign: Path, results: str, why: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # Bytes the locale cannot decode reached the run as surrogates: exit 5 (and no crash log could be written).
    assert main([str(campaign), "--plan", "--results", results]) == 2
    assert _one_error(capsys) == f"--results {results}: cannot be a results folder: {why}".replace("\udcff", "\\udcff")


@pytest.mark.parametrize("argv", [["--plan", "--results", ""], ["report", ""]])
def test_an_empty_results_path_is_a_usage_error(campaign: Path, argv: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # Path('') is the working folder: a run wrote its results there, and --fresh moved the folder's files aside.
    with pytest.raises(SystemExit) as info:
        main(argv if argv[0] == "report" else [str(campaign), *argv])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("an empty path: name a folder ('.' for this one)")


@pytest.mark.parametrize("args", [["--plan"], ["--quiet"]])
def test_another_campaigns_results_folder_is_refused(campaign: Path, tmp_path: Path, args: list[str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # It ran (exit 0), replaced the other campaign's campaign.yaml and plan.json, and mixed both in one report.
    from tests.support.results_folder import make_results

    results = tmp_path / "theirs"
    make_results(tmp_path / "other", results)
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert main([str(campaign), *args, "--results", str(results)]) == 2
    assert _one_error(capsys) == (f"--results {results}: holds the results of campaign 'hostile', not 'demo': a run "
                                  "would mix the two and replace its campaign.yaml; give this run another --results, "
                                  "or add --fresh to move those results aside first")
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == before
