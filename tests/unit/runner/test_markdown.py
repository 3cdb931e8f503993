"""Markdown tables: every cell as the frame's rows hold it, a gap empty, a pipe or a newline kept
from breaking the table."""

from __future__ import annotations

import pandas as pd
import pytest

from runner.markdown import markdown_table


def _row_by_row(frame: pd.DataFrame) -> str:
    """The table as it was first written: one ``iterrows`` Series a row, ``pd.isna`` a cell."""
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join("" if pd.isna(v) else str(v).replace("|", "\\|").replace("\n", " ")
                                       for v in row) + " |")
    return "\n".join(lines) + "\n"


FRAMES = {
    "trials, nullable dtypes": pd.DataFrame([
        {"mode": "disk_cold", "repeat": 1, "first_token_s": 20.5, "ok": True, "why": "a | b\nc"},
        {"mode": "disk_cold", "repeat": 2, "first_token_s": None, "ok": None, "why": None},
        {"mode": "first_start", "repeat": None, "first_token_s": float("nan"), "ok": False, "why": ""},
    ]).convert_dtypes(),
    # One dtype for every column: a row is a float64 Series, so its integers read 3.0.
    "numbers only": pd.DataFrame({"n": [3, 4], "median": [1.25, float("nan")]}),
    "integers only": pd.DataFrame({"n": [3, 4], "m": [5, 6]}),
    "objects": pd.DataFrame({"a": ["x", None, pd.NA], "b": [1, 2.5, None]}, dtype=object),
    "nullable numbers only": pd.DataFrame({"n": [250, None], "s": [0.5, 2.0]}).convert_dtypes(),
}


@pytest.mark.parametrize("name", FRAMES)
def test_every_cell_reads_as_the_rows_hold_it(name: str) -> None:
    assert markdown_table(FRAMES[name]) == _row_by_row(FRAMES[name])


def test_gaps_are_empty_and_pipes_and_newlines_cannot_break_a_row() -> None:
    lines = markdown_table(FRAMES["trials, nullable dtypes"]).splitlines()
    assert lines[0] == "| mode | repeat | first_token_s | ok | why |"
    assert lines[2] == "| disk_cold | 1 | 20.5 | True | a \\| b c |"
    assert lines[3] == "| disk_cold | 2 |  |  |  |"
    assert markdown_table(pd.DataFrame()) == "_none_\n"
