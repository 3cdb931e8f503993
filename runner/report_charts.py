"""Charts for report.md (matplotlib, headless): each takes a kind's table and writes one PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["offload_ttft_chart", "offload_turn_wall_chart", "startup_chart"]

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


def _offload_lines(turns: pd.DataFrame, column: str, path: Path, ylabel: str, title: str,
                   band: str | None = None) -> Path | None:
    """One line per trial over the turns (repeats apart: read them side by side, not averaged);
    a trial that stopped early is dashed and labelled so."""
    if turns.empty or column not in turns:
        return None
    data = turns[turns[column].notna()]
    if data.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (_trial, mode, repeat, status), rows in data.groupby(["trial_id", "mode", "repeat", "status"], sort=False):
        group = rows.sort_values("turn")
        x = group["turn"].astype(int)
        y = group[column].astype(float)
        label = f"{mode} r{repeat}" + (" (stopped early)" if status != "ok" else "")
        line = ax.plot(x, y, marker="o", linestyle="-" if status == "ok" else "--", label=label)[0]
        if band is not None and band in group:
            ax.fill_between(x, y, group[band].astype(float), color=line.get_color(), alpha=0.15)
    ax.set_xlabel("turn (0 = first visit, cold in every mode)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(sorted(int(t) for t in data["turn"].unique()))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def offload_ttft_chart(turns: pd.DataFrame, path: Path) -> Path | None:
    """Median time to first token per turn and mode, the band up to the p90."""
    return _offload_lines(turns, "ttft_median_s", path, "seconds to first token (median; band to p90)",
                          "Offload: TTFT per turn", band="ttft_p90_s")


def offload_turn_wall_chart(turns: pd.DataFrame, path: Path) -> Path | None:
    """Wall time of each whole turn (all sessions, behind the barrier) per mode."""
    return _offload_lines(turns, "turn_wall_s", path, "seconds per turn (all sessions)",
                          "Offload: turn wall time")
