"""The results folder's shareable outputs: summary.json (typed rows, per-mode aggregates), the
aggregate table in report.md, and files that follow the umask."""

from __future__ import annotations

import gc
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.report import build_report

ENGINE = {"kind": "vllm", "model": "/models/m"}


class Folder:
    """A results folder as a campaign leaves it: plan.json, trial records, the startup timer's raw files."""

    def __init__(self, root: Path, engine: dict[str, Any] | None = None) -> None:
        self.root = root
        self.engine = engine or ENGINE
        self.plan: list[dict[str, Any]] = []

    def trial(self, mode: str, repeat: int, status: str | None, *, host: str = "h1", first_token_s: float = 0.0,
              wake_s: float | None = None, reason: str = "", experiment: str = "startup") -> str:
        tid = f"{experiment}.{mode}.r{repeat}@{host}"
        planned = {"id": tid, "host": host, "experiment": experiment, "kind": "startup", "mode": mode,
                   "repeat": repeat, "params": {"recipe": {"args": {}}}, "engine": self.engine, "timeout_s": 60}
        self.plan.append(planned)
        if status is None:  # planned, not run yet
            return tid
        raw = self.root / "trials" / tid / "raw" / host
        raw.mkdir(parents=True)
        timings: dict[str, Any] = {"first_token_s": first_token_s}
        if wake_s is not None:
            timings["wake_to_first_token_s"] = wake_s
        if status == "ok":
            (raw / "timings.json").write_text(json.dumps(timings))
        record = {**planned, "status": status, "reason": reason, "duration_s": 100.0 + repeat,
                  "engine_label": self.engine["kind"],
                  # A failed trial may hold partial metrics: they must never reach a summary.
                  "metrics": {"first_token_s": 999.0} if status == "failed" else {}}
        (self.root / "trials" / tid / "trial.json").write_text(json.dumps(record))
        return tid

    def build(self) -> tuple[Path, Path]:
        (self.root / "plan.json").write_text(json.dumps({"campaign": "demo", "trials": self.plan}))
        return build_report(self.root)

    def summary(self) -> dict[str, Any]:
        return json.loads((self.root / "summary.json").read_text())


@pytest.fixture
def folder(tmp_path: Path) -> Folder:
    f = Folder(tmp_path / "results")
    for repeat, seconds in ((1, 10.0), (2, 30.0), (3, 20.0)):
        f.trial("disk_cold", repeat, "ok", first_token_s=seconds)
    f.trial("disk_cold", 4, "failed", reason="measure: timed out waiting for the first token")
    f.trial("runai_streamer", 1, "skipped", reason="the stand-in does not model runai_streamer")
    f.trial("enforce_eager", 1, None)
    return f


def aggregate(summary: dict[str, Any], mode: str, host: str = "h1") -> dict[str, Any]:
    (row,) = [a for a in summary["aggregates"] if a["mode"] == mode and a["host"] == host]
    return row


def test_summary_json_holds_every_row_with_typed_values_and_no_zeros(folder: Folder) -> None:
    csv_path, _ = folder.build()
    summary = folder.summary()
    assert csv_path.name == "summary.csv" and (folder.root / "summary.json").is_file()
    rows = {r["trial_id"]: r for r in summary["trials"]}
    assert len(rows) == 6 == len(csv_path.read_text().splitlines()) - 1
    ok = rows["startup.disk_cold.r3@h1"]
    assert ok["status"] == "ok" and ok["first_token_s"] == 20.0 and ok["repeat"] == 3 and ok["duration_s"] == 103.0
    assert isinstance(ok["repeat"], int) and isinstance(ok["first_token_s"], float)
    failed = rows["startup.disk_cold.r4@h1"]
    assert failed["status"] == "failed" and failed["reason"] == "measure: timed out waiting for the first token"
    assert failed["first_token_s"] is None  # not 0, and not the partial 999 of its record
    skipped = rows["startup.runai_streamer.r1@h1"]
    assert skipped["status"] == "skipped" and skipped["first_token_s"] is None and "runai_streamer" in skipped["reason"]
    assert rows["startup.enforce_eager.r1@h1"]["status"] == "pending"
    assert summary["columns"][:3] == ["trial_id", "experiment", "kind"] and summary["campaign"] == "demo"


def test_aggregate_is_the_median_of_the_ok_repeats_and_counts_the_failed_one(folder: Folder) -> None:
    folder.build()
    row = aggregate(folder.summary(), "disk_cold")
    assert (row["experiment"], row["kind"], row["n_trials"]) == ("startup", "startup", 4)
    assert (row["n_ok"], row["n_failed"], row["n_skipped"], row["n_other"]) == (3, 1, 0, 0)
    assert row["metrics"]["first_token_s"] == {"n": 3, "min": 10.0, "median": 20.0, "max": 30.0}
    assert row["metrics"]["duration_s"] == {"n": 3, "min": 101.0, "median": 102.0, "max": 103.0}
    assert row["not_ok"] == [{"trial_id": "startup.disk_cold.r4@h1", "status": "failed",
                              "reason": "measure: timed out waiting for the first token"}]


def test_a_mode_with_no_ok_repeat_has_counts_and_no_figures(folder: Folder) -> None:
    folder.build()
    summary = folder.summary()
    skipped = aggregate(summary, "runai_streamer")
    assert (skipped["n_ok"], skipped["n_skipped"], skipped["metrics"]) == (0, 1, {})
    assert skipped["not_ok"][0]["reason"] == "the stand-in does not model runai_streamer"
    pending = aggregate(summary, "enforce_eager")
    assert (pending["n_ok"], pending["n_other"], pending["metrics"]) == (0, 1, {})


def test_report_shows_the_aggregate_table_beside_the_trials(folder: Folder) -> None:
    _, md_path = folder.build()
    md = md_path.read_text()
    section = md[md.index("## Per mode"):md.index("## Trials")]
    lines = section.splitlines()
    assert "|  | disk_cold | runai_streamer | enforce_eager |" in lines
    assert "| trials ok | 3 | 0 | 0 |" in lines
    assert "| failed | 1 | 0 | 0 |" in lines
    assert "| skipped | 0 | 1 | 0 |" in lines
    assert "| first_token_s | 20 [10, 30] |  |  |" in lines
    assert "summary.json" in md
    assert md.index("## Per mode") < md.index("## Trials") < md.index("## Not ok")


def test_aggregates_split_by_host_where_an_experiment_ran_on_several(tmp_path: Path) -> None:
    f = Folder(tmp_path / "results")
    for host, base in (("h1", 10.0), ("h2", 50.0)):
        for repeat in (1, 2, 3):
            f.trial("disk_cold", repeat, "ok", host=host, first_token_s=base + repeat)
    _, md_path = f.build()
    summary = f.summary()
    assert aggregate(summary, "disk_cold", "h1")["metrics"]["first_token_s"]["median"] == 12.0
    assert aggregate(summary, "disk_cold", "h2")["metrics"]["first_token_s"]["median"] == 52.0
    assert "|  | disk_cold @ h1 | disk_cold @ h2 |" in md_path.read_text().splitlines()


def test_random_weights_are_noted_in_the_json_too(tmp_path: Path) -> None:
    f = Folder(tmp_path / "results", {**ENGINE, "rehearsal_model": "qwen3-0.8b"})
    f.trial("disk_cold", 1, "ok", first_token_s=5.0)
    f.build()
    assert any(n.startswith("random weights (qwen3-0.8b") for n in f.summary()["notes"])


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_follow_the_umask(folder: Folder, umask: int) -> None:
    folder.trial("sleep_wake", 1, "ok", first_token_s=60.0, wake_s=0.2)  # a chart with its wake panel
    old = os.umask(umask)
    try:
        folder.build()
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    for name in ("summary.csv", "summary.json", "report.md", "startup.csv", "startup.png"):
        assert stat.S_IMODE((folder.root / name).stat().st_mode) == expected, name
    assert not [p.name for p in folder.root.iterdir() if p.name.endswith(".tmp")]


def test_metrics_collected_by_this_code_are_not_collected_again(tmp_path: Path) -> None:
    from runner.provenance import collect_stamp

    f = Folder(tmp_path / "results")
    stale = f.trial("disk_cold", 1, "ok", first_token_s=10.0)
    current = f.trial("disk_cold", 2, "ok", first_token_s=20.0)
    for tid, first, stamp in ((stale, 11.0, "another-version"), (current, 21.0, collect_stamp())):
        path = tmp_path / "results" / "trials" / tid / "trial.json"
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "metrics": {"first_token_s": first}, "collected_with": stamp}))
    f.build()
    rows = {r["trial_id"]: r for r in f.summary()["trials"]}
    assert rows[stale]["first_token_s"] == 10.0  # another version's metrics: collected again from its files
    assert rows[current]["first_token_s"] == 21.0  # this code's: the stored metrics, no second collect


def test_a_fifo_planted_among_a_trials_raw_files_never_hangs_the_report(tmp_path: Path) -> None:
    f = Folder(tmp_path / "results")
    tid = f.trial("disk_cold", 1, "ok", first_token_s=10.0)
    raw = tmp_path / "results" / "trials" / tid / "raw" / "h1"
    os.mkfifo(raw / "server.log")  # a collect that opened it would wait for a writer forever
    (raw / "escape.json").symlink_to("/etc/passwd")
    f.build()
    assert not (raw / "server.log").exists() and not (raw / "escape.json").is_symlink()
    report = (tmp_path / "results" / "report.md").read_text()
    assert "server.log: is a FIFO" in report or "server.log: is a fifo" in report.lower()


def _collections_while(build: Callable[[], object]) -> list[int]:
    """The generations the cycle collector went through while ``build`` ran."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        build()
    finally:
        gc.callbacks.remove(note)
    return seen


def test_a_report_of_stored_metrics_never_wakes_the_cycle_collector_and_leaves_it_as_it_was(folder: Folder) -> None:
    from runner.provenance import collect_stamp

    for path in (folder.root / "trials").glob("*/trial.json"):  # collected by this code: no collect again
        path.write_text(json.dumps({**json.loads(path.read_text()), "collected_with": collect_stamp()}))
    assert gc.isenabled()
    # Row by row it ran ~100 times for these six trials (10,000: a quarter of the CPU time); now once,
    # when it is switched back on (the cycles a chart left).
    assert len(_collections_while(folder.build)) <= 1
    assert gc.isenabled()
    gc.disable()
    try:
        folder.build()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_collect_runs_with_the_cycle_collector_on(folder: Folder) -> None:
    # Collected by another version of the code: each ok trial is collected again, and the cycles
    # its parsers leave (90 MB over 10,000 trials) are freed as it goes, not at the end.
    assert _collections_while(folder.build)


def test_the_report_shows_the_same_of_a_plan_with_or_without_its_launch_and_node_commands(tmp_path: Path) -> None:
    # Those are most of a 10,000-trial plan (~40 MB): the report keeps only what it reads of it.
    shown = []
    for heavy in (False, True):
        f = Folder(tmp_path / "results", {**ENGINE, "rehearsal_model": "qwen3-0.8b",
                                          "args": {"load-format": "dummy", "max-model-len": 8192}})
        f.trial("disk_cold", 1, "ok", first_token_s=5.0)
        f.trial("disk_cold", 2, None)
        f.trial("disk_cold", 3, None)
        f.plan[1]["engine"] = {"model": "/models/m"}  # no kind: "none"
        f.plan[2].pop("engine")
        if heavy:
            for t in f.plan:
                t.update(launch={"argv": ["vllm", "serve"] * 50}, node={"commands": {"trial": ["x"] * 200}})
        f.build()
        shown.append([(f.root / name).read_text() for name in ("report.md", "summary.json", "summary.csv")])
        rows = {r["trial_id"]: r for r in f.summary()["trials"]}
        assert [rows[t["id"]]["engine"] for t in f.plan] == ["vllm", "none", "none"]
        assert {"random weights", "dummy weights"} <= {n.split(" (")[0] for n in f.summary()["notes"]}
        shutil.rmtree(f.root)
    assert shown[0] == shown[1]
