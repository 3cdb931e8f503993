"""Markdown rendering shared by the report and the experiment kinds' sections."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["markdown_rows", "markdown_table"]


def markdown_table(frame: pd.DataFrame) -> str:
    import pandas as pd  # noqa: PLC0415 - loaded already when there is a frame; costs ~1 s otherwise

    if frame.empty:
        return "_none_\n"
    # The rows as iterrows gives them (the frame's values in their common dtype), read in one go:
    # a Series and an isna call per cell took seconds for a table of 10,000 trials.
    values = frame.to_numpy()
    rows = [[None if gap else str(v) for v, gap in zip(row, gaps, strict=True)]
            for row, gaps in zip(values.tolist(), pd.isna(values).tolist(), strict=True)]
    return markdown_rows(list(frame.columns), rows)


def markdown_rows(columns: list[str], rows: list[list[str | None]]) -> str:
    """A table of text cells (None: a gap, shown empty); ``_none_`` when there is no row or column."""
    if not rows or not columns:
        return "_none_\n"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = ["" if v is None else v.replace("|", "\\|").replace("\n", " ") for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
