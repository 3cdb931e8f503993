"""Where a startup trial's node wall time goes outside its measured window.

Runs a startup campaign with the engine stand-in on the local inventory (``connection: local``)
and, when this is root and openssh-server is installed, over SSH to a loopback sshd test host
(``tests/support/sshd_hosts.py``), then reads every trial's files back and reports, per trial
and in all:

- the **campaign wall** (the runner's command, preflight and report included);
- the **measured windows**, from each trial's ``timings.json`` (``nodetools/coldstart.py``; its
  ``events`` are seconds after the start command): start command -> ``first_token``, plus
  ``sleep_requested`` -> ``first_token_after_wake`` for a mode with sleep/wake. What a trial is
  *for*: everything else is overhead of the campaign;
- the time **outside** them, split by phase (``trial.json``'s ``phases``: one, ``trial``, for a
  startup trial since it runs in one Ansible run; prepare / measure / collect in older results),
  plus the runner's own time between and around them, and, inside a phase, from the ansible-runner
  job events in the trial's ``ansible/artifacts/<phase>/``: ``startup`` (the
  phase's start to its first task: ansible-runner, ansible-playbook's imports, inventory and
  playbook parse), ``tasks`` (first task to ``playbook_on_stats``, the measured window taken
  out), ``teardown`` (stats to the phase's end: ansible-playbook's exit, ansible-runner's
  wrap-up, the runner's artefact scrub);
- the **ratio** outside / wall, twice: with the engine's stops (``stop_requested`` -> ``stopped``,
  reported by the startup experiment as ``stop_s``, what a restart pays before its start) counted
  as overhead and counted as measured; the slowest tasks (median seconds per trial) and prepare's
  own steps (``prepare.json``'s ``prepare_steps_s``) and the timer's (``timings.json``'s
  ``timer_steps_s``: before the start command, after the engine's stop).

A trial whose Ansible run the runner started early, while the trial before it collected
(runner/overlap.py), counts from its turn (``waited_for_turn_s``): what it did before overlapped
the trial before it, so only the campaign's wall and the windows make the ratio.

    .venv/bin/python benchmarks/bench_trial_overhead.py [--repeats 2] [--runs 3] [--modes a,b]
        [--no-ssh] [--no-follow] [--json] [--keep DIR]
    .venv/bin/python benchmarks/bench_trial_overhead.py --from RESULTS_DIR [--from ...] [--json]

``--from`` reads results folders a startup campaign already wrote (fetched from a GPU node, say)
instead of running one: the campaign wall is its runs' time in ``run.json``, the trials' phases
and job events are read from each trial's folder, wherever the node kept them.

The stand-in's weights are made before the timed campaign, so every trial is alike (a real
campaign's first trial also makes them). Other work on the machine changes these figures: read
``--runs`` medians and note the load average the header prints.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.cli import main as runner_main  # noqa: E402
from runner.overhead import overhead_line  # noqa: E402
from tests.support.sshd_hosts import SSHD, SshHostSet  # noqa: E402

DEFAULT_MODES = "disk_cold,page_cache_warm,sleep_wake"


@dataclass
class PhaseSplit:
    """One phase of one trial, in seconds."""

    total: float
    startup: float = 0.0
    tasks: float = 0.0  # the measured window taken out
    teardown: float = 0.0
    window: float = 0.0
    task_s: dict[str, float] = field(default_factory=dict)

    @property
    def outside(self) -> float:
        return self.total - self.window


@dataclass
class TrialOverhead:
    trial: str
    status: str
    wall: float
    window: float
    runner: float  # the runner's own time: before the first phase, between phases, after the last
    phases: dict[str, PhaseSplit]
    stop: float = 0.0  # the engine's stop, inside the timer's run (measured: stop_s)
    node_steps: dict[str, float] = field(default_factory=dict)  # prepare's own steps (prepare.json)

    @property
    def outside(self) -> float:
        return self.wall - self.window


def _stamp(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["created"])).timestamp()


def _events(artifact_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in (artifact_dir / "job_events").glob("*.json"):
        try:
            events.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted((e for e in events if e.get("created")), key=lambda e: int(e.get("counter", 0)))


def measured_windows(timings: dict[str, Any]) -> float:
    """Start command -> first token, plus sleep request -> first token after wake."""
    events = timings.get("events") or {}
    window = float(events.get("first_token") or 0.0)
    if "sleep_requested" in events and "first_token_after_wake" in events:
        window += float(events["first_token_after_wake"]) - float(events["sleep_requested"])
    return window


def stop_window(timings: dict[str, Any]) -> float:
    """The engine's stop (stop requested -> its group gone): measured too, as ``stop_s``, the part
    of a restart before the start; reported apart, so the ratio can be read with or without it."""
    events = timings.get("events") or {}
    if "stop_requested" in events and "stopped" in events:
        return max(0.0, float(events["stopped"]) - float(events["stop_requested"]))
    return 0.0


def split_phase(phase: dict[str, Any], window: float, trial_dir: Path | None = None) -> PhaseSplit:
    """A phase's wall split into start-up, tasks and teardown. A phase the runner started early
    (``waited_for_turn_s``: while the previous trial collected, runner/overlap.py) counts from its
    turn: what it did before then overlapped the previous trial."""
    turn = float(phase["started"]) + float(phase.get("waited_for_turn_s") or 0.0)
    split = PhaseSplit(total=float(phase["ended"]) - turn, window=window)
    artifacts = Path(phase.get("artifact_dir") or "/nonexistent")
    if not artifacts.is_dir() and trial_dir is not None:  # a results folder fetched from the node
        artifacts = trial_dir / "ansible" / "artifacts" / artifacts.name
    events = _events(artifacts)
    starts = [e for e in events if e["event"] == "playbook_on_task_start"]
    stats = next((e for e in events if e["event"] == "playbook_on_stats"), None)
    if not starts or stats is None:
        split.startup = split.total  # no task ran: all of it is start-up and wrap-up
        return split
    first, end = max(_stamp(starts[0]), turn), _stamp(stats)
    split.startup = first - turn
    split.tasks = end - first - window
    split.teardown = float(phase["ended"]) - end
    bounds = [*starts, stats]
    for this, following in itertools.pairwise(bounds):
        name = str((this.get("event_data") or {}).get("task") or "?")
        seconds = _stamp(following) - max(_stamp(this), turn)
        split.task_s[name] = split.task_s.get(name, 0.0) + max(seconds, 0.0)
    return split


def analyse_trial(trial_dir: Path) -> TrialOverhead:
    record = json.loads((trial_dir / "trial.json").read_text())
    timings_path = next((trial_dir / "raw").glob("*/timings.json"), None)
    timings = json.loads(timings_path.read_text()) if timings_path else {}
    window = measured_windows(timings)
    started_at = float(timings.get("started_at") or 0.0)  # the start command, on the node's clock

    # The phase that ran the timer; "measure" when the node's clock disagrees with the controller's.
    holder = next((p["name"] for p in record["phases"] if p["started"] <= started_at <= p["ended"]), "measure")
    phases = {p["name"]: split_phase(p, window if p["name"] == holder else 0.0, trial_dir) for p in record["phases"]}
    in_phases = sum(p.total for p in phases.values())
    wall = float(record["ended"]) - float(record["started"])
    steps = ((timings.get("before_start") or {}).get("prepare_steps_s")) or {}
    steps = {**steps, **{f"timer_{k}": v for k, v in (timings.get("timer_steps_s") or {}).items()}}
    return TrialOverhead(record["id"], record["status"], wall, window, wall - in_phases, phases,
                         stop_window(timings), {k: float(v) for k, v in steps.items()})


def write_campaign(work: Path, label: str, inventory: Path, hosts: str, modes: list[str], repeats: int,
                   model: Path, model_mib: int) -> Path:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = work / f"bench-{label}.yaml"
    path.write_text(f"""\
name: bench-trial-overhead-{label}
inventory: {inventory}
hosts: {hosts}
remote_dir: {work / 'remote'}
engine:
  kind: stand-in
  model: {model}
  standin_model_mib: {model_mib}
  served_model_name: standin
  port: {port}
  cache_root: {work / 'cache'}
  args: {{max-model-len: 8192}}
  env: {{STANDIN_COMPILE_MISS_S: "1.0", STANDIN_JIT_MISS_S: "0.5", STANDIN_GRAPH_CAPTURE_S: "0.3"}}
experiments:
  - kind: startup
    modes: [{', '.join(modes)}]
    repeats: {repeats}
    timeout_s: 300
""")
    return path


def run_once(campaign: Path, results: Path, follow: bool) -> float:
    argv = [str(campaign), "--quiet", "--results", str(results)] + ([] if follow else ["--no-follow"])
    started = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # the runner's summary line: stdout stays the report's
        rc = runner_main(argv)
    wall = time.monotonic() - started
    if rc != 0:
        raise SystemExit(f"benchmark campaign failed (rc={rc}); see {results}")
    return wall


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summarise(label: str, walls: list[float], trials: list[TrialOverhead]) -> dict[str, Any]:
    per_phase: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    per_task: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        for name, p in t.phases.items():
            for part in ("total", "startup", "tasks", "teardown", "outside"):
                per_phase[name][part].append(getattr(p, part))
            for task, seconds in p.task_s.items():
                per_task[f"{name}: {task}"].append(seconds)
    runs = len(walls)
    windows = sum(t.window for t in trials) / runs
    stops = sum(t.stop for t in trials) / runs
    wall = _median(walls)
    steps: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        for step, seconds in t.node_steps.items():
            steps[step].append(seconds)
    return {
        "label": label, "runs": runs, "trials_per_run": len(trials) // max(runs, 1),
        "campaign_wall_s": walls, "campaign_wall_median_s": round(wall, 3),
        "windows_per_run_s": round(windows, 3),
        "outside_per_run_s": round(wall - windows, 3),
        "outside_ratio": round((wall - windows) / wall, 4) if wall else None,
        # The engine's stop is measured (stop_s: what a restart pays before its start): counted in too.
        "stops_per_run_s": round(stops, 3),
        "outside_ratio_stop_measured": round((wall - windows - stops) / wall, 4) if wall else None,
        "prepare_steps_median_s": {k: round(_median(v), 3) for k, v in steps.items()},
        "trial_median_s": {k: round(_median(v), 3) for k, v in {
            "wall": [t.wall for t in trials], "window": [t.window for t in trials], "stop": [t.stop for t in trials],
            "outside": [t.outside for t in trials], "runner": [t.runner for t in trials]}.items()},
        "phase_median_s": {ph: {k: round(_median(v), 3) for k, v in parts.items()} for ph, parts in per_phase.items()},
        "slowest_tasks_median_s": dict(sorted(((k, round(_median(v), 3)) for k, v in per_task.items()),
                                              key=lambda kv: -kv[1])[:12]),
        "trials": [{**asdict(t), "outside": round(t.outside, 3)} for t in trials],
    }


def _outside_of(phase: dict[str, Any] | None) -> float:
    return float(phase["total"]) - float(phase["window"]) if phase else 0.0


def print_summary(s: dict[str, Any]) -> None:
    if s.get("report_overhead"):
        print(f"\nreport.md: {s['report_overhead']}")
    print(f"\n== {s['label']}: {s['runs']} run(s) x {s['trials_per_run']} trials; campaign wall median "
          f"{s['campaign_wall_median_s']:.1f} s (runs: {', '.join(f'{w:.1f}' for w in s['campaign_wall_s'])}); "
          f"measured windows {s['windows_per_run_s']:.1f} s; outside {s['outside_per_run_s']:.1f} s "
          f"= {100 * (s['outside_ratio'] or 0):.1f}% of the wall; the engine's stops {s['stops_per_run_s']:.1f} s "
          f"(measured too, stop_s): {100 * (s['outside_ratio_stop_measured'] or 0):.1f}% outside every measured window")
    names = list(dict.fromkeys(ph for t in s["trials"] for ph in t["phases"]))  # in the order they ran
    print(f"{'trial':<34} {'status':<7} {'wall':>6} {'window':>6} {'outside':>7} {'stop':>5} "
          + " ".join(f"{ph:>8}" for ph in names) + f" {'runner':>6}")
    for t in s["trials"]:
        cells = " ".join(f"{_outside_of(t['phases'].get(ph)):>8.2f}" for ph in names)
        print(f"{t['trial'][:34]:<34} {t['status']:<7} {t['wall']:>6.2f} {t['window']:>6.2f} {t['outside']:>7.2f} "
              f"{t['stop']:>5.2f} {cells} {t['runner']:>6.2f}")
    m = s["trial_median_s"]
    print(f"{'median per trial':<42} {m['wall']:>6.2f} {m['window']:>6.2f} {m['outside']:>7.2f} {m['stop']:>5.2f}"
          f"{'':>{9 * len(names)}} {m['runner']:>6.2f}")
    if s["prepare_steps_median_s"]:
        steps = s["prepare_steps_median_s"].items()
        print("prepare's and the timer's steps (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in steps))
    print(f"\n{'phase (median s)':<18} {'total':>7} {'startup':>8} {'tasks':>7} {'teardown':>9} {'outside':>8}")
    for ph, parts in s["phase_median_s"].items():
        print(f"{ph:<18} {parts['total']:>7.2f} {parts['startup']:>8.2f} {parts['tasks']:>7.2f} "
              f"{parts['teardown']:>9.2f} {parts['outside']:>8.2f}")
    print("\nslowest tasks (median s per trial; measure's includes its window):")
    for task, seconds in s["slowest_tasks_median_s"].items():
        print(f"  {seconds:>6.2f}  {task[:90]}")


def bench(label: str, work: Path, inventory: Path, hosts: str, args: argparse.Namespace, model: Path) -> dict[str, Any]:
    campaign = write_campaign(work, label, inventory, hosts, args.modes.split(","), args.repeats, model,
                              args.model_mib)
    walls, trials = [], []
    for n in range(args.runs):
        results = work / f"results-{label}-{n}"
        walls.append(run_once(campaign, results, follow=not args.no_follow))
        trials += [analyse_trial(d) for d in sorted((results / "trials").iterdir()) if (d / "trial.json").is_file()]
    return summarise(label, walls, trials)


def from_results(results: Path) -> dict[str, Any]:
    """The same figures for a results folder a campaign already wrote."""
    if not (results / "run.json").is_file() or not (results / "trials").is_dir():
        raise SystemExit(f"{results}: not a results folder with its trials (run.json and trials/ expected)")
    runs = (json.loads((results / "run.json").read_text()).get("runs") or [])
    folders = [d for d in sorted((results / "trials").iterdir()) if (d / "trial.json").is_file()]
    records = {d: json.loads((d / "trial.json").read_text()) for d in folders}
    ended = [d for d in folders if records[d].get("ended")]  # a trial cut short with its machine has none
    walls = []
    starts = sorted(float(r["started"]) for r in runs if r.get("started"))
    for run in runs:
        if not run.get("started"):
            continue
        begin = float(run["started"])
        end = run.get("ended")
        if not end:  # cut short (the node was taken back): measured up to its last recorded trial
            until = next((t for t in starts if t > begin), float("inf"))  # a later run resumed the folder
            mine = [d for d in folders if begin <= float(records[d].get("started") or 0) < until]
            end = max((float(records[d]["ended"]) for d in mine if records[d].get("ended")), default=None)
            if end is not None:
                unfinished = sum(1 for d in mine if not records[d].get("ended"))
                print(f"{results}: a run cut short is measured up to its last recorded trial "
                      f"({unfinished} of its trials unfinished, left out)", file=sys.stderr)
        if end:
            walls.append(float(end) - begin)
    if not walls:
        raise SystemExit(f"{results}/run.json: no run to measure (none finished, no trial recorded)")
    summary = summarise(str(results), [sum(walls)], [analyse_trial(d) for d in ended])
    # The report's own figure beside this one: it counts every kind's measured stages (a snapshot's
    # dump and restores, a mode's preparation) and leaves a stopped trial out; this one, start windows.
    summary["report_overhead"] = overhead_line(runs, records.values()).removeprefix("- ")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=DEFAULT_MODES, help=f"startup modes (default {DEFAULT_MODES})")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1, help="campaigns per transport (medians across them)")
    parser.add_argument("--model-mib", type=int, default=256)
    parser.add_argument("--no-ssh", action="store_true", help="the local inventory only")
    parser.add_argument("--no-follow", action="store_true", help="run the campaigns with --no-follow")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout instead of tables")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (results, artefacts)")
    parser.add_argument("--from", dest="from_results", type=Path, action="append", default=[],
                        help="analyse this results folder instead of running a campaign (repeatable)")
    args = parser.parse_args()
    if args.from_results:
        summaries = [from_results(path) for path in args.from_results]
        if args.json:
            json.dump({"results": summaries}, sys.stdout, indent=1)
            print()
        for summary in summaries if not args.json else ():
            print_summary(summary)
        return
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-trial-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(model), "--size-mib",
                    str(args.model_mib)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    out: dict[str, Any] = {"load_average_before": os.getloadavg(), "cpus": os.cpu_count(), "results": []}
    out["results"].append(bench("local", work, REPO / "inventory/local", "localhost", args, model))
    if not args.no_ssh and os.geteuid() == 0 and SSHD.exists():
        hosts = SshHostSet(work / "sshd", count=1).start()
        try:
            inventory = hosts.write_inventory(work / "inventory/hosts.yml")
            out["results"].append(bench("ssh", work, inventory, "h1", args, model))
        finally:
            hosts.stop()
    out["load_average_after"] = os.getloadavg()
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    else:
        print(f"cpus {out['cpus']}, load average before {out['load_average_before'][0]:.2f}, "
              f"after {out['load_average_after'][0]:.2f}; work folder {work}")
        for summary in out["results"]:
            print_summary(summary)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
