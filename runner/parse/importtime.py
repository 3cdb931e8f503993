"""Python's own import profile (``-X importtime`` / ``PYTHONPROFILEIMPORTTIME``), per process and
per top-level package.

CPython writes one line per imported module when the import finishes (children before their
parent), indented two spaces per level::

    import time: self [us] | cumulative | imported package
    import time:       179 |        179 |   _io
    import time:      3114 |    2199550 | pandas

The node's timer keeps one such profile per engine process in ``importtime.txt``, each section
headed ``# process <pid> <role>`` (``nodetools/import_profile``); a bare capture of one process's
stderr parses too (one section, role ``unknown``). Other lines (a process's other stderr output)
are skipped and counted. A package's ``self_s`` is the time spent in its own modules' bodies;
``cumulative_s`` the time of its outermost imports, which includes the other packages they pulled
in (``children_s``). The ``self_s`` of all packages add up to the process's ``total_s``.

Each line's end, in bytes from the start of its section, is kept: the timer sampled each profile
file's size while the engine started, so :func:`window` can say which imports finished between
two moments (the API server's imports before its first log line, say).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import ParseError

__all__ = ["MAX_PROFILE_BYTES", "ImportProfile", "parse_importtime", "read_importtime", "top_packages", "window"]

MAX_PROFILE_BYTES = 64 * 1024 * 1024  # a vLLM API server's profile is ~0.5 MB
STDLIB = "stdlib"  # Python's own modules, together (json, asyncio, encodings, ...)
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)\s*$")
_SECTION = re.compile(r"#\s*process\s+(\d+)\s+(\S+)")
_STDLIB_NAMES = frozenset(sys.stdlib_module_names) | {"_frozen_importlib", "_frozen_importlib_external"}


@dataclass
class _Node:
    module: str
    self_us: int
    cumulative_us: int
    children: list[_Node] = field(default_factory=list)


@dataclass
class ImportProfile:
    """One process's imports: ``packages`` maps a top-level package to ``self_s``,
    ``cumulative_s``, ``children_s`` and ``modules``."""

    pid: int | None = None
    role: str = "unknown"
    total_s: float = 0.0
    modules: int = 0
    packages: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped_lines: int = 0
    ends: list[tuple[int, int, str]] = field(default_factory=list, repr=False)  # (end byte, self us, module)

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "role": self.role, "total_s": round(self.total_s, 4), "modules": self.modules,
                "packages": self.packages, "skipped_lines": self.skipped_lines}


def package_of(module: str) -> str:
    top = module.split(".", 1)[0]
    return STDLIB if top in _STDLIB_NAMES else top


def _tree(lines: list[tuple[int, int, int, str]]) -> list[_Node]:
    """Roots of the import tree from post-order lines (self, cumulative, depth, module)."""
    pending: dict[int, list[_Node]] = {}  # depth -> finished nodes waiting for their parent
    for self_us, cumulative_us, depth, module in lines:
        node = _Node(module, self_us, cumulative_us, pending.pop(depth + 1, []))
        pending.setdefault(depth, []).append(node)
    roots = pending.pop(0, [])
    # A profile cut short (a process killed mid-import) leaves deeper nodes without a parent.
    for depth in sorted(pending):
        roots.extend(pending[depth])
    return roots


def _summarise(profile: ImportProfile, lines: list[tuple[int, int, int, str]]) -> None:
    packages: dict[str, dict[str, float]] = {}

    roots = _tree(lines)
    stack = [(root, frozenset[str]()) for root in reversed(roots)]
    while stack:  # iterative: an import chain thousands deep must not exhaust Python's stack
        node, inside = stack.pop()
        name = package_of(node.module)
        entry = packages.setdefault(name, {"self_s": 0.0, "cumulative_s": 0.0, "modules": 0})
        entry["self_s"] += node.self_us / 1e6
        entry["modules"] += 1
        if name not in inside:
            entry["cumulative_s"] += node.cumulative_us / 1e6
        stack.extend((child, inside | {name}) for child in reversed(node.children))
    profile.total_s = sum(root.cumulative_us for root in roots) / 1e6
    profile.modules = len(lines)
    for entry in packages.values():
        entry["children_s"] = round(max(0.0, entry["cumulative_s"] - entry["self_s"]), 4)
        entry["self_s"] = round(entry["self_s"], 4)
        entry["cumulative_s"] = round(entry["cumulative_s"], 4)
    profile.packages = dict(sorted(packages.items(), key=lambda kv: -kv[1]["self_s"]))


def parse_importtime(text: str) -> list[ImportProfile]:
    """Every process's profile in ``text``, in the order they appear."""
    sections: list[tuple[ImportProfile, list[tuple[int, int, int, str]]]] = []
    current: tuple[ImportProfile, list[tuple[int, int, int, str]]] | None = None
    offset = 0  # bytes into the current section, as the node's file had them
    for raw in text.splitlines():
        header = _SECTION.match(raw)
        if header:
            current = (ImportProfile(pid=int(header.group(1)), role=header.group(2)), [])
            sections.append(current)
            offset = 0
            continue
        offset += len(raw.encode("utf-8", "replace")) + 1
        found = _LINE.search(raw)
        if current is None:
            if found is None and not raw.startswith("import time: self"):
                continue  # a bare capture's lines before its first import
            current = (ImportProfile(), [])
            sections.append(current)
        if found is None:
            if not raw.startswith("import time: self"):  # CPython's header line is expected
                current[0].skipped_lines += 1
            continue
        depth = len(found.group(3)) // 2
        current[1].append((int(found.group(1)), int(found.group(2)), depth, found.group(4)))
        current[0].ends.append((offset, int(found.group(1)), found.group(4)))
    for profile, lines in sections:
        _summarise(profile, lines)
    return [profile for profile, lines in sections if lines or profile.pid is not None]


def read_importtime(path: Path) -> list[ImportProfile]:
    """The profiles of a file the node wrote; bounded, and a clear error for what is not one."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ParseError(str(path), "not a regular file")
        if size > MAX_PROFILE_BYTES:
            raise ParseError(str(path), f"{size} bytes, more than the {MAX_PROFILE_BYTES} an import profile may hold")
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise ParseError(str(path), str(exc.strerror or exc)) from exc
    return parse_importtime(text)


def top_packages(profile: ImportProfile, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` packages whose own modules took longest, with their share of the process's imports."""
    rows = []
    for name, entry in list(profile.packages.items())[:n]:
        share = entry["self_s"] / profile.total_s if profile.total_s else None
        rows.append({"package": name, **entry, "share": round(share, 3) if share is not None else None})
    return rows


def window(profile: ImportProfile, end_bytes: float | None, start_bytes: float = 0) -> dict[str, float]:
    """Seconds of each package's own module bodies among the imports that finished while the
    profile grew from ``start_bytes`` to ``end_bytes`` (None: to its end), costliest first."""
    out: dict[str, float] = {}
    for end, self_us, module in profile.ends:
        if end <= start_bytes or (end_bytes is not None and end > end_bytes):
            continue
        name = package_of(module)
        out[name] = out.get(name, 0.0) + self_us / 1e6
    return {k: round(v, 4) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
