"""Markdown rendering shared by the report and the experiment kinds' sections."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["markdown_table"]


def markdown_table(frame: pd.DataFrame) -> str:
    import pandas as pd  # noqa: PLC0415 - loaded already when there is a frame; costs ~1 s otherwise

    if frame.empty:
        return "_none_\n"
    cols = list(frame.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    # The rows as iterrows gives them (the frame's values in their common dtype), read in one go:
    # a Series and an isna call per cell took seconds for a table of 10,000 trials.
    values = frame.to_numpy()
    for row, gaps in zip(values.tolist(), pd.isna(values).tolist(), strict=True):
        cells = ["" if gap else str(v).replace("|", "\\|").replace("\n", " ") for v, gap in zip(row, gaps, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
