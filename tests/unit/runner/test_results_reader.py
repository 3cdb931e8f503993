"""Tampered results folders: every file is read as a bounded regular file inside the folder, and
one that cannot be used is reported and moved to quarantine/, never fatal to report or a resume."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main
from runner.plan import Plan
from runner.results_reader import LIMITS, ResultsReader, shape_problem
from runner.store import ResultsStore
from tests.support.results_folder import make_results

NOOP = "selftest.noop.r1@localhost"
TRIAL = f"trials/{NOOP}/trial.json"
FACTS = "hosts/localhost/facts.json"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:57])


def _deep(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _deep_mapping(path: Path) -> None:
    path.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _outside(path: Path) -> None:
    # Root reads anything: a link to a file outside the folder stands for one the user may not read.
    secret = path.parents[3] / "secret.json"  # beside the results folder
    secret.write_text(path.read_text())
    path.unlink()
    path.symlink_to(secret)


def _wrong_types(path: Path) -> None:
    data = json.loads(path.read_text())
    data.update({"status": ["ok"], "metrics": "fast", "gpus": 3, "memory": [1]})
    path.write_text(json.dumps(data))


def _non_utf8(path: Path) -> None:
    path.write_bytes(b'{"id": "caf\xe9"}')


def _lone_surrogate(path: Path) -> None:
    # Valid JSON and valid UTF-8, but half a UTF-16 pair: summary.csv could not be written (a traceback).
    record = json.loads(path.read_text())
    record["reason"] = "\ud800"
    record.setdefault("metrics", {})["\udcff"] = 1
    path.write_text(json.dumps(record))


def _huge(path: Path) -> None:
    with path.open("wb") as fh:
        fh.truncate(LIMITS["json_bytes"] + 1)  # sparse: nothing to write, only its size counts


TAMPERED: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "is not valid JSON"),
    "empty": (lambda p: p.write_text(""), "is empty"),
    "a list": (lambda p: p.write_text("[1, 2]"), "has the wrong shape: the top level is a list, not a mapping"),
    "wrong types": (_wrong_types, "has the wrong shape"),
    "non-UTF-8": (_non_utf8, "is not UTF-8 text (byte 0xe9"),
    "100,000 deep": (_deep, "nests deeper than 64 levels"),
    "deep mapping": (_deep_mapping, "nests deeper than 64 levels"),
    "a FIFO": (_fifo, "is a FIFO, not a regular file"),
    "a link to /dev/zero": (_dev_zero, "is a symbolic link"),
    "a link outside": (_outside, "is a symbolic link"),
    "over the size limit": (_huge, "is 67108865 bytes: over the 67108864-byte limit"),
    "a lone surrogate": (_lone_surrogate, "holds a \\ud800-\\udfff escape that is no pair"),
}


@pytest.fixture
def results(tmp_path: Path) -> tuple[Path, Path, Plan]:
    root = tmp_path / "results"
    campaign, plan = make_results(tmp_path, root)
    return campaign, root, plan


def _report(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    started = time.monotonic()
    assert main(["report", str(root)]) == 0
    assert time.monotonic() - started < 20
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out, captured.err


@pytest.mark.parametrize("how", list(TAMPERED))
def test_a_tampered_trial_json_is_moved_aside_and_the_report_goes_on(
        results: tuple[Path, Path, Plan], how: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, root, plan = results
    tamper, expected = TAMPERED[how]
    tamper(root / TRIAL)
    out, _ = _report(root, capsys)
    assert out.startswith(f"wrote {root / 'summary.csv'}")
    rows = {t["trial_id"]: t for t in json.loads((root / "summary.json").read_text())["trials"]}
    assert rows[NOOP]["status"] == "pending"  # the other trials are as they were
    assert rows["selftest.sleep.r1@localhost"]["status"] == "ok"
    assert os.path.lexists(root / "quarantine" / TRIAL) and not os.path.lexists(root / TRIAL)
    report = (root / "report.md").read_text()
    assert "## Files that could not be used" in report
    assert f"`{TRIAL}: {expected}" in report
    # A resume runs it again.
    store = ResultsStore.open(root)
    (trial,) = [t for t in plan.trials if t.id == NOOP]
    assert store.decide(trial, retry_failed=False) == (True, "new")


@pytest.mark.parametrize("how", ["truncated", "a list", "wrong types", "100,000 deep", "deep mapping", "a FIFO",
                                 "a link to /dev/zero", "a link outside"])
def test_a_tampered_facts_json_neither_hangs_plan_nor_report(results: tuple[Path, Path, Plan], how: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    campaign, root, _ = results
    TAMPERED[how][0](root / FACTS)
    started = time.monotonic()
    assert main([str(campaign), "--plan", "--results", str(root)]) == 0  # a FIFO hung here; /dev/zero ate 23 GB
    assert time.monotonic() - started < 20
    assert os.path.lexists(root / FACTS)  # --plan only reads
    assert "Traceback" not in capsys.readouterr().err
    _report(root, capsys)
    assert "| localhost |" not in (root / "report.md").read_text().split("## Hosts")[1].split("##")[0]
    assert os.path.lexists(root / "quarantine" / FACTS)


@pytest.mark.parametrize("name", ["run.json", "plan.json"])
@pytest.mark.parametrize("how", ["truncated", "empty", "a list", "non-UTF-8", "100,000 deep", "a FIFO"])
def test_a_tampered_run_or_plan_json_leaves_the_trials_reported(results: tuple[Path, Path, Plan], name: str,
                                                                how: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, root, _ = results
    TAMPERED[how][0](root / name)
    _report(root, capsys)
    statuses = sorted(t["status"] for t in json.loads((root / "summary.json").read_text())["trials"])
    assert statuses == ["failed", "ok", "ok"]
    assert os.path.lexists(root / "quarantine" / name)
    store = ResultsStore.open(root)
    assert store.read_run() is None or name == "plan.json"


def test_plan_json_with_wrong_types_is_moved_aside(results: tuple[Path, Path, Plan],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, root, _ = results
    plan = json.loads((root / "plan.json").read_text())
    plan["trials"][0]["experiment"] = 1
    (root / "plan.json").write_text(json.dumps(plan))
    _report(root, capsys)
    assert "plan.json: has the wrong shape: trials[0].experiment is an integer, not text" in \
        (root / "report.md").read_text()


@pytest.mark.parametrize("folder", ["trials", "hosts"])
def test_a_folder_replaced_by_a_file_is_moved_aside(results: tuple[Path, Path, Plan], folder: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _, root, plan = results
    (root / folder).rename(root.parent / "moved")
    (root / folder).write_text("not a folder\n")
    _report(root, capsys)
    assert (root / "quarantine" / folder).read_text() == "not a folder\n"
    (root / folder).write_text("again\n")
    store = ResultsStore.open(root)  # a resume: what is in the way goes aside, and the run makes the folder
    assert (root / "quarantine" / f"{folder}.1").read_text() == "again\n"
    store.begin_trial(plan.trials[0].id)
    assert (root / "trials" / plan.trials[0].id).is_dir()


def test_a_trial_folder_that_links_outside_is_never_followed(results: tuple[Path, Path, Plan], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, root, plan = results
    outside = tmp_path / "elsewhere"
    (root / "trials" / NOOP).rename(outside)
    (root / "trials" / NOOP).symlink_to(outside)
    _report(root, capsys)
    assert (outside / "trial.json").is_file()  # nothing outside the folder is moved
    store = ResultsStore.open(root)
    (trial,) = [t for t in plan.trials if t.id == NOOP]
    assert store.decide(trial, retry_failed=False) == (True, "new")
    assert "lies outside the results folder" in store.problems[0]


def test_a_trial_json_naming_another_folder_is_not_used(results: tuple[Path, Path, Plan],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, root, _ = results
    data = json.loads((root / TRIAL).read_text())
    (root / TRIAL).write_text(json.dumps({**data, "id": "../../../etc"}))
    _report(root, capsys)
    assert "id is '../../../etc', not its folder's name" in (root / "report.md").read_text()


def test_a_read_only_folder_is_reported_without_moving(results: tuple[Path, Path, Plan]) -> None:
    _, root, _ = results
    (root / TRIAL).write_text("")
    reader = ResultsReader(root, quarantine=False)
    assert reader.json(TRIAL) is None
    assert reader.problems == [f"{TRIAL}: is empty"]
    assert (root / TRIAL).exists()


@pytest.mark.parametrize(("value", "shape", "expected"), [
    ({"a": True}, {"a": int}, "a is true/false, not an integer"),
    ({"a": [1, "x"]}, {"a": [int]}, "a[1] is text, not an integer"),
    ({"b": 1}, {"a!": str}, "a is missing or null"),
    ({"a": None}, {"a": {"b": str}}, None),
    ([], {"a": str}, "the top level is a list, not a mapping"),
])
def test_shapes_name_the_key_path(value: object, shape: dict[str, object], expected: str | None) -> None:
    assert shape_problem(value, shape) == expected


def _nested(height: int) -> object:
    """Mappings and lists in turn, each beside shallower siblings, ``height`` containers deep."""
    value: object = {}
    for level in range(height - 1):
        value = [value, "x", {}] if level % 2 else {"a": value, "b": [], "c": 1}
    return value


@pytest.mark.parametrize(("height", "used"), [(LIMITS["depth"], True), (LIMITS["depth"] + 1, False)])
def test_nesting_is_read_up_to_the_limit_and_refused_past_it(tmp_path: Path, height: int, used: bool) -> None:
    (tmp_path / "deep.json").write_text(json.dumps(_nested(height)))
    reader = ResultsReader(tmp_path, quarantine=False)
    assert (reader.json("deep.json") is not None) is used
    assert reader.problems == ([] if used else [f"deep.json: nests deeper than {LIMITS['depth']} levels"])
