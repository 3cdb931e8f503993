"""Property-based fuzzing (hypothesis): campaign files with a wrong value at any level, and results
folders with tampered files, never reach a traceback. A campaign is refused with exit 2 and lines
that name the file (or ``--plan`` passes); ``report`` and ``--plan`` over a tampered folder exit 0 or
3 and name every file they could not use. Under two minutes on two shared cores."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.cli import main
from tests.support.results_folder import make_results

# Derandomized: CI sees the same 200 cases each run (~20 s on two cores), and a failure reproduces.
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)

BASE: dict[str, Any] = {
    "name": "fuzz", "inventory": "inventory", "remote_dir": "/tmp/fuzz-node",
    "engine": {"kind": "stand-in", "model": "/models/m", "args": {"max-model-len": 4096}, "env": {"A": "1"}},
    "defaults": {"repeats": 1, "timeout_s": 60},
    "experiments": [{"kind": "selftest", "name": "self", "modes": {"noop": {}, "sleep": {"seconds": 1}},
                     "repeats": 1, "engine_args": {"enforce-eager": True}}],
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path of ``value``, containers included."""
    yield prefix
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _paths(sub, (*prefix, i))


CAMPAIGN_PATHS = [p for p in _paths(BASE) if p]


DELETE = object()


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        base = Path(tmp)
        make_results(base, base / "results")  # the inventory and a results folder to tamper with
        yield base


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@SETTINGS
@given(edits=st.lists(st.tuples(st.sampled_from(CAMPAIGN_PATHS), values | st.just(DELETE)), min_size=1, max_size=3),
       as_json=st.booleans())
def test_a_campaign_with_any_wrong_value_is_refused_in_lines_naming_the_file(
        folder: Path, edits: list[tuple[tuple[Any, ...], Any]], as_json: bool) -> None:
    doc: Any = BASE
    for path, value in edits:
        try:
            doc = _set(doc, path, value)
        except (KeyError, IndexError, TypeError):  # an earlier edit replaced the container
            continue
    campaign = folder / "fuzz.yaml"
    campaign.write_text(json.dumps(doc) if as_json else yaml.safe_dump(doc))
    rc, _, err = _run([str(campaign), "--plan", "--results", str(folder / "plan-results")])
    assert "Traceback" not in err
    assert rc in (0, 2, 3), err
    if rc == 2:
        lines = err.strip().splitlines()
        assert lines and all(line.startswith((f"{campaign}:", "error: ", "--results ")) for line in lines), err


def _tamper(path: Path, how: str, value: Any) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "value":
        path.write_text(json.dumps(value))
    elif how == "deep":
        path.write_text("[" * 50_000 + "]" * 50_000)
    elif how == "bytes":
        path.write_bytes(json.dumps(value).encode()[: max(1, len(json.dumps(value)) // 2)] + b"\xff\x00")
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "folder":
        path.mkdir()


def _field(path: Path, key: str, value: Any) -> None:
    """Replace one key of the JSON file at ``path`` (one level down where the key names a mapping)."""
    if path.is_symlink() or not path.is_file():  # the test must not read /dev/zero either
        return
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return
    if isinstance(data, dict):
        data[key] = value
        if isinstance(data.get("trials"), list) and data["trials"]:
            data["trials"][0][key] = value
        path.write_text(json.dumps(data))


TARGETS = ["plan.json", "run.json", "hosts/localhost/facts.json", "trials/selftest.noop.r1@localhost/trial.json",
           "trials/selftest.fail.r1@localhost/trial.json", "trials", "hosts", "trials/odd", "summary.csv"]
KEYS = ["id", "status", "kind", "mode", "host", "repeat", "metrics", "engine", "params", "trials", "runs", "gpus",
        "memory", "numa", "reason", "duration_s", "git", "experiment"]


@SETTINGS
@given(changes=st.lists(st.tuples(st.sampled_from(TARGETS),
                                  st.sampled_from(["value", "deep", "bytes", "fifo", "dev-zero", "folder", "field"]),
                                  st.sampled_from(KEYS), values), min_size=1, max_size=3))
def test_report_and_plan_over_a_tampered_results_folder_never_fail(
        folder: Path, changes: list[tuple[str, str, str, Any]]) -> None:
    root = folder / "tampered"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(folder / "results", root, symlinks=True)
    for target, how, key, value in changes:
        if how == "field":
            _field(root / target, key, value)
        else:
            with contextlib.suppress(NotADirectoryError, FileExistsError):  # `trials` made a file earlier
                _tamper(root / target, how, value)
    had_plan = os.path.lexists(root / "plan.json")
    rc, _, err = _run([str(folder / "campaign.yaml"), "--plan", "--results", str(root)])
    assert "Traceback" not in err and rc == 0, err
    rc, out, err = _run(["report", str(root)])
    assert "Traceback" not in err
    if not had_plan:
        assert rc == 2 and err.strip() == f"error: {root}: not a results folder (no plan.json): run a campaign first"
        return
    if rc == 4:  # what the report writes is in the way (summary.csv a folder): one line, the documented code
        assert err.strip().startswith("error: cannot write ") and len(err.strip().splitlines()) == 1, err
        return
    assert rc == 0, err
    assert out.startswith("wrote ")
    json.loads((root / "summary.json").read_text())
