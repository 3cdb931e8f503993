"""How to reach a host, from its inventory variables once Ansible has templated them."""

from __future__ import annotations

import getpass
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CONNECTION_VARS", "Connection", "connection_from"]

# The variables a connection is made of; only these are templated (others may name variables
# that exist only inside a play, such as ansible_playbook_python).
CONNECTION_VARS = ("ansible_connection", "ansible_host", "ansible_port", "ansible_user",
                   "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_ssh_common_args",
                   "ansible_ssh_extra_args", "ansible_host_key_checking", "ansible_ssh_host_key_checking")


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


def connection_from(name: str, v: Mapping[str, Any], host_key_checking: bool) -> Connection:
    """The connection the templated variables ``v`` describe; ValueError naming the variable
    (never its value) when one is not what Ansible would accept."""
    kind = str(v.get("ansible_connection", "ssh"))
    key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
    try:
        port = int(v.get("ansible_port", 22))
    except (TypeError, ValueError):
        raise ValueError("ansible_port is not a number") from None
    if not 0 < port < 65536:
        raise ValueError("ansible_port is not a port number (1-65535)")
    args: list[str] = []
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        try:
            args += shlex.split(str(v.get(var) or ""))
        except ValueError:
            raise ValueError(f"{var} has unbalanced quotes") from None
    if not _checks_host_keys(v, host_key_checking):
        args += ["-o", "StrictHostKeyChecking=no"]  # what Ansible itself does with this setting
    return Connection(
        host=name,
        kind="local" if kind == "local" else "ssh",
        address=str(v.get("ansible_host", name)),
        port=port,
        user=str(v.get("ansible_user", getpass.getuser())),
        key_file=str(key) if key else None,
        ssh_args=tuple(args),
    )


def _checks_host_keys(v: Mapping[str, Any], default: bool) -> bool:
    value = v.get("ansible_host_key_checking", v.get("ansible_ssh_host_key_checking"))
    if value is None:
        return default
    return str(value).lower() not in ("false", "no", "0", "off")
