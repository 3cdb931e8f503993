"""Stop what a killed run left on the node: the tools and engine process groups its leases name.

    python -m nodetools.reap --root DIR [--trial ID] [--grace-s 30] [--clear FOLDER [--clear-users]]

Every lease under ``--root`` (only trial ``--trial``'s when given) is stale by the time this runs:
what it names is stopped, SIGTERM then SIGKILL after ``--grace-s``, each process only once its
start time proved it is the one the lease recorded, and the lease is removed
(:mod:`nodetools.reaper` says how).

``--clear FOLDER`` then empties the trial's old folder, so nothing from an orphan mixes into the
next attempt; with ``--clear-users``, first this user's processes whose command line names a path
in that folder (a stray ``fio`` of an earlier storage attempt) are stopped the same way.

Prints JSON ``{"stopped": [...], "skipped": [...], "still_running": [...], "leases": [...],
"restored": [...], "cleared": [...]}``. Exit codes (nodetools.exitcodes): 0 done; 2 bad input; 3 something still runs
after SIGKILL. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nodetools import exitcodes
from nodetools.reaper import clear, reap

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.reap", description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, required=True, help="the lease folder (<campaign>/<host>/.leases)")
    p.add_argument("--trial", default=None, help="only this trial's leases")
    p.add_argument("--grace-s", type=float, default=30.0, help="SIGTERM to SIGKILL (30)")
    p.add_argument("--clear", type=Path, default=None, help="a trial folder to empty afterwards")
    p.add_argument("--clear-users", action="store_true",
                   help="first stop this user's processes whose command line names a path in --clear")
    args = p.parse_args(argv)
    if args.clear is not None:
        folder, root = args.clear.resolve(), args.root.resolve()
        if folder == Path(folder.anchor) or root == folder or folder in root.parents:
            sys.stderr.write(f"reap: refusing to clear {args.clear}: it holds the lease folder {args.root}\n")
            return exitcodes.BAD_INPUT
    elif args.clear_users:
        sys.stderr.write("reap: --clear-users needs --clear FOLDER\n")
        return exitcodes.BAD_INPUT
    out = reap(args.root, args.trial, args.grace_s)
    out["cleared"] = []
    if args.clear is not None:
        cleared = clear(args.clear, args.clear_users, args.grace_s)
        out["stopped"] += cleared["stopped"]
        out["still_running"] += cleared["still_running"]
        out["cleared"] = cleared["cleared"]
    sys.stdout.write(json.dumps(out) + "\n")
    if out["still_running"]:
        sys.stderr.write(f"reap: still running after SIGKILL: {'; '.join(out['still_running'])}\n")
        return exitcodes.DIED
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
