"""Charts for report.md (matplotlib, headless): each takes a kind's table and writes one PNG.

A chart can travel without its report, so each one says on its face what it measured: when the
engine was the stand-in, or the model had random (or dummy) weights, a subtitle says so, and the
PNG's ``Title``/``Description`` metadata carry the same words. Which trials those were comes from
the table's ``engine``/``rehearsal_model`` columns where it has them, else from each plotted
trial's ``trials/<trial_id>/trial.json`` in the results folder the chart is written to.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from runner.results_reader import ResultsReader

__all__ = ["IMPORTS_TITLE", "MAX_TRIAL_BARS", "STARTUP_PHASES", "STARTUP_TITLE", "engine_note", "import_bars",
           "imports_chart", "offload_figure", "offload_ttft_chart", "offload_turn_wall_chart", "startup_chart",
           "startup_figure", "startup_title", "trial_engine"]

STARTUP_TITLE = "Startup to first token, by phase"
MAX_TRIAL_BARS = 60  # one bar per trial up to this many; above it, medians per mode (and host)
# The startup timeline's phases in the order a start passes them (runner.parse.startup_timeline), bottom up.
STARTUP_PHASES = (("api_imports_s", "API server imports"), ("config_s", "config, model inspection"),
                  ("engine_spawn_s", "EngineCore spawn"), ("engine_imports_s", "EngineCore imports"),
                  ("device_init_s", "device, workers"), ("weights_s", "weights"), ("compile_s", "torch.compile"),
                  ("kv_profile_s", "profile, KV allocation"), ("graph_capture_s", "CUDA graphs"),
                  ("kernel_jit_s", "kernel JIT + warm-up"), ("api_ready_s", "API server ready"),
                  ("first_request_s", "first request"), ("other_s", "other (between named boundaries)"))


def _pyplot() -> Any:
    import matplotlib  # noqa: PLC0415 - ~0.5 s: only when a chart is drawn

    matplotlib.use("Agg")  # headless: before pyplot is imported
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after the backend is chosen

    return plt


# --- what the engine was -------------------------------------------------------------------------

def trial_engine(record: Mapping[str, Any]) -> dict[str, str]:
    """From a trial record: ``engine`` (its label: vllm, stand-in, none), ``rehearsal_model`` (the
    model maker's preset: random weights) and ``load_format`` (``dummy``: vLLM's random weights)."""
    engine = record.get("engine") or {}
    recipe = (record.get("params") or {}).get("recipe") or {}
    args = {**(engine.get("args") or {}), **(recipe.get("args") or {})}
    load_format = args.get("load-format") or args.get("load_format") or ""
    return {"engine": str(record.get("engine_label") or engine.get("kind") or "none"),
            "rehearsal_model": str(engine.get("rehearsal_model") or ""), "load_format": str(load_format)}


def _plotted_engines(frame: pd.DataFrame, root: Path) -> list[dict[str, str]]:
    """One entry per plotted trial: from the table's columns, else from the trial's record."""
    if "engine" in frame.columns or "engine_label" in frame.columns:  # by column: a dict a row took ~1 s for 10,000
        texts = [_texts(frame, c) for c in ("engine" if "engine" in frame.columns else "engine_label",
                                            "rehearsal_model", "load_format")]
        return [{"engine": e, "rehearsal_model": r, "load_format": f} for e, r, f in zip(*texts, strict=True)]
    ids: Iterable[Any] = dict.fromkeys(frame["trial_id"]) if "trial_id" in frame.columns else ()
    out = []
    reader = ResultsReader(root, quarantine=False)  # bounded, regular files inside the folder only
    for trial_id in ids:
        record = reader.json(Path("trials") / str(trial_id) / "trial.json", dict)
        if record is not None:
            out.append(trial_engine(record))
    return out


def _texts(frame: pd.DataFrame, column: str) -> list[str]:
    """The column's cells as text, "" for a gap or where the frame has no such column."""
    if column not in frame.columns:
        return [""] * len(frame)
    return ["" if gap else str(v) for v, gap in zip(frame[column].tolist(), frame[column].isna().tolist(),
                                                     strict=True)]


def engine_note(frame: pd.DataFrame, root: Path) -> str:
    """The chart's warning, or "": "stand-in engine", "random weights", "dummy weights"."""
    engines = _plotted_engines(frame, root)
    if not engines:
        return ""
    real = [e for e in engines if e["engine"] != "stand-in"]
    random_weights = [e for e in real if e["rehearsal_model"]]
    presets = ", ".join(sorted({e["rehearsal_model"] for e in random_weights}))
    found = (
        (len(engines) - len(real), "stand-in engine: a rehearsal of the tooling, these timings say nothing about vLLM"),
        (len(random_weights), f"random weights ({presets}): real engine timings, meaningless answers"),
        (sum(e["load_format"] == "dummy" for e in real),  # a config-only preset is both: random AND never read
         "dummy weights (--load-format dummy): no weights read from disk"),
    )
    notes = [text if hits == len(engines) else f"{hits} of {len(engines)} trials: {text}"
             for hits, text in found if hits]
    return "; ".join(notes)


def _subtitle(fig: Any, note: str) -> None:
    """The warning above every panel, in red; then the layout, which makes room for it."""
    if note:
        fig.suptitle(textwrap.fill(note, 110), color="tab:red", fontsize=9, fontweight="bold")
    fig.tight_layout()


def _save(plt: Any, fig: Any, path: Path, title: str, note: str) -> Path:
    """Save the figure (matplotlib's plain ``open()``, so the umask decides the mode; to a temporary
    name, then a rename, so a reader never sees half a PNG) with its title and warning as PNG
    metadata, and close it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=110,
                    metadata={"Title": f"{title} ({note})" if note else title, "Description": note or title})
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path


# --- startup -------------------------------------------------------------------------------------

def _trial_labels(frame: pd.DataFrame) -> list[str]:
    """``mode`` and repeat per bar; the host (then the trial id) joins in where those repeat."""
    labels = [f"{m}\nr{r}" for m, r in zip(frame["mode"], frame["repeat"], strict=True)]
    if len(set(labels)) < len(labels) and "host" in frame.columns:
        labels = [f"{lab}@{h}" for lab, h in zip(labels, frame["host"], strict=True)]
    if len(set(labels)) < len(labels) and "trial_id" in frame.columns:
        labels = [str(t) for t in frame["trial_id"]]
    return labels


def _bar_positions(modes: list[str]) -> list[float]:
    """One bar per trial in table order, a gap where the mode changes: repeats of a mode stand together."""
    out: list[float] = []
    x = 0.0
    for i, mode in enumerate(modes):
        if i and mode != modes[i - 1]:
            x += 0.6
        out.append(x)
        x += 1.0
    return out


def _resolution_label(ok: pd.DataFrame) -> str:
    if "timeline_resolution_s" not in ok:
        return "trial (mode, repeat)"
    values = sorted({float(v) for v in pd.to_numeric(ok["timeline_resolution_s"], errors="coerce").dropna()})
    if not values:
        return "trial (mode, repeat)"
    shown = " / ".join(f"{v:g} s" for v in values)
    return f"trial (mode, repeat); phase boundaries to {shown}" + (
        " (whole-second log stamps)" if 1.0 in values else "")


def startup_title(trials: int) -> str:
    """The startup chart's title for ``trials`` ok trials: one bar each, or, above
    ``MAX_TRIAL_BARS``, one bar per mode (and host) made of medians, as the title says."""
    if trials <= MAX_TRIAL_BARS:
        return STARTUP_TITLE
    return f"{STARTUP_TITLE}: medians of {trials:,} trials per mode (one bar per trial up to {MAX_TRIAL_BARS})"


def _numeric(column: pd.Series) -> pd.Series:
    return pd.to_numeric(column, errors="coerce").astype(float)


def _stack(plt: Any, ax: Any, x: list[float], table: pd.DataFrame) -> None:
    """The timeline's phases stacked per bar (a row of ``table``), bottom up; a phase no bar has
    stays out of the legend."""
    colours = plt.get_cmap("tab20").colors
    bottom = pd.Series(0.0, index=table.index)
    for i, (column, name) in enumerate(STARTUP_PHASES):
        if column not in table:
            continue
        values = _numeric(table[column]).fillna(0.0)
        if not values.any():
            continue
        colour = "lightgray" if column == "other_s" else colours[i % len(colours)]
        ax.bar(x, values, bottom=bottom, label=name, color=colour, edgecolor="white", linewidth=0.3)
        bottom = bottom + values


def _group_keys(ok: pd.DataFrame) -> list[str]:
    """One bar per mode and host where the hosts are several and the bars stay few, else per mode."""
    if "host" in ok and ok["host"].nunique() > 1 and len(ok.groupby(["mode", "host"])) <= MAX_TRIAL_BARS:
        return ["mode", "host"]
    return ["mode"]


def _medians(ok: pd.DataFrame, columns: list[str], keys: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Per group (in table order): each column's median, ``n``, and the first token's 10th and 90th
    percentiles; and each group's bar label."""
    numbers = ok[keys].assign(**{c: _numeric(ok[c]) for c in columns if c in ok})
    grouped = numbers.groupby(keys, sort=False)
    table = grouped.median()
    table["n"] = grouped.size()
    for name, q in (("p10", 0.1), ("p90", 0.9)):
        table[name] = grouped["first_token_s"].quantile(q)
    # A mode's bars together, modes in table order (a group's first row decides: hosts come innermost).
    rank = {mode: i for i, mode in enumerate(dict.fromkeys(ok["mode"]))}
    modes = table.index.get_level_values("mode")
    table = table.iloc[sorted(range(len(table)), key=lambda i: rank[modes[i]])]  # stable: hosts keep their order
    labels = [f"{k[0] if isinstance(k, tuple) else k}" + (f"@{k[1]}" if len(keys) > 1 else "") + f" (n={n})"
              for k, n in zip(table.index, table["n"], strict=True)]
    return table.reset_index(), labels


def startup_figure(frame: pd.DataFrame, note: str = "") -> Any | None:
    """The startup figure, subtitled with ``note`` (not saved): the timeline's phases stacked per
    trial, repeats side by side; and where sleep_wake ran, a panel of its own on a log scale with
    every repeat's start and wake. Above ``MAX_TRIAL_BARS`` ok trials (10,000 bars took 150 s and
    1.5 GiB to draw, and no one reads them) one bar per mode (and host): each phase's median,
    stacked, with the first token's median and its 10th-90th percentile over it (a stack of
    medians need not add up to the median start); the title says so."""
    ok = frame[(frame["status"] == "ok") & frame["first_token_s"].notna()]
    if ok.empty:
        return None
    plt = _pyplot()
    wake = ok[ok["wake_to_first_token_s"].notna()] if "wake_to_first_token_s" in ok else ok.iloc[0:0]
    fig, axes = plt.subplots(1, 2 if len(wake) else 1, figsize=(14 if len(wake) else 9.5, 5.2),
                             gridspec_kw={"width_ratios": [3, 1.3]} if len(wake) else None, squeeze=False)
    ax = axes[0][0]
    if len(ok) <= MAX_TRIAL_BARS:
        x = _bar_positions([str(m) for m in ok["mode"]])
        _stack(plt, ax, x, ok)
        ax.set_xticks(x, _trial_labels(ok))
        ax.set_xlabel(_resolution_label(ok), fontsize=8)
    else:
        keys = _group_keys(ok)
        table, labels = _medians(ok, ["first_token_s", *(c for c, _ in STARTUP_PHASES)], keys)
        x = _bar_positions([str(m) for m in table["mode"]])
        _stack(plt, ax, x, table)
        ax.errorbar(x, table["first_token_s"], yerr=[table["first_token_s"] - table["p10"],
                                                     table["p90"] - table["first_token_s"]],
                    fmt="o", color="black", markersize=3, capsize=3, label="first token: median, p10-p90")
        ax.set_xticks(x, labels)
        ax.set_xlabel(f"{' and '.join(keys)} (n: ok trials); bars: each phase's median, stacked", fontsize=8)
    ax.set_ylabel("seconds from start command")
    ax.set_title(startup_title(len(ok)), fontsize=10 if len(ok) > MAX_TRIAL_BARS else None)
    ax.tick_params(axis="x", labelsize=7, labelrotation=60)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # top phase first
    if len(wake):
        _wake_panel(axes[0][1], wake)
    _subtitle(fig, note)
    return fig


def _wake_panel(ax: Any, wake: pd.DataFrame) -> None:
    """Every sleep_wake repeat: its cold start and its wake, side by side, on a log scale (a wake
    of 0.2 s next to a start of 60 s would be an invisible sliver on a linear one); above
    ``MAX_TRIAL_BARS`` repeats, their medians per mode (and host) with the 10th-90th percentile."""
    if len(wake) <= MAX_TRIAL_BARS:
        starts = wake["first_token_s"].astype(float).tolist()
        wakes = wake["wake_to_first_token_s"].astype(float).tolist()
        labels = [lab.replace("\n", " ").removeprefix("sleep_wake ") for lab in _trial_labels(wake)]
        spread: tuple[Any, Any] = (None, None)
        title = "sleep_wake: start vs wake, every repeat"
    else:
        keys = _group_keys(wake)
        table, labels = _medians(wake, ["first_token_s", "wake_to_first_token_s"], keys)
        starts, wakes = table["first_token_s"].tolist(), table["wake_to_first_token_s"].tolist()
        grouped = wake.assign(w=_numeric(wake["wake_to_first_token_s"])).groupby(keys, sort=False)["w"]
        spread = ([table["first_token_s"] - table["p10"], table["p90"] - table["first_token_s"]],
                  [table["wake_to_first_token_s"] - grouped.quantile(0.1).to_numpy(),
                   grouped.quantile(0.9).to_numpy() - table["wake_to_first_token_s"]])
        title = f"sleep_wake: start vs wake, medians of {len(wake):,} repeats"
    x = list(range(len(starts)))
    width = 0.38
    bars_start = ax.bar([i - width / 2 for i in x], starts, width, color="tab:gray", label="start to first token",
                        yerr=spread[0], capsize=2)
    bars_wake = ax.bar([i + width / 2 for i in x], wakes, width, color="tab:green", label="wake to first token",
                       yerr=spread[1], capsize=2)
    ax.set_yscale("log")
    positive = [v for v in starts + wakes if v > 0]
    if positive:
        ax.set_ylim(min(positive) / 3, max(positive) * 4)
    for bars in (bars_start, bars_wake):
        ax.bar_label(bars, fmt="%.3g s", fontsize=7, padding=2)
    ax.set_xticks(x, labels)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title)
    ax.set_ylabel("seconds to first token (log scale)")
    ax.legend(fontsize=7, loc="upper right")


def startup_chart(frame: pd.DataFrame, path: Path) -> Path | None:
    """Write :func:`startup_figure` to ``path``, subtitled when the engine or weights were not real."""
    ok = frame[frame["status"] == "ok"]
    note = engine_note(ok, path.parent)
    fig = startup_figure(frame, note)
    if fig is None:
        return None
    return _save(_pyplot(), fig, path, startup_title(int(ok["first_token_s"].notna().sum())), note)


# --- offload -------------------------------------------------------------------------------------

def offload_figure(turns: pd.DataFrame, column: str, ylabel: str, title: str, band: str | None = None,
                   note: str = "") -> Any | None:
    """Subtitled with ``note``: one line per trial over the turns (repeats apart: read them side by side, not averaged);
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
    _subtitle(fig, note)
    return fig


def _offload_lines(turns: pd.DataFrame, column: str, path: Path, ylabel: str, title: str,
                   band: str | None = None) -> Path | None:
    note = engine_note(turns[turns[column].notna()], path.parent) if column in turns else ""
    fig = offload_figure(turns, column, ylabel, title, band, note)
    if fig is None:
        return None
    return _save(_pyplot(), fig, path, title, note)


def offload_ttft_chart(turns: pd.DataFrame, path: Path) -> Path | None:
    """Median time to first token per turn and mode, the band up to the p90."""
    return _offload_lines(turns, "ttft_median_s", path, "seconds to first token (median; band to p90)",
                          "Offload: TTFT per turn", band="ttft_p90_s")


def offload_turn_wall_chart(turns: pd.DataFrame, path: Path) -> Path | None:
    """Wall time of each whole turn (all sessions, behind the barrier) per mode."""
    return _offload_lines(turns, "turn_wall_s", path, "seconds per turn (all sessions)",
                          "Offload: turn wall time")


# --- startup imports -----------------------------------------------------------------------------

IMPORTS_TITLE = "Import seconds of each start, by package"
_IMPORT_PACKAGES_SHOWN = 8  # the costliest over all plotted trials; the rest together
_IMPORT_BARS = 40  # more trials than this: one bar per mode (the mean of its repeats)


def imports_chart(bars: list[dict[str, Any]], path: Path, note: str = "") -> Path | None:
    """Horizontal bars, one per trial (or per mode) and process, each its import window split into
    the packages whose own modules took the seconds, the other packages, and what the profile does
    not name. ``bars``: ``label``, ``seconds`` (the window) and ``packages`` (name -> seconds)."""
    bars = [b for b in bars if b.get("seconds")]
    if not bars:
        return None
    totals: dict[str, float] = {}
    for bar in bars:
        for name, seconds in bar["packages"].items():
            totals[name] = totals.get(name, 0.0) + seconds
    shown = sorted(totals, key=lambda k: -totals[k])[:_IMPORT_PACKAGES_SHOWN]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.32 * len(bars)))
    colors = plt.get_cmap("tab10").colors
    for row, bar in enumerate(reversed(bars)):
        left = 0.0
        parts = [(name, bar["packages"].get(name, 0.0)) for name in shown]
        others = sum(v for k, v in bar["packages"].items() if k not in shown) + bar.get("other_packages_s", 0.0)
        parts.append(("other packages", others))
        named = sum(bar["packages"].values()) + bar.get("other_packages_s", 0.0)
        parts.append(("not in the profile", max(0.0, bar["seconds"] - named)))
        for index, (name, seconds) in enumerate(parts):
            color = colors[index % len(colors)] if index < len(shown) else ("0.6" if name == "other packages"
                                                                             else "0.88")
            ax.barh(row, seconds, left=left, color=color, edgecolor="white", linewidth=0.4,
                    label=name if row == 0 else None)
            left += seconds
    ax.set_yticks(range(len(bars)), [b["label"] for b in reversed(bars)], fontsize=8)
    ax.set_xlabel("seconds in the process's import window (API server: start to its first log line; "
                  "EngineCore: its start to its first line)", fontsize=8)
    ax.set_title(IMPORTS_TITLE)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _subtitle(fig, note)
    return _save(plt, fig, path, IMPORTS_TITLE, note)


def import_bars(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The bars of :func:`imports_chart` from the startup table's ``_imports`` (one per trial and
    process; per mode, the repeats' mean, when there are more than ``_IMPORT_BARS``)."""
    # The four columns read, not every cell of every row as a dict (10,000 trials).
    columns = [frame[c].tolist() if c in frame.columns else [None] * len(frame) for c in ("status", "mode", "repeat",
                                                                                          "_imports")]
    rows = [(mode, repeat, imports) for status, mode, repeat, imports in zip(*columns, strict=True)
            if status == "ok" and isinstance(imports, dict)]
    per_mode = len(rows) * 2 > _IMPORT_BARS
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for mode, repeat, imports in rows:
        for process, label in (("api", "API server"), ("engine", "EngineCore")):
            entry = imports.get(process)
            if entry:
                key = (str(mode), label) if per_mode else (f"{mode} r{repeat}", label)
                groups.setdefault(key, []).append(entry)
    bars = []
    for (name, label), entries in groups.items():
        packages: dict[str, float] = {}
        for entry in entries:
            for package, seconds in (entry.get("packages") or {}).items():
                packages[package] = packages.get(package, 0.0) + seconds / len(entries)
        bars.append({"label": f"{name} {label}", "seconds": sum(e["seconds"] for e in entries) / len(entries),
                     "packages": packages,
                     "other_packages_s": sum(e.get("other_packages_s", 0.0) for e in entries) / len(entries)})
    return bars


# --- snapshot ------------------------------------------------------------------------------------

RESTORE_TITLE = "Every restore to its first token, by stage"
RESTORE_COLOURS = {"staging": "tab:purple", "CRIU memfds": "tab:cyan", "CRIU pages": "tab:blue",
                   "CRIU rest": "lightsteelblue", "GPU restore": "tab:orange", "wake": "tab:green",
                   "weights reload": "tab:olive", "first answer": "tab:gray"}


def restore_chart(bars: list[dict[str, Any]], path: Path, note: str = "") -> Path | None:
    """Horizontal bars, one per restore: its ``stages`` (name -> seconds, stacked in their order), and
    a black mark at its physical ``limit_s`` where it has one (counted from the end of a ``staging`` stage)."""
    bars = [b for b in bars if sum(b["stages"].values()) > 0]
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.34 * len(bars)))
    # Stages no restore spent time in stay out of the legend.
    names = [name for name in dict.fromkeys(n for bar in bars for n in bar["stages"])
             if any(bar["stages"].get(name) for bar in bars)]
    marked = False  # the limit's legend entry, once
    for row, bar in enumerate(reversed(bars)):
        left = 0.0
        for name in names:
            seconds = float(bar["stages"].get(name) or 0.0)
            ax.barh(row, seconds, left=left, color=RESTORE_COLOURS.get(name, "0.7"), edgecolor="white",
                    linewidth=0.4, label=name if row == 0 else None)
            left += seconds
        if bar.get("limit_s"):  # the limit is the restore's: it starts after the staging copy
            at = float(bar["stages"].get("staging") or 0.0) + bar["limit_s"]
            ax.plot([at, at], [row - 0.42, row + 0.42], color="black", linewidth=1.6,
                    label=None if marked else "physical limit")
            marked = True
    ax.set_yticks(range(len(bars)), [b["label"] for b in reversed(bars)], fontsize=8)
    ax.set_xlabel("seconds: the staging copy (before the restore), then restore to first token", fontsize=8)
    ax.set_title(RESTORE_TITLE)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _subtitle(fig, note)
    return _save(plt, fig, path, RESTORE_TITLE, note)
