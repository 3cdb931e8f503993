"""The import-profile parser on real ``-X importtime`` output (CPython 3.11, captured here with
``python -X importtime -c 'import pandas, aiohttp, pydantic'``) and on the node's sectioned file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runner.errors import ParseError
from runner.parse.importtime import STDLIB, parse_importtime, read_importtime, top_packages

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "importtime"
PANDAS = FIXTURES / "cpython311-pandas-aiohttp-pydantic.txt"


def test_a_real_profile_adds_up_and_names_its_packages() -> None:
    (profile,) = read_importtime(PANDAS)
    assert profile.role == "unknown" and profile.pid is None and profile.skipped_lines == 0
    assert profile.modules == 769  # one line per module, CPython's header line not counted
    # The packages' own times add up to the process's whole import time (the roots' cumulative).
    assert sum(p["self_s"] for p in profile.packages.values()) == pytest.approx(profile.total_s, abs=0.01)
    assert {"pandas", "numpy", "aiohttp", "pydantic", STDLIB} <= set(profile.packages)
    pandas = profile.packages["pandas"]
    # pandas' outermost import: 2199550 us, numpy among what it pulled in (its children).
    assert pandas["cumulative_s"] == pytest.approx(2.19955, abs=1e-4)
    assert pandas["children_s"] == pytest.approx(pandas["cumulative_s"] - pandas["self_s"], abs=1e-3)
    assert profile.packages["numpy"]["cumulative_s"] < pandas["children_s"]
    top = top_packages(profile, 3)
    assert [row["package"] for row in top] == ["pandas", STDLIB, "aiohttp"]
    assert top[0]["share"] == pytest.approx(pandas["self_s"] / profile.total_s, abs=1e-3)


def test_the_nodes_sections_split_processes_and_skip_their_other_output() -> None:
    small = (FIXTURES / "cpython311-asyncio-json.txt").read_text()
    text = ("# process 101 api_server\n" + PANDAS.read_text() + "a warning a C library printed\n"
            + "# process 202 engine_core\n" + small)
    api, core = parse_importtime(text)
    assert (api.pid, api.role, core.pid, core.role) == (101, "api_server", 202, "engine_core")
    assert api.skipped_lines == 1 and core.skipped_lines == 0
    assert api.modules == 769 and core.packages[STDLIB]["modules"] > 0.9 * core.modules


def test_a_process_killed_mid_import_still_counts_what_finished() -> None:
    lines = ["import time: self [us] | cumulative | imported package",
             "import time:       100 |        100 |     vllm.a",
             "import time:       200 |        300 |   vllm.b"]  # vllm itself never finished
    (profile,) = parse_importtime("\n".join(lines))
    assert profile.modules == 2 and profile.packages["vllm"]["self_s"] == pytest.approx(0.0003)


def test_an_import_chain_thousands_deep_parses() -> None:
    depth = 5000
    lines = [f"import time:        1 | {depth - d:10d} | {'  ' * d}pkg{d}" for d in reversed(range(depth))]
    (profile,) = parse_importtime("\n".join(lines))
    assert profile.modules == depth and profile.total_s == pytest.approx(depth / 1e6)


def test_a_file_that_is_not_a_profile_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ParseError, match="not a regular file"):
        read_importtime(fifo)
    assert parse_importtime("no import lines here\n") == []
