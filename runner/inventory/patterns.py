"""Host patterns (a campaign's ``hosts:``, ``-l``) checked for their grammar, and matched with
bounded work.

Ansible reads a malformed pattern ('[', 'all[') as 'all', so the grammar is checked here first.
A ``~regex`` term is matched by Python's backtracking ``re``, where ``~(.*.*.*.*.*.*)*X`` never
ends on a host name; no regex engine here can be interrupted, so a pattern with a regex term is
matched in a forked child that is killed past a time limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path

from runner.files import NotRegularFile, open_regular, read_at_most
from runner.inventory.sources import InventoryError

__all__ = ["MATCH_TIME_LIMIT_S", "has_regex", "limit_patterns", "match_bounded", "pattern_problem"]

MATCH_TIME_LIMIT_S = 3.0
_MAX_LIMIT_FILE = 1024 * 1024
_MAX_PATTERN = 4096
_PATTERN_TERM = re.compile(r"^[!&]?(?:[A-Za-z0-9_.*?\-]+(?:\[-?\d+(?::-?\d*)?\])?)$")


def _terms(pattern: str) -> list[str]:
    return re.split(r"[,:](?![^\[]*\])", pattern)


def pattern_problem(pattern: str) -> str:
    """Why a host pattern is malformed, or ""."""
    if len(pattern) > _MAX_PATTERN:
        return f"host pattern is longer than {_MAX_PATTERN} characters"
    for term in _terms(pattern):
        if term.lstrip("!&").startswith("~"):
            try:
                re.compile(term.lstrip("!&")[1:])
            except (re.error, RecursionError, OverflowError) as exc:
                return f"host pattern term {term[:80]!r}: not a valid regular expression ({exc})"
        elif not _PATTERN_TERM.match(term):
            return (f"host pattern term {term[:80]!r} is malformed (names, globs, ~regex, group[0] or group[0:2], "
                    "joined by ',' or ':', each may start with ! or &)")
    return ""


def has_regex(patterns: list[str]) -> bool:
    return any(term.lstrip("!&").startswith("~") for p in patterns for term in _terms(p))


def limit_patterns(limit: str) -> list[str]:
    """``-l`` as Ansible reads it: comma-separated patterns, and ``@FILE`` for one pattern a line
    (read here within bounds: a FIFO or /dev/zero is refused, not read)."""
    out: list[str] = []
    for part in (p.strip() for p in limit.split(",")):
        if not part.startswith("@"):
            out.append(part)
            continue
        out.extend(line.strip() for line in _read_limit_file(Path(part[1:])).split("\n"))
    patterns = [p for p in out if p]
    for pattern in patterns:
        problem = pattern_problem(pattern)
        if problem:
            raise InventoryError(problem)
    return patterns


def _read_limit_file(path: Path) -> str:
    try:
        with open_regular(path) as fh:
            if os.fstat(fh.fileno()).st_size > _MAX_LIMIT_FILE:
                raise InventoryError(f"limit file {path} is larger than {_MAX_LIMIT_FILE // 1024} KiB")
            return read_at_most(fh, _MAX_LIMIT_FILE).decode()
    except NotRegularFile as exc:
        raise InventoryError(f"limit file {path} is {exc.kind}, not a regular file") from exc
    except OSError as exc:
        raise InventoryError(f"cannot read limit file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InventoryError(f"limit file {path} is not UTF-8 text") from exc


def match_bounded(match: Callable[[], list[str]], seconds: float | None = None) -> list[str]:
    """``match()`` run in a forked child, killed after ``seconds`` (``MATCH_TIME_LIMIT_S``); its
    ``InventoryError`` (or any error, as one line) comes back as an ``InventoryError``."""
    seconds = MATCH_TIME_LIMIT_S if seconds is None else seconds
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, and leave without running the parent's cleanup
        try:
            os.close(read_fd)
            try:
                payload = {"hosts": match()}
            except Exception as exc:  # noqa: BLE001 - every failure travels back as one line
                payload = {"error": " ".join(str(exc).split()) or type(exc).__name__}
            with os.fdopen(write_fd, "w") as fh:
                json.dump(payload, fh)
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        data = _read_until(read_fd, time.monotonic() + seconds)
    finally:
        os.close(read_fd)
    if data is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise InventoryError(f"matching the host pattern took more than {seconds:g} s (a regular expression with "
                             "nested repetition, such as (.*)*, can take forever): refused")
    os.waitpid(pid, 0)
    try:
        result = json.loads(data)
    except ValueError as exc:
        raise InventoryError("matching the host pattern failed without an answer") from exc
    if "error" in result:
        raise InventoryError(str(result["error"]))
    return [str(h) for h in result["hosts"]]


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes, or None when the deadline passes first."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
