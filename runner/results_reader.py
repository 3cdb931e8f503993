"""Read what a results folder holds: regular files inside the folder only, bounded, typed.

A results folder is data people copy, edit, sync and break. A FIFO named ``facts.json`` hung
``--plan`` and ``report``, a symbolic link to ``/dev/zero`` grew the runner to 23 GB, a trial.json
nested 100,000 deep or holding a list where a mapping belongs ended in a traceback. Every file
under a results folder is read here: not followed through a symbolic link, never a FIFO or a
device, at most ``LIMITS`` bytes and nesting levels, checked against the shape its readers
expect. A file that fails is reported and moved to ``quarantine/`` under the folder (nothing is
deleted); the caller goes on without it (a resume runs the trial again, a report shows it pending).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["LIMITS", "LOCK_NAME", "QUARANTINE", "RESERVE_NAME", "ResultsReader", "Shape", "shape_problem"]

logger = logging.getLogger(__name__)

QUARANTINE = "quarantine"  # where files that could not be used are moved
LOCK_NAME = ".lock"  # the folder's lock (runner/results_lock.py): inside it, so any path to it finds it
RESERVE_NAME = ".reserve"  # room kept while a run writes, freed to record a stop on a full disk
# A plan of the 10,000-trial maximum is ~20 MB of JSON; a trial.json with its host's facts ~50 KB.
LIMITS = {"json_bytes": 64 * 2**20, "text_bytes": 64 * 2**10, "depth": 64, "entries": 100_000}

# A shape: a type (or tuple of types) a value must be; a dict of key -> shape for a mapping (a key
# ending in "!" is required and never null; the others are checked where present and not null); a
# one-item list for a list of that shape.
Shape = type | tuple[type, ...] | dict[str, Any] | list[Any]
_NUMBER = (int, float)


def _type_name(shape: Any) -> str:
    if isinstance(shape, dict):
        return "a mapping"
    if isinstance(shape, list):
        return "a list"
    types = shape if isinstance(shape, tuple) else (shape,)
    names = {dict: "a mapping", list: "a list", str: "text", int: "an integer", float: "a number", bool: "true/false",
             type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _is(value: Any, shape: Any) -> bool:
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in types:  # JSON true is no number
        return False
    return isinstance(value, types)


def shape_problem(value: Any, shape: Shape, where: str = "") -> str | None:
    """Why ``value`` does not have ``shape`` (naming the key path), or None. Iterative: the depth
    is bounded before this runs, but a list of 100,000 items must not recurse either."""
    stack: list[tuple[Any, Any, str]] = [(value, shape, where)]
    while stack:
        v, s, at = stack.pop()
        if isinstance(s, dict):
            if not isinstance(v, dict):
                return f"{at or 'the top level'} is {_describe(v)}, not a mapping"
            for key, sub in s.items():
                name = key.rstrip("!")
                if v.get(name) is not None:
                    stack.append((v[name], sub, f"{at}.{name}" if at else name))
                elif key.endswith("!"):
                    return f"{f'{at}.' if at else ''}{name} is missing or null"
        elif isinstance(s, list):
            if not isinstance(v, list):
                return f"{at or 'the top level'} is {_describe(v)}, not a list"
            stack.extend((item, s[0], f"{at}[{i}]") for i, item in enumerate(v))
        elif not _is(v, s):
            return f"{at or 'the top level'} is {_describe(v)}, not {_type_name(s)}"
    return None


def _describe(value: Any) -> str:
    return _type_name(type(value)) if not isinstance(value, bool) else "true/false"


_CONTAINERS = (dict, list)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels. Level by level: no tuple per value
    (a report reads 10,000 trial.json and a plan of ~40 MB through here)."""
    if not isinstance(value, _CONTAINERS):
        return False
    level = [value]
    for _ in range(limit):
        deeper: list[Any] = []
        for v in level:
            deeper += [c for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, _CONTAINERS)]
        if not deeper:
            return False
        level = deeper
    return True


class Unreadable(Exception):
    """A results file that cannot be used; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link (results files are read only as regular files inside their folder)"
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO, not a regular file (never read: it would block)"
    return "a socket or device, not a regular file (never read)"


class ResultsReader:
    """Reads files under ``root``; ``quarantine`` moves a file that fails aside (``--plan`` only
    reads). Every problem is logged and kept in ``problems`` (one line each) for the report."""

    def __init__(self, root: Path, *, quarantine: bool = True) -> None:
        self.root = Path(os.path.realpath(root))
        self.quarantine = quarantine
        self.problems: list[str] = []

    # --- reading ------------------------------------------------------------------------------

    def json(self, rel: str | Path, shape: Shape | None = None,
             check: Callable[[Any], str | None] | None = None) -> Any | None:
        """The file's JSON value; None when the file is absent or unusable (then reported)."""
        path = self._path(rel)
        try:
            raw = self._read(path, LIMITS["json_bytes"])
            if raw is None:
                return None
            value = _parse_json(raw)
            problem = shape_problem(value, shape) if shape is not None else None
            if problem is None and check is not None:
                problem = check(value)
            if problem is not None:
                raise Unreadable(f"has the wrong shape: {problem}")
        except Unreadable as exc:
            self._unusable(path, exc.reason)
            return None
        return value

    def text(self, rel: str | Path, limit: int = LIMITS["text_bytes"]) -> str | None:
        """The file's text (undecodable bytes replaced); None when absent or unusable."""
        path = self._path(rel)
        try:
            raw = self._read(path, limit)
        except Unreadable as exc:
            self._unusable(path, exc.reason)
            return None
        return None if raw is None else raw.decode("utf-8", errors="replace")

    def folders(self, rel: str | Path) -> Iterator[str]:
        """Names of the sub-folders of ``rel``, sorted, at most ``LIMITS['entries']``; a ``rel``
        that is not a folder is reported (and moved aside); other entries are skipped."""
        path = self._path(rel)
        try:
            info = path.lstat()
        except FileNotFoundError:
            return iter(())
        except OSError as exc:
            self._unusable(path, f"cannot be read: {exc.strerror}")
            return iter(())
        if not stat.S_ISDIR(info.st_mode):
            self._unusable(path, f"is {_kind_of(info.st_mode)}" if stat.S_ISLNK(info.st_mode)
                           else "is not a folder")
            return iter(())
        names = []
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if len(names) >= LIMITS["entries"]:
                        self._report(path, f"holds more than {LIMITS['entries']} entries: the rest are left out")
                        break
                    if entry.is_dir(follow_symlinks=False):
                        names.append(entry.name)
        except OSError as exc:
            self._report(path, f"cannot be listed: {exc.strerror}")
        return iter(sorted(names))

    def only_files(self, rel: str | Path, max_depth: int = 8) -> None:
        """Move aside every entry under the folder ``rel`` that is neither a regular file nor a
        folder (a FIFO, a device, a socket, a symbolic link), so a kind's collect that opens the
        trial's raw files can neither hang nor read outside the folder; at most
        ``LIMITS['entries']`` entries are looked at."""
        seen = 0
        todo = [(self._path(rel), 0)]
        while todo:
            folder, depth = todo.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                if seen > LIMITS["entries"]:
                    self._report(folder, f"holds more than {LIMITS['entries']} entries: the rest are not checked")
                    return
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode) and depth < max_depth:
                    todo.append((Path(entry.path), depth + 1))
                elif not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
                    self._unusable(Path(entry.path), f"is {_kind_of(info.st_mode)}")

    def ensure_folder(self, rel: str | Path) -> None:
        """Move aside whatever sits where the folder ``rel`` belongs (``trials/`` replaced by a
        file), so that the run can create it."""
        path = self._path(rel)
        try:
            info = path.lstat()
        except OSError:
            return
        if not stat.S_ISDIR(info.st_mode):
            self._unusable(path, "is not a folder")

    # --- internals ----------------------------------------------------------------------------

    def _path(self, rel: str | Path) -> Path:
        path = Path(rel)
        return path if path.is_absolute() else self.root / path

    def _inside(self, path: Path) -> bool:
        parent = os.path.realpath(path.parent)
        return parent == str(self.root) or parent.startswith(str(self.root) + os.sep)

    def _read(self, path: Path, limit: int) -> bytes | None:
        try:
            info = path.lstat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise Unreadable(f"cannot be read: {exc.strerror}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"is {_kind_of(info.st_mode)}")
        if not self._inside(path):
            raise Unreadable("lies outside the results folder (a folder on its way is a symbolic link)")
        if info.st_size > limit:
            raise Unreadable(f"is {info.st_size} bytes: over the {limit}-byte limit")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise Unreadable(f"cannot be read: {exc.strerror}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped between lstat and open
                raise Unreadable("is not a regular file")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise Unreadable(f"cannot be read: {exc.strerror}") from exc
        finally:
            os.close(fd)
        if size > limit:
            raise Unreadable(f"grew past the {limit}-byte limit while it was read")
        return b"".join(chunks)

    def _unusable(self, path: Path, reason: str) -> None:
        where = self._quarantine(path) if self.quarantine else ""
        self._report(path, reason + (f"; moved to {where}" if where else ""))

    def _report(self, path: Path, reason: str) -> None:
        line = f"{self._rel(path)}: {reason}"
        self.problems.append(line)
        logger.warning("results folder %s: %s", self.root, line)

    def _rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def _quarantine(self, path: Path) -> str:
        """Move ``path`` (the entry itself, never what a link names) under ``quarantine/``;
        returns where to, or "" when it could not be moved (a read-only folder: reported only)."""
        rel = self._rel(path)
        if Path(rel).is_absolute() or not self._inside(path):  # never move what lies outside the folder
            return ""
        dest = self.root / QUARANTINE / rel
        n = 1
        while os.path.lexists(dest):
            dest = dest.with_name(f"{Path(rel).name}.{n}")
            n += 1
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            path.rename(dest)
        except OSError as exc:
            logger.debug("could not move %s aside: %s", path, exc)
            return ""
        return str(dest.relative_to(self.root))


def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise Unreadable("is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from exc
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise Unreadable(f"nests deeper than {LIMITS['depth']} levels") from exc
    except ValueError as exc:  # JSONDecodeError: truncated, not JSON
        raise Unreadable(f"is not valid JSON: {exc}") from exc
    if _too_deep(value, LIMITS["depth"]):
        raise Unreadable(f"nests deeper than {LIMITS['depth']} levels")
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise Unreadable("holds a \\ud800-\\udfff escape that is no pair: text no UTF-8 file can hold")
    return value


# JSON may escape half a UTF-16 pair ("\ud800"): Python reads it as a lone surrogate, which every
# UTF-8 write of it (summary.csv, report.md) then refused: a report ended in a traceback.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False
