"""The campaign's hosts: its ``hosts:`` pattern in its inventory (or ``-i``), narrowed by ``-l``
as ``ansible-playbook`` narrows a play, through Ansible's inventory parser; or why not.

Each problem is a (where, message) pair: ``where`` is "hosts" or "inventory" (a key of the file)
unless the problem came from an option, which is then named ("-l h200-01", "-i inventory/site").
"""

from __future__ import annotations

import re

from runner.inventory import InventoryError, InventorySources
from runner.secrets import shown_name

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


def resolve_hosts(inventory: InventorySources, pattern: str, limit: str | None, inventory_option: str | None
                  ) -> tuple[list[str], list[tuple[str, str]]]:
    """The hosts, or the problems; ``inventory_option`` names ``-i`` when the sources came from it."""
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
    problems = [(where_inventory, f"inventory {inventory.describe()}: {p}")
                for p in (host_name_problem(h) for h in hosts) if p]
    return (hosts, []) if not problems else ([], problems[:1])
