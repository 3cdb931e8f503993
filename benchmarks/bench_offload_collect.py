"""An offload trial's collect phase alone: its playbook against a trial folder that holds the files
a real trial leaves (sizes of the H200's runs), on the local inventory and, when this is root with
openssh-server, over SSH to a loopback sshd host (tests/support/sshd_hosts.py).

The collect stops leftovers, reads the node's facts after the trial and brings every file home;
this times ``ansible-playbook playbooks/experiments/offload/collect.yml`` with the extra variables
the runner passes a trial of ``campaigns/offload-local.yaml`` (mode native_cpu), and checks that
every file arrived under the name the runner planned. ``--playbook`` times another version of the
playbook (an older one, to compare; it must sit in the same folder for its vars_files).

    .venv/bin/python benchmarks/bench_offload_collect.py [--runs 5] [--no-ssh] [--playbook PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runner.plan import expand  # noqa: E402
from runner.spec import load_campaign  # noqa: E402
from tests.support.sshd_hosts import SSHD, SshHostSet  # noqa: E402

PLAYBOOK = REPO / "playbooks/experiments/offload/collect.yml"
# What an offload trial on the H200 left in its folder (bytes, rounded): the engine's log is most of it.
SIZES = {"server.log": 2_000_000, "requests.jsonl": 300_000, "run.json": 40_000, "launch.json": 4_000,
         "preflight.json": 3_000, "facts_before.json": 12_000, "metrics_before.txt": 60_000,
         "metrics_after.txt": 60_000, "quality.jsonl": 20_000, "dmesg.txt": 2_000}


def _trial(work: Path, inventory: Path, host: str) -> dict[str, Any]:
    text = (REPO / "campaigns/offload-local.yaml").read_text()
    text = text.replace("inventory: ../inventory/local", f"inventory: {inventory}").replace("hosts: all",
                                                                                               f"hosts: {host}")
    text = text.replace("remote_dir: /tmp/gpu-campaign", f"remote_dir: {work / 'remote'}")
    campaign = work / f"offload-{host}.yaml"
    campaign.write_text(text)
    trial = next(t for t in expand(load_campaign(campaign)).trials if t.mode == "native_cpu")
    return {"exp_campaign": "offload-local", "exp_trial_id": trial.id, "exp_experiment": trial.experiment,
            "exp_kind": trial.kind, "exp_mode": trial.mode, "exp_params": trial.params, "exp_repeat": 1,
            "exp_engine": trial.engine, "exp_resources": trial.resources.as_dict(), "exp_remote_dir": trial.remote_dir,
            "exp_node": trial.node.as_dict(), "exp_node_python": sys.executable, "exp_repo_dir": str(REPO),
            "exp_timeout_s": 600, "exp_turn_file": "", "exp_turn_timeout_s": 0}


def _files(remote_dir: Path) -> None:
    """The trial's files at their sizes; the JSON ones valid (the cleanup reads launch.json)."""
    remote_dir.mkdir(parents=True, exist_ok=True)
    for name, size in SIZES.items():
        pad = os.urandom(size // 2).hex()[:size]
        text = json.dumps({"pad": pad}) if name.endswith(".json") else pad
        (remote_dir / name).write_text(text)


def run(playbook: Path, inventory: Path, host: str, runs: int, work: Path) -> list[float]:
    extravars = _trial(work, inventory, host)
    walls = []
    for i in range(runs + 1):  # the first run warms the page cache: not counted
        results = work / f"results-{host}-{i}"
        raw = results / "raw" / host
        raw.mkdir(parents=True)
        _files(Path(extravars["exp_remote_dir"]))
        varfile = work / "extravars.json"
        varfile.write_text(json.dumps({**extravars, "exp_results_dir": str(results)}))
        started = time.monotonic()
        done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                               "-l", host, str(playbook), "-e", f"@{varfile}"], cwd=REPO, capture_output=True,
                              text=True, check=False, env={**os.environ, "PYTHONPATH": str(REPO)})  # as the runner
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"collect failed (rc={done.returncode}):\n{done.stdout[-3000:]}")
        missing = sorted(set(SIZES) - {p.name for p in raw.iterdir()})
        if missing or not (raw / "facts_after.json").is_file():
            raise SystemExit(f"collect left out {missing or 'facts_after.json'} in {raw}")
        if i:
            walls.append(wall)
    return walls


def describe(label: str, walls: list[float]) -> None:
    print(f"{label:<6} runs={len(walls)} median={statistics.median(walls):.2f} s "
          f"min={min(walls):.2f} max={max(walls):.2f} (load average {os.getloadavg()[0]:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-ssh", action="store_true")
    parser.add_argument("--playbook", type=Path, default=PLAYBOOK)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        describe("local", run(args.playbook.resolve(), REPO / "inventory/local", "localhost", args.runs, work))
        if args.no_ssh or os.geteuid() != 0 or not SSHD.exists():
            return
        hosts = SshHostSet(work / "sshd", count=1).start()
        try:
            inventory = hosts.write_inventory(work / "inventory/hosts.yml")
            describe("ssh", run(args.playbook.resolve(), inventory, "h1", args.runs, work))
        finally:
            hosts.stop()


if __name__ == "__main__":
    main()
