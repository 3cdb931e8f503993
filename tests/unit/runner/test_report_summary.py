"""summary.json's text: what ``json.dumps(doc, indent=2)`` writes, byte for byte, however its
trials are encoded; and each cell as a JSON value of its own type."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from runner.report_summary import SUMMARY_JSON_FORMAT, aggregate_rows, json_value, summary_json


def _trial(i: int, **metrics: Any) -> dict[str, Any]:
    return {"trial_id": f"startup.m.r{i}@h1", "experiment": "startup", "kind": "startup", "mode": "m", "repeat": i,
            "host": "h1", "engine": "vllm", "status": "ok" if i % 3 else "failed", "reason": "", "duration_s": 60.5,
            **metrics}


TRIALS = {
    "none": [],
    "every scalar": [
        _trial(1, first_token_s=20.25, tiny=1e-300, huge=1e300, negative=-0.0, count=2**70, warm=True, gap=None),
        _trial(2, first_token_s=None, tiny=5e-324, huge=123456789.125, negative=-3.5, count=-1, warm=False, gap=None),
        _trial(3, first_token_s=7.0, note='quotes " and \\ and\nlines\t\u2028, é, 雪, \U0001f600'),
    ],
    "a row without cells": [{}],
}


@pytest.mark.parametrize("name", TRIALS)
def test_summary_json_is_json_dumps_indented_by_two(name: str) -> None:
    trials = TRIALS[name]
    aggregates = aggregate_rows(trials) if all(trials) else []
    columns = list(dict.fromkeys(c for t in trials for c in t))
    expected = json.dumps({"format": SUMMARY_JSON_FORMAT, "campaign": "démo \"x\"", "notes": ["dummy weights: none"],
                           "columns": columns, "trials": trials, "aggregates": aggregates}, indent=2) + "\n"
    assert summary_json(columns, trials, "démo \"x\"", ["**dummy weights**: none"], aggregates) == expected
    assert json.loads(expected)["trials"] == trials


def test_rows_holding_structures_are_written_as_json_dumps_writes_them() -> None:
    trials = [_trial(1, sizes=[1, 2], split={"a": 1.5})]
    expected = json.dumps({"format": SUMMARY_JSON_FORMAT, "campaign": "c", "notes": [], "columns": ["x"],
                           "trials": trials, "aggregates": aggregate_rows(trials)}, indent=2) + "\n"
    assert summary_json(["x"], trials, "c", []) == expected


@pytest.mark.parametrize(("cell", "value"), [
    (None, None), (pd.NA, None), (float("nan"), None), (math.inf, None), (np.float64("nan"), None),
    (1.5, 1.5), (np.float32(0.5), 0.5), (3, 3), (np.int64(3), 3), (True, True), (np.bool_(False), False),
    ("x", "x"), (pd.Timestamp("2026-12-03"), "2026-12-03 00:00:00"),
])
def test_a_cell_is_a_json_value_of_its_own_type(cell: object, value: object) -> None:
    out = json_value(cell)
    assert out == value and type(out) is type(value)
