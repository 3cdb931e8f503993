"""The report's own tables without pandas: ``summary.csv`` and its Markdown tables, byte for byte as
pandas wrote them (``DataFrame(rows).convert_dtypes()``, then ``to_csv`` or the frame's values as
text). Importing pandas costs ~0.5 CPU s, more than the rest of a small campaign's report, so it is
imported only for a kind's own section. ``tests/unit/runner/test_report_table.py`` holds the two to
the same bytes.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from typing import Any

from runner.markdown import markdown_rows

__all__ = ["Table", "positional"]

_INT64 = (-(2**63), 2**63)


def _gap(value: Any) -> bool:
    return value is None or (type(value) is float and math.isnan(value))


def column_text(values: list[Any], *, whole_as_int: bool = True) -> list[str | None]:
    """One column's cells as pandas shows them (None for a gap): numbers with a gap or a float are a
    float64 column (a whole number shown as an int where ``convert_dtypes`` makes the column Int64:
    ``whole_as_int``), anything else each value's ``str``."""
    present = [v for v in values if not _gap(v)]
    kinds = {type(v) for v in present}
    if kinds and kinds <= {int, float} and (float in kinds or len(present) < len(values)) and _fits(present):
        floats = [None if _gap(v) else float(v) for v in values]
        whole = whole_as_int and all(f.is_integer() and _INT64[0] <= f < _INT64[1] for f in floats if f is not None)
        return [None if f is None else str(int(f)) if whole else repr(f) for f in floats]
    return [None if _gap(v) else str(v) for v in values]


def _fits(numbers: list[Any]) -> bool:
    """Whether pandas reads these ints as one integer array (int64, or uint64 when none is negative),
    and so the column as float64 beside a gap or a float; else it keeps the column as objects."""
    ints = [v for v in numbers if type(v) is int]
    return all(_INT64[0] <= v < _INT64[1] for v in ints) or all(0 <= v < 2**64 for v in ints)


class Table:
    """Rows of values under ``columns``, each column typed as a whole (:func:`column_text`)."""

    def __init__(self, rows: list[dict[str, Any]], columns: list[str], *, whole_as_int: bool = True) -> None:
        self.columns = columns
        text = [column_text([r.get(c) for r in rows], whole_as_int=whole_as_int) for c in columns]
        self.cells: list[tuple[str | None, ...]] = list(zip(*text, strict=True)) if rows else []

    def csv(self) -> str:
        """As ``to_csv(index=False)`` writes it (the csv module, minimal quoting, a gap empty)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows(["" if c is None else c for c in row] for row in self.cells)
        return out.getvalue()

    def markdown(self, columns: list[str] | None = None,
                 where: Callable[[dict[str, str | None]], bool] | None = None) -> str:
        """The Markdown table of ``columns`` (all by default) of the rows ``where`` keeps."""
        columns = self.columns if columns is None else columns
        at = [self.columns.index(c) for c in columns]
        rows = [row for row in self.cells if where is None or where(dict(zip(self.columns, row, strict=True)))]
        return markdown_rows(columns, [[row[i] for i in at] for row in rows])


def positional(value: float, digits: int = 4) -> str:
    """``numpy.format_float_positional(value, precision=digits, unique=True, fractional=False,
    trim="-")``: the shortest digits that tell the float apart (``repr``'s) where there are at most
    ``digits`` of them, else the float's exact value rounded to ``digits`` figures; never an exponent."""
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    figures, exp = _figures(repr(abs(value)))
    if len(figures) > digits:
        figures, exp = _figures(f"{abs(value):.{digits - 1}e}")
    if not figures:
        return sign + "0"
    point = exp + len(figures)  # digits before the decimal point
    if point <= 0:
        return f"{sign}0.{'0' * -point}{figures}"
    if point >= len(figures):
        return sign + figures + "0" * (point - len(figures))
    return f"{sign}{figures[:point]}.{figures[point:]}"


def _figures(text: str) -> tuple[str, int]:
    """A non-negative decimal's significant figures and the power of ten of the last one."""
    mantissa, _, exp = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    figures = (whole + fraction).lstrip("0")
    power = (int(exp) if exp else 0) - len(fraction)
    stripped = figures.rstrip("0")
    return stripped, power + len(figures) - len(stripped)
