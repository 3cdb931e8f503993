"""Give this Python process an import profile of its own (nodetools/import_profile).

The engine's timer starts the engine with ``PYTHONPROFILEIMPORTTIME=1`` and this folder first on
``PYTHONPATH``, so every Python process of the engine (the API server, the EngineCore it spawns or
forks, their helpers) imports this module at start-up. CPython writes its import profile to file
descriptor 2. The timer starts the engine with descriptor 2 on ``stderr-start.txt`` in
``NODETOOLS_IMPORT_PROFILE_DIR`` (so the lines CPython writes before this module runs are kept
too); this module renames that file to ``stderr-<pid>.txt`` in the process that holds it, and in
every other process (spawned, or forked: again in the child) points descriptor 2 at a new
``stderr-<pid>.txt``. Python's own ``sys.stderr`` (tracebacks, warnings, logging) stays on the
server log, ``NODETOOLS_STDERR_PATH``. What else C code writes to descriptor 2 lands in the
process's file too; the timer copies it into the server log after the stop. A ``sitecustomize``
this one shadows (a distribution's) still runs. Nothing here may stop the engine: any failure
leaves the process as it was.
"""

import os
import sys

_DIR = "NODETOOLS_IMPORT_PROFILE_DIR"
_LOG = "NODETOOLS_STDERR_PATH"


def _own_file() -> str:
    return os.path.join(os.environ[_DIR], f"stderr-{os.getpid()}.txt")


def _route() -> None:
    fd = os.open(_own_file(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def _setup() -> None:
    if not os.environ.get(_DIR) or not os.environ.get(_LOG):
        return
    stream = open(os.environ[_LOG], "a", buffering=1, encoding="utf-8", errors="backslashreplace")
    start = os.path.join(os.environ[_DIR], "stderr-start.txt")
    try:
        held = os.stat(start)
        mine = os.fstat(2)
        first = (held.st_dev, held.st_ino) == (mine.st_dev, mine.st_ino)
    except OSError:
        first = False
    if first:  # the process the timer started: its whole profile, the early lines too, in one file
        os.rename(start, _own_file())
    else:
        _route()
    sys.stderr = stream
    os.register_at_fork(after_in_child=_route)


def _chain() -> None:
    """Run the ``sitecustomize`` this module shadows, as Python would have."""
    import importlib.machinery  # noqa: PLC0415 - only here: the start-up of every engine process pays for it
    import importlib.util  # noqa: PLC0415 - as above

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


try:
    _setup()
except Exception:  # noqa: BLE001 - the profile is optional; the engine must start
    pass
_chain()
