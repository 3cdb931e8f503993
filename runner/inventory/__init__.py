"""Ansible's inventory, read with Ansible's own parser: which sources a run may read
(``sources``), host patterns matched with bounded work (``patterns``), the hosts and connection
settings they give (``reader``, which imports Ansible: loaded on first use, since that import
costs ~0.3 s) and the connection a log follower uses (``connection``).

Only reads; Ansible (through ``execute``) stays the only thing that changes a node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.inventory.connection import Connection
from runner.inventory.sources import (
    DATA_ONLY_PLUGINS,
    InventoryError,
    InventorySources,
    is_host_list,
    path_exists,
)

if TYPE_CHECKING:
    from runner.inventory.reader import Inventory

__all__ = ["DATA_ONLY_PLUGINS", "Connection", "Inventory", "InventoryError", "InventorySources", "is_host_list",
           "path_exists"]


def __getattr__(name: str) -> Any:
    if name == "Inventory":
        from runner.inventory.reader import Inventory  # noqa: PLC0415 - Ansible's import only when an inventory is read

        return Inventory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
