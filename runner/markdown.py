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
    for _, row in frame.iterrows():
        cells = ["" if pd.isna(v) else str(v).replace("|", "\\|").replace("\n", " ") for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
