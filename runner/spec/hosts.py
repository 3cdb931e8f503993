"""The campaign's host pattern resolved through Ansible's inventory parser, or why it is refused."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["pattern_problem", "resolve_hosts"]

_PATTERN_TERM = re.compile(r"^[!&]?(?:[A-Za-z0-9_.*?\-]+(?:\[-?\d+(?::-?\d*)?\])?)$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.\-:\[\]%@]{1,200}$")


def pattern_problem(pattern: str) -> str:
    """Ansible reads a malformed pattern ('[', 'all[') as 'all': check the grammar ourselves."""
    terms = re.split(r"[,:](?![^\[]*\])", pattern)
    for term in terms:
        if term.lstrip("!&").startswith("~"):
            try:
                re.compile(term.lstrip("!&")[1:])
            except re.error as exc:
                return f"host pattern term {term!r}: not a valid regular expression ({exc})"
        elif not _PATTERN_TERM.match(term):
            return (f"host pattern term {term!r} is malformed (names, globs, ~regex, group[0] or group[0:2], "
                    "joined by ',' or ':', each may start with ! or &)")
    return ""


def resolve_hosts(inventory: Path, pattern: str) -> tuple[list[str], str]:
    """The hosts the pattern matches, or why the inventory or pattern is refused."""
    problem = pattern_problem(pattern)
    if problem:
        return [], problem
    if not inventory.is_dir() and not inventory.is_file():
        return [], f"inventory {inventory} is neither a file nor a folder"
    if inventory.is_file() and inventory.stat().st_size > 4 * 1024 * 1024:
        return [], f"inventory {inventory} is larger than 4 MiB: is it an Ansible inventory?"
    from runner.inventory import Inventory  # noqa: PLC0415 - ansible's import costs ~0.3 s: only when an inventory is read

    hosts = Inventory(inventory).hosts(pattern)
    odd = [h for h in hosts if not _HOST_NAME.match(h)]
    if odd:
        return [], (f"inventory {inventory} gives host {odd[0][:60]!r}, which is not a host name: "
                    "is it an Ansible inventory?")
    return hosts, ""
