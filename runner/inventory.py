"""Read an Ansible inventory with Ansible's own parser: host patterns and connection settings.

Only reads; Ansible (through ``execute``) stays the only thing that changes a node.
"""

from __future__ import annotations

import getpass
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible import constants
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

__all__ = ["Connection", "Inventory"]


@dataclass(frozen=True)
class Connection:
    """How to reach a host, as the inventory says (for following a log over SSH)."""

    host: str
    kind: str  # "local" or "ssh"
    address: str
    port: int
    user: str
    key_file: str | None
    ssh_args: tuple[str, ...] = ()  # the inventory's ssh common/extra args, and Ansible's host-key setting


class Inventory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._loader = DataLoader()
        self._manager = InventoryManager(loader=self._loader, sources=[str(path)])
        self._vars = VariableManager(loader=self._loader, inventory=self._manager)

    def hosts(self, pattern: str) -> list[str]:
        """Host names the pattern matches, in inventory order (empty when none)."""
        return [h.name for h in self._manager.get_hosts(pattern=pattern)]

    def host_vars(self, name: str) -> dict[str, Any]:
        host = self._manager.get_host(name)
        return dict(self._vars.get_vars(host=host, include_hostvars=False)) if host else {}

    def connection(self, name: str) -> Connection:
        v = self.host_vars(name)
        kind = str(v.get("ansible_connection", "ssh"))
        key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
        args = [*shlex.split(str(v.get("ansible_ssh_common_args") or "")),
                *shlex.split(str(v.get("ansible_ssh_extra_args") or ""))]
        if not _host_key_checking(v):
            args += ["-o", "StrictHostKeyChecking=no"]  # what Ansible itself does with this setting
        return Connection(
            host=name,
            kind="local" if kind == "local" else "ssh",
            address=str(v.get("ansible_host", name)),
            port=int(v.get("ansible_port", 22)),
            user=str(v.get("ansible_user", getpass.getuser())),
            key_file=str(key) if key else None,
            ssh_args=tuple(args),
        )


def _host_key_checking(host_vars: dict[str, Any]) -> bool:
    value = host_vars.get("ansible_host_key_checking", host_vars.get("ansible_ssh_host_key_checking"))
    if value is None:
        return bool(constants.HOST_KEY_CHECKING)
    return str(value).lower() not in ("false", "no", "0", "off")
