# SPDX-License-Identifier: MIT
"""Print what a Python has installed, as JSON: {"python": "3.12", "platform": ..., "packages": {name: version}}.

Run with ``python -I`` on the node so PYTHONPATH and the user's site do not leak in: the
controller builds the wheelhouse for exactly this interpreter minus these packages. Optional
arguments are extra folders to read (a ``--target`` folder the engine's PYTHONPATH will hold);
``--no-packages`` reports the interpreter alone (a venv the role makes and fills: what it
installed there must not count as the node's, or the next run would build another wheelhouse).
"""

import importlib.metadata
import json
import os
import re
import sys
import sysconfig


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    found: dict[str, str] = {}
    places = [] if sys.argv[1:2] == ["--no-packages"] else [*sys.argv[1:], None]
    for path in places:
        dists = importlib.metadata.distributions(path=[path]) if path else importlib.metadata.distributions()
        for dist in dists:
            name = dist.metadata["Name"]
            if name:
                found.setdefault(canonical(name), dist.version)
    print(json.dumps({
        "python": "%d.%d" % sys.version_info[:2],
        "python_full": "%d.%d.%d" % sys.version_info[:3],
        "platform": sysconfig.get_platform(),
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None,
        "executable": sys.executable,
        "packages": dict(sorted(found.items())),
    }, indent=1))


if __name__ == "__main__":
    main()
