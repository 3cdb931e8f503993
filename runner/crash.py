"""The last resort: an exception nothing expected becomes one line, and its traceback a file.

Every expected problem has its own error and exit code (``cli``); anything else is a bug. The
user gets one line naming the exception and the place in the runner it came from, and where the
full traceback is: a ``crash-<time>-<pid>.log`` in the results folder when one is known and
writable, else a private temporary file.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from runner.files import atomic_write_text

__all__ = ["crash_line"]

_PACKAGE = Path(__file__).resolve().parent
_REPO = _PACKAGE.parent


def _where(exc: BaseException) -> str:
    """The innermost frame in the runner's own code (else the innermost of all), as FILE:LINE in FUNCTION."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(_PACKAGE)]
    frame = (ours or frames)[-1]
    path = Path(frame.filename).resolve()
    shown = path.relative_to(_REPO) if path.is_relative_to(_REPO) else path
    return f"{shown}:{frame.lineno} in {frame.name}"


def _what(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    text = "".join(c if c.isprintable() else " " for c in text)
    if len(text) > 200:
        text = text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _write(results: Path | None, text: str) -> Path:
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        if results is not None and results.is_dir() and not results.is_symlink():
            return atomic_write_text(results / name, text)
    except Exception:  # noqa: BLE001 -- a folder that refuses the log (full, read-only, no name): the temp file
        pass
    fd, tmp = tempfile.mkstemp(prefix="gpu-campaign-", suffix=f"-{name}")  # 0600: it may name private paths
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return Path(tmp)


def crash_line(exc: BaseException, results: Path | None, argv: list[str],
               scrub: Callable[[str], str] = str) -> str:
    """Write the crash log; return the one line to print (``scrub`` removes secret values)."""
    text = (f"command: python -m runner {shlex.join(argv)}\ntime: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n\n"
            + "".join(traceback.format_exception(exc)))
    try:
        where = f"the traceback is in {_write(results, scrub(text))}. This is a bug in the runner: please report " \
                "it with that file"
    except Exception as log_exc:  # noqa: BLE001 -- even /tmp refused: say so, still in one line
        where = f"no crash log could be written ({_what(log_exc)}). This is a bug in the runner: please report it"
    return f"error: internal error: {scrub(_what(exc))} at {_where(exc)}; {where}"
