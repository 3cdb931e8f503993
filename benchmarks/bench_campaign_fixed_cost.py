"""A campaign's fixed cost: a one-trial campaign against a bare ``ansible-playbook`` of the same playbook.

The campaign is one ``selftest`` ``noop`` trial on the local inventory (its playbook pings the node
and does nothing else), run as a user runs it: ``python -m runner CAMPAIGN --quiet`` in a fresh
process, so the runner's own start (its imports), the host's facts, the trial, its record and the
report all count. The bare run is ``ansible-playbook`` of ``playbooks/experiments/selftest.yml``
with the same extra variables, from the repository root (the same ``ansible.cfg``). Runs alternate,
so load on the machine falls on both alike; the medians and their ratio are printed (the target
is a campaign within 1.5x the bare playbook), with the load average before and after, whether
Python may cache bytecode and how many of the checkout's modules have current bytecode: with
``PYTHONDONTWRITEBYTECODE`` set, a module without it (pip never compiles an editable checkout;
``scripts/setup.sh`` does) is compiled again at each start, installed packages' are not. Both sides
run under the same conditions (the same environment and checkout).

The runner's cache (a folder of the benchmark's own, never the user's): the warm-up campaign reads
the host's facts and the inventory's hosts, and each measured run takes them from it, as a run soon
after another does (runner/facts_cache.py, runner/spec/hosts.py); with ``--cold`` every run starts
with an empty one, as the first run on a machine does.

    .venv/bin/python benchmarks/bench_campaign_fixed_cost.py [--runs 5] [--cold] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLAYBOOK = "playbooks/experiments/selftest.yml"
TARGET_RATIO = 1.5


def _campaign(work: Path) -> Path:
    path = work / "one-trial.yaml"
    path.write_text(f"""\
name: one-trial
inventory: {REPO / 'inventory/local'}
hosts: all
remote_dir: {work / 'remote'}
experiments:
  - kind: selftest
    modes: [noop]
""")
    return path


def _extravars(work: Path) -> Path:
    """What the runner passes the trial's playbook (runner/campaign.py's _extravars), as a file."""
    path = work / "extravars.json"
    results = work / "bare-results"
    path.write_text(json.dumps({
        "exp_campaign": "one-trial", "exp_trial_id": "selftest.noop.r1@localhost", "exp_experiment": "selftest",
        "exp_kind": "selftest", "exp_mode": "noop", "exp_params": {}, "exp_repeat": 1, "exp_engine": {},
        "exp_resources": {}, "exp_results_dir": str(results), "exp_remote_dir": str(work / "remote"),
        "exp_repo_dir": str(REPO), "exp_node": {}, "exp_timeout_s": 600, "exp_turn_file": "",
        "exp_turn_timeout_s": 0,
    }))
    return path


def checkout_bytecode() -> tuple[int, int]:
    """(modules of the runner, plugins and nodetools with current bytecode, all of them): a .pyc
    counts where its header names the source's mtime and size, as the import system checks it."""
    sources = [p for top in ("runner", "plugins", "nodetools") for p in (REPO / top).rglob("*.py")]
    current = 0
    for source in sources:
        try:
            header = Path(importlib.util.cache_from_source(str(source))).read_bytes()[:16]
        except OSError:
            continue
        st = source.stat()
        current += (header[:4] == importlib.util.MAGIC_NUMBER and header[4:8] == bytes(4)
                    and int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                    and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF)
    return current, len(sources)


def _timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed (rc={done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measure(runs: int, cold: bool = False) -> dict[str, object]:
    bin_dir = Path(sys.executable).parent
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        campaign, extravars = _campaign(work), _extravars(work)
        bare_argv = [str(bin_dir / "ansible-playbook"), "-i", str(REPO / "inventory/local"), PLAYBOOK,
                     "-e", f"@{extravars}"]
        runner_argv = [sys.executable, "-m", "runner", str(campaign), "--quiet"]

        def campaign_run(name: str) -> tuple[float, float]:
            os.environ["GPU_CAMPAIGN_CACHE"] = str(work / (f"cache-{name}" if cold else "cache"))
            return _timed([*runner_argv, "--results", str(work / name)])

        bare, runner = [], []
        _timed(bare_argv)  # warm the page cache of both: the first run of each reads its files from disk
        campaign_run("warm")  # and fills the runner's cache
        for i in range(runs):
            bare.append(_timed(bare_argv))
            runner.append(campaign_run(f"r{i}"))
        read = sum("host_facts_age_s" not in json.loads(p.read_text())
                   for p in work.glob("r*/trials/*/trial.json"))
    bare_s, runner_s = statistics.median(w for w, _ in bare), statistics.median(w for w, _ in runner)
    bare_cpu, runner_cpu = statistics.median(c for _, c in bare), statistics.median(c for _, c in runner)
    # CPU seconds too: on a shared machine the wall time depends on what else runs, and the campaign's
    # two playbooks overlap only where a core is free.
    return {"runs": runs, "load_average_before": round(load_before, 2), "load_average": round(os.getloadavg()[0], 2),
            "bytecode_cache": not sys.flags.dont_write_bytecode, "checkout_bytecode": list(checkout_bytecode()),
            "cold_cache": cold, "facts_read_in_runs": read,
            "bare_ansible_playbook_s": round(bare_s, 3),
            "one_trial_campaign_s": round(runner_s, 3), "ratio": round(runner_s / bare_s, 2),
            "bare_cpu_s": round(bare_cpu, 2), "campaign_cpu_s": round(runner_cpu, 2), "target_ratio": TARGET_RATIO,
            "bare_all_s": [round(w, 3) for w, _ in bare], "campaign_all_s": [round(w, 3) for w, _ in runner]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="every campaign starts with an empty runner cache")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(max(1, args.runs), args.cold)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    compiled, modules = result["checkout_bytecode"]
    print(f"load average {result['load_average_before']:.2f} before, {result['load_average']:.2f} after; medians of "
          f"{result['runs']} alternating runs; bytecode cache {'on' if result['bytecode_cache'] else 'off'}; "
          f"checkout byte-compiled: {compiled} of {modules} modules (scripts/setup.sh compiles them)")
    print(f"bare ansible-playbook {PLAYBOOK}: {result['bare_ansible_playbook_s']:.2f} s")
    cache = "each run with an empty runner cache" if result["cold_cache"] else "else from the warm-up run's cache"
    print(f"one-trial campaign (python -m runner, facts, trial, record, report): "
          f"{result['one_trial_campaign_s']:.2f} s; the host's facts read in {result['facts_read_in_runs']} of "
          f"{result['runs']} runs ({cache})")
    print(f"ratio {result['ratio']:.2f}x (target <= {TARGET_RATIO}x); CPU seconds: bare {result['bare_cpu_s']:.2f}, "
          f"campaign {result['campaign_cpu_s']:.2f}")


if __name__ == "__main__":
    main()
