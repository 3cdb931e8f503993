"""``python -m runner``: run a campaign, show its plan, rebuild a report, parse a vLLM log.

Exit codes (README.md, "Exit codes"): 0 every trial ok or skipped by design; 1 some trial failed;
2 bad input (nothing on any node touched); 3 nothing failed, but a preflight refused a trial (the
campaign's own settings, found before any host is touched, or the node's numbers) or no trial
measured anything; 4 the results folder is held by another run or refused a write (disk full: the
run stopped, what it wrote is whole); 5 the runner failed (a bug: one line, the traceback in a crash
log); 130 interrupted (finished trials kept; run the same command again to resume).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from runner import __version__
from runner.crash import crash_line
from runner.errors import ResultsLockedError, ResultsWriteError, RunnerError, SpecError
from runner.results_lock import ResultsLock
from runner.secrets import Secrets

if TYPE_CHECKING:
    from runner.plan import Plan
    from runner.spec import LoadedCampaign

__all__ = ["main"]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_RESULTS, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CRASH = 5
MAX_ERROR_LINES = 100  # bad input is shown this many lines at most
SUBCOMMANDS = ("run", "report", "parse-log")

logger = logging.getLogger("runner")


@dataclass
class _CrashSite:
    """What a crash log may use, as the command learns it: the results folder and the secrets."""

    results: Path | None = None
    scrub: Callable[[str], str] = str


_crash_site = _CrashSite()


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m runner",
        description="Run a campaign (CAMPAIGN.yaml), or: report RESULTS_DIR | parse-log PATH.",
    )
    p.add_argument("--version", action="version", version=_version())
    p.add_argument("campaign", type=Path, help="campaign YAML file")
    p.add_argument("-i", "--inventory", action="append", default=[], metavar="SOURCE",
                   help="inventory path or host list ('h1,h2,') instead of the file's (repeatable); its "
                   "inventory scripts and plugins run, as with ansible-playbook")
    p.add_argument("-l", "--limit", metavar="SUBSET",
                   help="narrow the campaign's hosts to this pattern (or @FILE), as ansible-playbook -l does")
    p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY.PATH=VALUE|@FILE|YAML",
                   help="override campaign values as ansible-playbook reads extra vars: 'k=v k2=v2' (text, typed by "
                   "the campaign), @file.yml, or a YAML/JSON mapping (repeatable; the last wins)")
    p.add_argument("--only", action="append", default=[], metavar="EXPERIMENT[.MODE]",
                   help="run only this experiment or mode (repeatable); results resume in the same folder")
    p.add_argument("--plan", action="store_true", help="print the expanded trial matrix; touch no host")
    p.add_argument("--json", action="store_true", help="with --plan only: the plan as JSON")
    p.add_argument("--show-launch", action="store_true",
                   help="with --plan: each trial's engine command line, as its node will exec it")
    p.add_argument("--results", type=_folder, help="results folder (default: results/<campaign name>/)")
    p.add_argument("--fresh", action="store_true", help="move earlier results aside and start over")
    p.add_argument("--retry-failed", action="store_true",
                   help="run failed and refused trials again on resume, and those the node skipped (not the plan)")
    p.add_argument("--parallel", type=int, default=8, metavar="N", help="hosts worked on at once (8)")
    p.add_argument("--no-follow", action="store_true", help="do not tail the node's server log live")
    p.add_argument("--fresh-facts", action="store_true",
                   help="read every host's facts again, even where an earlier run's are fresh (runner/facts_cache.py)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--quiet", action="store_true", help="print only the final summary and errors")
    out.add_argument("--plain", action="store_true", help="plain log lines instead of a live display")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def _folder(text: str) -> Path:
    """A folder argument: an empty one is refused (``Path("")`` is the working folder, which a
    ``--fresh`` would empty)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path: name a folder ('.' for this one)")
    return Path(text)


def _version() -> str:
    """This tool's version and the Ansible it drives (read without importing Ansible)."""
    try:
        core = metadata.version("ansible-core")
    except metadata.PackageNotFoundError:
        core = "not installed"
    return f"gpu-campaign {__version__} (ansible-core {core}, python {sys.version.split()[0]})"


def _configure_logging(verbose: bool, quiet: bool) -> None:
    level = logging.DEBUG if verbose else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    logging.getLogger("paramiko").setLevel(logging.WARNING)  # it logs every connect at INFO


def _launch_line(launch: dict[str, Any]) -> str:
    """The engine's start as a shell line: its environment, then its argv (secrets by name only)."""
    env = [f"{k}={shlex.quote(str(v))}" for k, v in sorted((launch.get("env") or {}).items())]
    env += [f"{name}=<from the controller>" for name in launch.get("secret_env") or []]
    return " ".join([*env, shlex.join(launch["argv"])])


def _print_plan(plan_dict: dict[str, object], as_json: bool, show_launch: bool = False) -> None:
    if as_json:
        print(json.dumps(plan_dict, indent=2))
        return
    trials = plan_dict["trials"]
    assert isinstance(trials, list)
    width = max((len(t["id"]) for t in trials), default=5)
    print(f"{'trial':<{width}}  {'host':<12} {'experiment':<12} {'mode':<18} rep  resources")
    for t in trials:
        r = t["resources"]
        res = f"gpus={r['gpus'] or '-'} exclusive={'yes' if r['exclusive'] else 'no'} ram={r['host_ram_gib']:g}GiB"
        print(f"{t['id']:<{width}}  {t['host']:<12} {t['experiment']:<12} {t['mode']:<18} {t['repeat']:>3}  {res}")
        for why in t.get("refusals") or []:
            print(_one_line(f"{'':<{width}}  refused: {why}"))
        if show_launch:
            node = t.get("node") or {}
            launches = node.get("copies") or ([t["launch"]] if t.get("launch") else [])
            for launch in launches:
                print(_one_line(f"  launch: {_launch_line(launch)}"))
            if node.get("skip"):
                print(_one_line(f"  skipped on the node: {node['skip']}"))
    refused = sum(1 for t in trials if t.get("refusals"))
    print(f"{len(trials)} trial(s) in campaign {plan_dict['campaign']}"
          + (f"; {refused} refused by the campaign's own settings" if refused else ""))


def _cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    from runner.overrides import parse_overrides
    from runner.plan import expand
    from runner.spec import load_campaign, select

    if args.parallel < 1:  # before --plan too: the plan says what the same run would do
        raise SpecError([f"--parallel: must be >= 1, got {args.parallel}"])
    if args.json and not args.plan:
        raise SpecError(["--json: only with --plan (the plan as JSON); a run's machine-readable results are "
                         "summary.json and trials/*/trial.json in its results folder"])
    loaded = select(load_campaign(args.campaign, overrides=parse_overrides(args.extra_vars),
                                  inventory=args.inventory or None, limit=args.limit), args.only)
    root = args.results or Path("results") / loaded.campaign.name
    _crash_site.results = root
    if not args.fresh:
        _refuse_another_campaigns_folder(root, loaded.campaign.name)
    plan = expand(loaded, _cached_facts(root, loaded.hosts), results=root)
    if args.plan:
        _print_plan(plan.as_dict(), args.json, args.show_launch)
        return EXIT_REFUSED if plan.refused else EXIT_OK
    if plan.refused:
        for trial in plan.refused:
            print(_one_line(f"{trial.id}: refused: {'; '.join(trial.refusals)}"), file=sys.stderr)
        print(f"error: the campaign's own settings refuse {len(plan.refused)} trial(s); nothing was started "
              "(fix the values, or leave those modes out with --only)", file=sys.stderr)
        return EXIT_REFUSED
    engine = loaded.campaign.engine
    secrets = Secrets.from_environment(engine.env_from_controller if engine else [], str(loaded.path))
    _crash_site.scrub = secrets.scrub_text
    lock = ResultsLock(root)
    lock.acquire(argv)
    try:
        return _run_locked(args, argv, loaded, plan, root, secrets)
    finally:
        lock.release()


def _run_locked(args: argparse.Namespace, argv: list[str], loaded: LoadedCampaign, plan: Plan, root: Path,
                secrets: Secrets) -> int:
    from runner.campaign import run_campaign
    from runner.facts_cache import FACTS_MAX_AGE_S, FactsCache
    from runner.progress import PlainProgress, Progress, QuietProgress, RichProgress
    from runner.report import build_report
    from runner.store import ResultsStore

    try:
        store = ResultsStore.open(root, fresh=args.fresh)
    except OSError as exc:
        raise ResultsWriteError(root, exc) from exc
    progress: Progress
    if args.quiet:
        progress = QuietProgress()
    elif args.plain or not sys.stderr.isatty():
        progress = PlainProgress()
    else:
        progress = RichProgress()
    # --quiet shows no log line: following one would only read the inventory again and poll the node.
    outcome = run_campaign(loaded, plan, store, progress, retry_failed=args.retry_failed, parallel=args.parallel,
                           follow=not (args.no_follow or args.quiet), argv=argv, secrets=secrets,
                           facts_cache=FactsCache.default(0 if args.fresh_facts else FACTS_MAX_AGE_S))
    counts = ", ".join(f"{k} {v}" for k, v in sorted(outcome.counts.items())) or "nothing to do"
    try:
        csv_path, md_path = build_report(root)
        written = f"({csv_path.name}, {md_path.name})"
    except (RunnerError, OSError) as exc:  # a run stopped before plan.json was whole: no report, its own exit code
        written = f"(no report: {exc})"
    print(f"{loaded.campaign.name}: {counts}; results in {root} {written}")
    if outcome.stopped:
        print(f"error: stopped early: {_one_line(outcome.stopped)}; every file already written is whole, and the same "
              "command resumes once there is room", file=sys.stderr)
        return EXIT_RESULTS
    if outcome.interrupted:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome.failed:
        return EXIT_FAILED
    if outcome.counts.get("refused"):
        print(f"error: a preflight refused {outcome.counts['refused']} trial(s): see their reasons in "
              f"{root / 'summary.csv'}", file=sys.stderr)
        return EXIT_REFUSED
    if plan.trials and not outcome.counts.get("ok"):
        print("error: no trial measured anything (every one was skipped)", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


def _refuse_another_campaigns_folder(root: Path, name: str) -> None:
    """A run of campaign B into A's results folder replaced A's campaign.yaml and plan.json with B's and
    mixed the two campaigns' trials in one report: refused unless ``--fresh`` moves A's results aside."""
    from runner.store import ResultsStore

    if not os.path.isdir(root):  # noqa: PTH112 -- never raises (Path.is_dir does on a name over NAME_MAX)
        return
    run = ResultsStore(root, quarantine=False).read_run()
    other = run.get("campaign") if run else None
    if isinstance(other, str) and other != name:
        raise SpecError([f"--results {root}: holds the results of campaign {other!r}, not {name!r}: a run would "
                         "mix the two and replace its campaign.yaml; give this run another --results, or add "
                         "--fresh to move those results aside first"])


def _cached_facts(root: Path, hosts: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """Facts an earlier run gathered, for the plan checks that need a node's numbers (read only:
    ``--plan`` moves nothing; a run moves an unusable file aside when it gathers the facts again)."""
    from runner.store import ResultsStore

    if not os.path.isdir(root):  # noqa: PTH112 -- never raises (Path.is_dir does on a name over NAME_MAX)
        return {}
    store = ResultsStore(root, quarantine=False)
    return {host: facts for host in hosts if (facts := store.read_facts(host)) is not None}


def _cmd_report(argv: list[str]) -> int:
    from runner.report import build_report

    p = argparse.ArgumentParser(prog="python -m runner report", description="Rebuild summary.csv and report.md.")
    p.add_argument("results_dir", type=_folder)
    args = p.parse_args(argv)
    _crash_site.results = args.results_dir
    if not os.path.isdir(args.results_dir):  # noqa: PTH112 -- never raises (Path.is_dir does on a name over NAME_MAX)
        raise RunnerError(f"{args.results_dir}: not a results folder (no such folder)")
    # Shared: reports may run side by side, never while a run writes the folder (refused at once).
    lock = ResultsLock(args.results_dir)
    lock.acquire(["report", *argv], shared=True)
    try:
        csv_path, md_path = build_report(args.results_dir)
    finally:
        lock.release()
    print(f"wrote {csv_path} and {md_path}")
    return EXIT_OK


def _cmd_parse_log(argv: list[str]) -> int:
    from runner.parse.vllm_log import parse_log_file

    p = argparse.ArgumentParser(prog="python -m runner parse-log",
                                description="Parse a vLLM server log into startup phases, stats and errors.")
    p.add_argument("path", type=Path)
    p.add_argument("--json", action="store_true", help="one JSON object (keys absent when lines are)")
    args = p.parse_args(argv)
    record = parse_log_file(args.path)
    if args.json:
        print(json.dumps(record, indent=2, sort_keys=True))
        return EXIT_OK
    for key, value in record.items():
        if key == "stats":
            print(f"stats: {len(value)} periodic line(s)")
        else:
            print(_one_line(f"{key}: {value}"))  # a log's text: never a terminal escape
    return EXIT_OK


def _one_line(text: str) -> str:
    """A message as one line: a key or value it quotes (or a log's line) may hold a newline or a
    terminal escape, printed as its escape sequence (``\\x1b``), never sent to the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _crash_site.results, _crash_site.scrub = None, str
    try:
        if argv and argv[0] == "report":
            return _cmd_report(argv[1:])
        if argv and argv[0] == "parse-log":
            return _cmd_parse_log(argv[1:])
        if argv and argv[0] == "run":
            argv = argv[1:]
        args = _run_parser().parse_args(argv)
        _configure_logging(args.verbose, args.quiet or (not args.plain and sys.stderr.isatty()))
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        return _cmd_run(args, argv)
    except SpecError as exc:
        for line in exc.lines[:MAX_ERROR_LINES]:
            print(_one_line(line), file=sys.stderr)
        if len(exc.lines) > MAX_ERROR_LINES:  # 20,000 unknown modes printed 20,000 lines
            print(f"... and {len(exc.lines) - MAX_ERROR_LINES} more problem(s) like these", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ResultsLockedError, ResultsWriteError) as exc:
        print(_one_line(f"error: {exc}"), file=sys.stderr)
        return EXIT_RESULTS
    except RunnerError as exc:
        print(_one_line(f"error: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 -- a bug: one line; the traceback goes to a crash log
        print(crash_line(exc, _crash_site.results, argv, _crash_site.scrub), file=sys.stderr)
        return EXIT_CRASH
