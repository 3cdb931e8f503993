"""Page-cache state of files on the node: how much is resident, fill it, drop it.

    python -m nodetools.pagecache resident PATH...   # prints the resident fraction (0..1) or "unknown"
    python -m nodetools.pagecache warm PATH...       # reads every file once (weights into the page cache)
    python -m nodetools.pagecache evict PATH...      # these files out of the page cache; prints JSON
    python -m nodetools.pagecache drop               # sync; echo 3 > /proc/sys/vm/drop_caches (root)

What each command does, and how the resident fraction is read: :mod:`nodetools.residency`.
Exit codes (nodetools.exitcodes): 0 done; 2 bad command line. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import json
import sys

from nodetools import exitcodes
from nodetools.residency import drop, evict, resident_fraction, warm

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command, paths = (args[0], args[1:]) if args else ("", [])
    if command == "resident" and paths:
        fraction = resident_fraction(paths)
        sys.stdout.write(f"{'unknown' if fraction is None else fraction}\n")
    elif command == "warm" and paths:
        sys.stdout.write(f"{warm(paths)}\n")
    elif command == "evict" and paths:
        sys.stdout.write(json.dumps(evict(paths)) + "\n")
    elif command == "drop" and not paths:
        drop()
    else:
        sys.stderr.write("usage: python -m nodetools.pagecache {resident PATH...|warm PATH...|evict PATH...|drop}\n")
        return exitcodes.BAD_INPUT
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
