"""The report's tables without pandas (runner/report_table.py) against pandas itself: the same CSV
and Markdown bytes for any rows a trial record can give (JSON values: None, bool, int, float, str),
and numpy's positional float format for the per-mode cells. A report whose kinds have no section of
their own never imports pandas."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runner.markdown import markdown_table
from runner.report_table import Table, positional

REPO = Path(__file__).resolve().parents[3]

_TEXT = st.text(alphabet=st.sampled_from(list("ab1.,|\"'\n\r -")), max_size=6)
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-0.0, 1e20, 2.0**63, 1e16, 0.5]))
_INTS = st.one_of(st.integers(-(2**53), 2**53), st.sampled_from([2**63, 2**64 + 1, -(2**63) - 1, 2**53 + 1]))
_VALUE = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT)
# A column keeps to one kind of value, or mixes them, as metrics do (a bool beside a number, a gap).
_COLUMN = st.one_of(st.lists(_VALUE), st.lists(st.one_of(st.none(), _INTS)), st.lists(st.one_of(st.none(), _FLOATS)),
                    st.lists(st.one_of(_INTS, _FLOATS)), st.lists(st.one_of(st.none(), st.booleans())))


@st.composite
def _rows(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[str]]:
    n = draw(st.integers(1, 5))
    columns = {f"m{i}": draw(_COLUMN) for i in range(draw(st.integers(0, 4)))}
    rows: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"trial_id": f"t{i}"}  # like the summary and the hosts table: one text column
        for name, values in columns.items():
            if i < len(values):  # past its values a column has no key in the row: a gap, as in a record
                row[name] = values[i]
        rows.append(row)
    return rows, list(dict.fromkeys(c for row in rows for c in row))


@settings(max_examples=300, deadline=None)
@given(_rows())
def test_the_summary_table_is_pandas_convert_dtypes_to_the_byte(case: tuple[list[dict[str, Any]], list[str]]) -> None:
    rows, columns = case
    frame = pd.DataFrame(rows)[columns].convert_dtypes()
    table = Table(rows, columns)
    assert table.csv() == frame.to_csv(index=False)
    assert table.markdown() == markdown_table(frame)
    assert table.markdown(columns[:1], where=lambda row: row["trial_id"] != "t0") == markdown_table(
        frame[frame["trial_id"] != "t0"][columns[:1]])


@settings(max_examples=300, deadline=None)
@given(_rows())
def test_a_plain_table_is_a_plain_pandas_frame(case: tuple[list[dict[str, Any]], list[str]]) -> None:
    rows, columns = case
    assert Table(rows, columns, whole_as_int=False).markdown() == markdown_table(pd.DataFrame(rows)[columns])


def _numpy(value: float) -> str:
    return np.format_float_positional(value, precision=4, unique=True, fractional=False, trim="-")


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
@example(1.0625)  # a tie at the fifth digit: half to even
@example(1.0635)
@example(999.95)
@example(0.00012345)
@example(-0.0)
@example(5e-324)
@example(123.45)
def test_positional_is_numpys(value: float) -> None:
    assert positional(value) == _numpy(value)


def test_positional_keeps_what_tells_a_float_apart_up_to_four_figures() -> None:
    assert [positional(v) for v in (0.1, 1.0, 12.5, 0.000123456, -3.14159, math.inf)] == [
        "0.1", "1", "12.5", "0.0001235", "-3.142", "inf"]


def test_a_report_without_a_kind_section_imports_no_pandas(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "trials" / "selftest.noop.r1@h1").mkdir(parents=True)
    trial = {"id": "selftest.noop.r1@h1", "experiment": "selftest", "kind": "selftest", "mode": "noop", "repeat": 1,
             "host": "h1"}
    (root / "plan.json").write_text(json.dumps({"campaign": "c", "trials": [trial]}))
    (root / "trials" / "selftest.noop.r1@h1" / "trial.json").write_text(json.dumps({
        **trial, "status": "ok", "reason": "", "duration_s": 1.5, "metrics": {"x": 2}, "phases": []}))
    code = ("import sys; from pathlib import Path; from runner.report import build_report; "
            f"build_report(Path({str(root)!r})); print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert "| selftest.noop.r1@h1 | selftest | selftest | noop | 1 | h1 | none | ok | 1.5 |" in (
        root / "report.md").read_text()
