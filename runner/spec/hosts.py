"""The campaign's hosts: its ``hosts:`` pattern in its inventory (or ``-i``), narrowed by ``-l``
as ``ansible-playbook`` narrows a play, through Ansible's inventory parser; or why not.

Each problem is a (where, message) pair: ``where`` is "hosts" or "inventory" (a key of the file)
unless the problem came from an option, which is then named ("-l h200-01", "-i inventory/site").

An inventory read as data only (the campaign file's) gives the same hosts for the same files,
pattern and limit under the same Ansible configuration: an earlier run's answer is taken from the
runner's cache (runner/user_cache.py), without importing Ansible (~0.25 s of a run's start).
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

from runner import __version__
from runner.inventory import InventoryError, InventorySources
from runner.inventory.sources import source_problem
from runner.secrets import shown_name
from runner.user_cache import cache_folder, entry_name, files_digest, read_entry, write_entry

__all__ = ["host_name_problem", "resolve_hosts"]

_HOST_NAME = re.compile(r"^[A-Za-z0-9_.\-:\[\]%@]{1,200}$")
_SHOWN_HOSTS = 5


def host_name_problem(name: str) -> str:
    """Why a host name cannot name the host's folder (results/<name>/hosts/<host>/), or ""."""
    if name in (".", ".."):
        return f"host {name!r} is not safe as a folder name (it names a folder that already exists)"
    if not _HOST_NAME.match(name):
        return (f"host {shown_name(name)} is not a host name (letters, digits and _ . - : [ ] % @, at most "
                "200; never '/', NUL or control characters): is it an Ansible inventory?")
    return ""


_CODE = Path(__file__).resolve().parents[1]
# What else decides which hosts Ansible's data-only plugins give: its configuration and this code.
_CONFIGS = ("ansible.cfg", "~/.ansible.cfg", "/etc/ansible/ansible.cfg")
_READERS = (_CODE / "inventory", _CODE / "spec" / "hosts.py")


def _cache_entry(inventory: InventorySources, pattern: str, limit: str | None) -> str | None:
    """The name of this selection's entry in the cache, or None: sources that other plugins may
    read (-i: a script may answer differently each time) or that may not be opened are not cached."""
    if inventory.enabled_plugins is None or any(source_problem(s, True) for s in inventory.sources):
        return None
    if limit and "@" in limit:  # -l @FILE: the file's hosts may change under the same text
        return None
    try:
        version = metadata.version("ansible-core")
        configs = [c for c in (os.environ.get("ANSIBLE_CONFIG"), *(Path(c).expanduser() for c in _CONFIGS)) if c]
        digests = [files_digest(inventory.sources), files_digest(configs), files_digest(_READERS)]
        if None in digests:  # too many files to hash: not cached
            return None
        settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("ANSIBLE_"))
        return entry_name("hosts", __version__, version, digests[0], pattern, limit, inventory.enabled_plugins,
                          digests[1], digests[2], settings)
    except (OSError, metadata.PackageNotFoundError):
        return None


def resolve_hosts(inventory: InventorySources, pattern: str, limit: str | None, inventory_option: str | None
                  ) -> tuple[list[str], list[tuple[str, str]]]:
    """The hosts, or the problems; ``inventory_option`` names ``-i`` when the sources came from it."""
    name = _cache_entry(inventory, pattern, limit)
    cached = read_entry(cache_folder("hosts"), name, {"hosts!": [str]}) if name else None
    if cached is not None:
        hosts, problems = cached["hosts"], []
    else:
        hosts, problems = _resolve(inventory, pattern, limit, inventory_option)
        if name and not problems:
            write_entry(cache_folder("hosts"), name, {"hosts": hosts})
    if problems:
        return [], problems
    problems = [(inventory_option or "inventory", f"inventory {inventory.describe()}: {p}")
                for p in (host_name_problem(h) for h in hosts) if p]
    return (hosts, []) if not problems else ([], problems[:1])


def _resolve(inventory: InventorySources, pattern: str, limit: str | None, inventory_option: str | None
             ) -> tuple[list[str], list[tuple[str, str]]]:
    """The hosts through Ansible's inventory parser, or the problems."""
    from runner.inventory import Inventory  # noqa: PLC0415 - Ansible's import only when an inventory is read

    where_inventory = inventory_option or "inventory"
    limit_label = f"-l {limit}" if limit is not None else "hosts"
    try:
        reader = Inventory(inventory)
    except InventoryError as exc:
        return [], [(where_inventory, str(exc))]
    try:
        wanted = reader.hosts(pattern)
    except InventoryError as exc:
        return [], [("hosts", str(exc))]
    if not wanted:
        return [], [("hosts", f"host pattern {pattern!r} matches no host in {inventory.describe()}")]
    hosts = wanted
    if limit is not None:
        try:
            hosts = reader.hosts(pattern, limit)
        except InventoryError as exc:
            return [], [(limit_label, str(exc))]
        if not hosts:
            shown = ", ".join(wanted[:_SHOWN_HOSTS]) + (", ..." if len(wanted) > _SHOWN_HOSTS else "")
            return [], [(limit_label, f"the limit leaves no host: the campaign's hosts {pattern!r} are {shown} in "
                         f"{inventory.describe()}, and the limit matches none of them (ansible-playbook -l "
                         "narrows a play's hosts, never adds to them)")]
    return hosts, []
