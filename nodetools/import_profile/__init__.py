"""Python's own import profile of every process of an engine, one file per process.

The timer starts a Python engine with :func:`profile_env` (``PYTHONPROFILEIMPORTTIME=1`` and the
folder of this package's ``site/sitecustomize.py`` first on ``PYTHONPATH``) and its descriptor 2 on
:func:`start_file`, which gives each process a ``stderr-<pid>.txt`` in the trial's ``imports/``
folder for CPython's profile lines (descriptor 2), while Python's own ``sys.stderr`` stays on the
server log. A spawned interpreter writes its first few lines (before its ``sitecustomize`` runs:
CPython's own start-up modules, milliseconds) into its parent's file. While the engine starts,
the timer's watcher samples each file's size beside the process's CPU seconds and disk reads
(:mod:`nodetools.procwatch`), so the runner can tell which imports came before which log line.
After the stop, :func:`gather` writes them into one ``importtime.txt`` (a section ``# process
<pid> <role>`` per process, its lines as written, so the sampled sizes still point into it) and
copies the lines that are not the profile's (what C code wrote to stderr) into the server log.
Parsed by ``runner/parse/importtime.py``. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["MAX_FILE_BYTES", "PROFILE_FILE", "SITE_DIR", "gather", "imported_packages", "profile_env", "profile_file",
           "start_file"]

SITE_DIR = Path(__file__).resolve().parent / "site"
PROFILE_FILE = "importtime.txt"
MAX_FILE_BYTES = 16 * 1024 * 1024  # one process's profile is ~0.5 MB; more is not a profile
_DIR_VARIABLE = "NODETOOLS_IMPORT_PROFILE_DIR"
_LOG_VARIABLE = "NODETOOLS_STDERR_PATH"
_LINE = "import time:"
_ROLE_ORDER = {"api_server": 0, "engine_core": 1, "worker": 2}
_MODULE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *([A-Za-z_][\w]*)")
MAX_PROFILES_READ = 64


def profile_env(env: Mapping[str, str], folder: Path, log: Path) -> dict[str, str]:
    """``env`` with the import profile on: what the engine's processes inherit."""
    pythonpath = [str(SITE_DIR), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return {**env, "PYTHONPROFILEIMPORTTIME": "1", _DIR_VARIABLE: str(folder), _LOG_VARIABLE: str(log),
            "PYTHONPATH": os.pathsep.join(pythonpath)}


def profile_file(folder: Path, pid: int) -> Path:
    return folder / f"stderr-{pid}.txt"


def start_file(folder: Path) -> Path:
    """Descriptor 2 of the process the timer starts; its ``sitecustomize`` renames it to its pid's."""
    return folder / "stderr-start.txt"


def gather(folder: Path, roles: Mapping[int, str], out: Path, log: Path) -> dict[str, Any]:
    """One ``importtime.txt`` from the per-process files (the engine's main processes first), the
    other stderr lines appended to ``log`` under a note; the per-process files are removed."""
    files = []
    for path in folder.glob("stderr-*.txt"):
        try:
            pid = int(path.name[len("stderr-"):-len(".txt")])
        except ValueError:
            continue
        files.append((_ROLE_ORDER.get(roles.get(pid, "other"), 9), pid, path))
    summary: dict[str, Any] = {"processes": 0, "profile_lines": 0, "stderr_lines": 0, "too_large": []}
    with out.open("w", encoding="utf-8") as profile, log.open("a", encoding="utf-8") as server_log:
        for _, pid, path in sorted(files):
            role = roles.get(pid, "other")
            if path.stat().st_size > MAX_FILE_BYTES:
                summary["too_large"].append(pid)
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            profile.write(f"# process {pid} {role}\n{text}")
            if text and not text.endswith("\n"):
                profile.write("\n")
            other = [line for line in text.splitlines() if not line.startswith(_LINE)]
            if other:
                server_log.write(f"[nodetools] process {pid} ({role}) wrote to its stderr outside Python "
                                 f"(kept apart from the log while its import profile was taken):\n")
                server_log.write("\n".join(other) + "\n")
            summary["processes"] += 1
            summary["profile_lines"] += text.count(f"\n{_LINE}") + text.startswith(_LINE)
            summary["stderr_lines"] += len(other)
    for _, _, path in files:
        path.unlink(missing_ok=True)
    return summary


def imported_packages(profiles: Iterable[Path]) -> set[str]:
    """The top-level packages an engine imported, by the profiles of its earlier starts (at most
    ``MAX_PROFILES_READ`` files, each at most ``MAX_FILE_BYTES`` times 8: several processes')."""
    names: set[str] = set()
    for count, path in enumerate(profiles):
        if count >= MAX_PROFILES_READ:
            break
        try:
            if not path.is_file() or path.stat().st_size > 8 * MAX_FILE_BYTES:
                continue
            with path.open(encoding="utf-8", errors="replace") as fh:
                names.update(m.group(1) for m in map(_MODULE.match, fh) if m)
        except OSError:
            continue
    return names
