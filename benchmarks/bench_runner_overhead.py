"""The runner's own overhead per trial: a trial whose playbook does nothing (selftest noop).

Runs N noop trials on the local inventory (connection: local) and over SSH to a loopback sshd
test host (needs root and openssh-server), and prints the median and spread of the trial wall
time as the runner recorded it (trial start to trial.json written), plus the campaign wall time.

    .venv/bin/python benchmarks/bench_runner_overhead.py [--trials 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.cli import main as runner_main  # noqa: E402
from tests.support.sshd_hosts import SshHostSet  # noqa: E402


def run(inventory: Path, hosts: str, trials: int, work: Path) -> tuple[list[float], float]:
    campaign = work / f"bench-{hosts}.yaml"
    campaign.write_text(f"""\
name: bench-{hosts}
inventory: {inventory}
hosts: {hosts}
remote_dir: {work / 'remote'}
experiments:
  - kind: selftest
    modes: [noop]
    repeats: {trials}
""")
    results = work / f"results-{hosts}"
    started = time.monotonic()
    rc = runner_main([str(campaign), "--quiet", "--results", str(results), "--no-follow"])
    wall = time.monotonic() - started
    if rc != 0:
        raise SystemExit(f"benchmark campaign failed (rc={rc}); see {results}")
    durations = [json.loads(p.read_text())["duration_s"] for p in (results / "trials").glob("*/trial.json")]
    return durations, wall


def describe(label: str, durations: list[float], wall: float) -> None:
    q = statistics.quantiles(durations, n=4) if len(durations) >= 2 else [durations[0]] * 3
    print(f"{label:<6} trials={len(durations):<3} median={statistics.median(durations):.3f} s "
          f"p25={q[0]:.3f} p75={q[2]:.3f} min={min(durations):.3f} max={max(durations):.3f} "
          f"campaign wall={wall:.1f} s (includes one facts preflight)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        describe("local", *run(REPO / "inventory/local", "localhost", args.trials, work))
        hosts = SshHostSet(work / "sshd", count=1).start()
        try:
            inventory = hosts.write_inventory(work / "inventory/hosts.yml")
            describe("ssh", *run(inventory, "h1", args.trials, work))
        finally:
            hosts.stop()


if __name__ == "__main__":
    main()
