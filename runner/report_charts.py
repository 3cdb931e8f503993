"""Charts for report.md (matplotlib, headless): each takes a kind's table and writes one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["startup_chart"]

_STARTUP_PHASES = (("weights_s", "weights"), ("compile_s", "torch.compile"), ("graph_capture_s", "CUDA graphs"),
                   ("kernel_jit_s", "kernel JIT + warm-up"), ("engine_other_s", "profile, KV allocation"),
                   ("other_s", "other (process, API server)"))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def startup_chart(frame: pd.DataFrame, path: Path) -> Path | None:
    """Stacked phases per trial, repeats side by side; plus wake vs start when sleep_wake ran."""
    ok = frame[(frame["status"] == "ok") & frame["first_token_s"].notna()]
    if ok.empty:
        return None
    plt = _pyplot()
    wake = ok[ok["wake_to_first_token_s"].notna()] if "wake_to_first_token_s" in ok else ok.iloc[0:0]
    fig, axes = plt.subplots(1, 2 if len(wake) else 1, figsize=(11 if len(wake) else 8, 4.5),
                             gridspec_kw={"width_ratios": [3, 1]} if len(wake) else None, squeeze=False)
    ax = axes[0][0]
    labels = [f"{m}\nr{r}" for m, r in zip(ok["mode"], ok["repeat"], strict=True)]
    bottom = pd.Series(0.0, index=ok.index)
    for column, name in _STARTUP_PHASES:
        values = pd.to_numeric(ok[column], errors="coerce").fillna(0.0).astype(float) if column in ok else bottom * 0
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = bottom + values
    ax.set_ylabel("seconds from start command")
    ax.set_title("Startup to first token, by phase")
    ax.tick_params(axis="x", labelsize=7, labelrotation=60)
    ax.legend(fontsize=7)
    if len(wake):
        ax2 = axes[0][1]
        ax2.bar(["start", "wake"], [float(wake["first_token_s"].astype(float).median()),
                                    float(wake["wake_to_first_token_s"].astype(float).median())],
                color=["tab:gray", "tab:green"])
        ax2.set_title("sleep_wake: to first token")
        ax2.set_ylabel("seconds (median of repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
