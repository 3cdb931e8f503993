"""The node-side driver of one offload trial: protect the node, start, load, snapshot, stop, clean.

    python -m nodetools.offload_run clear-leftovers [--shm /dev/shm]
    python -m nodetools.offload_run preflight --facts FACTS.json|- --need JSON [--out preflight.json]
        [--facts-out facts.json]
    python -m nodetools.offload_run run --launch launch.json --dir WORKDIR --load JSON [--quality JSON]
        [--max-failed N] [--timeout-s 1800] [--phase-timeout-s S] [--poll-s 0.2] [--trial ID]
        [--lease-dir DIR] [--lock-dir DIR]
    python -m nodetools.offload_run cleanup --dir WORKDIR --port N [--shm /dev/shm] [--trial ID] [--lease-dir DIR]

``preflight`` (``nodetools.offload.preflight``) decides from the ``node_facts`` module's facts
(and ``docker ps``) whether the trial may run, and prints ``{"reasons": [...], "checks": {...}}``:
every reason carries its numbers. ``clear-leftovers`` (``nodetools.offload.leftovers``) removes
stale offload buffers and leftover engine containers (a campaign's ``cleanup: true``) before the
facts are read. ``run`` (``nodetools.offload.run``) starts the engine copies, drives the load and
the quality check and stops them; its exit codes are that module's. ``cleanup``
(``nodetools.offload.cleanup``) runs after every trial. The runner plans ``--need``, the launch and
the load (plan.json shows them); this command line only carries them. Stdlib and aiohttp only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nodetools import exitcodes
from nodetools.lease import add_claim_options
from nodetools.offload.cleanup import cleanup_trial, remove_trial_files
from nodetools.offload.layout import split_gpus
from nodetools.offload.leftovers import clear_leftovers, leftover_containers
from nodetools.offload.preflight import Need, preflight, preflight_node
from nodetools.offload.run import RunOptions, run_trial

# The names the tests and older callers import from here.
__all__ = ["Need", "clear_leftovers", "leftover_containers", "main", "preflight", "preflight_node",
           "remove_trial_files", "split_gpus"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nodetools.offload_run", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("clear-leftovers")
    c.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    f = sub.add_parser("preflight")
    f.add_argument("--facts", required=True, help="node_facts output: a JSON file, or - for stdin")
    f.add_argument("--need", required=True, help="JSON: what the trial asks of the node (Need)")
    f.add_argument("--out", type=Path, help="where to keep the result (its folder is created)")
    f.add_argument("--facts-out", type=Path, help="where to keep the facts it decided on")
    r = sub.add_parser("run")
    r.add_argument("--launch", type=Path, required=True)
    r.add_argument("--dir", type=Path, required=True)
    r.add_argument("--load", required=True, help="JSON: the Workload")
    r.add_argument("--quality", default="", help="JSON: the quality check (empty or enabled false: none)")
    r.add_argument("--max-failed", type=int, default=0)
    r.add_argument("--timeout-s", type=float, default=1800, help="per engine copy, to its first answer")
    r.add_argument("--phase-timeout-s", type=float, default=0,
                   help="the runner's limit on this phase: the wait for a copy ends 30 s before it")
    r.add_argument("--poll-s", type=float, default=0.2)
    add_claim_options(r)
    k = sub.add_parser("cleanup")
    k.add_argument("--dir", type=Path, required=True)
    k.add_argument("--port", type=int, required=True, help="the engine port, checked when nothing was launched")
    k.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    k.add_argument("--trial", default="", help="whose leases to reap (the folder's name)")
    k.add_argument("--lease-dir", type=Path, default=None, help="the lease folder (.leases beside --dir)")
    return p


def _preflight(args: argparse.Namespace) -> int:
    try:
        facts = json.loads(sys.stdin.read() if args.facts == "-" else Path(args.facts).read_text())
        need = Need.from_json(json.loads(args.need))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        sys.stderr.write(f"offload_run preflight: bad input: {exc}\n")
        return exitcodes.BAD_INPUT
    result = preflight_node(facts, need)
    for path, data in ((args.out, result), (args.facts_out, facts)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    sys.stdout.write(json.dumps(result) + "\n")
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "clear-leftovers":
        sys.stdout.write(json.dumps({"removed": clear_leftovers(args.shm)}) + "\n")
        return exitcodes.OK
    if args.command == "preflight":
        return _preflight(args)
    if args.command == "run":
        return run_trial(RunOptions(
            launch=args.launch, workdir=args.dir, load=args.load, quality=args.quality, max_failed=args.max_failed,
            timeout_s=args.timeout_s, phase_timeout_s=args.phase_timeout_s, poll_s=args.poll_s, trial=args.trial,
            lease_dir=args.lease_dir, lock_dir=args.lock_dir))
    result = cleanup_trial(args.dir, args.port, args.shm, args.trial, args.lease_dir)
    sys.stdout.write(json.dumps(result) + "\n")
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
