"""Real SSH test hosts: one sshd per loopback address (127.0.0.N), key-only, started and stopped here.

They share this machine's filesystem and processes (only the address differs), so use them for
transport, failure and fetch behaviour, never for roles that change the system. Needs root and
openssh-server (``scripts/setup.sh --dev`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["SSHD", "SshHost", "SshHostSet"]

SSHD = Path("/usr/sbin/sshd")


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _wait_listening(address: str, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not start")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class SshHost:
    name: str
    address: str
    port: int
    workdir: Path

    @property
    def pidfile(self) -> Path:
        return self.workdir / f"sshd_{self.name}.pid"

    @property
    def config(self) -> Path:
        return self.workdir / f"sshd_{self.name}.conf"

    def start(self) -> None:
        Path("/run/sshd").mkdir(exist_ok=True)
        subprocess.run([str(SSHD), "-f", str(self.config), "-E", str(self.workdir / f"sshd_{self.name}.log")],
                       check=True)
        _wait_listening(self.address, self.port)

    def stop(self) -> None:
        """Kill the listener and every session it forked, as a node going away would.

        Sessions must die too: Ansible's ControlPersist would otherwise keep using them.
        """
        if not self.pidfile.exists():
            return
        pid = int(self.pidfile.read_text().split()[0])
        for victim in [*_descendants(pid), pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.address, self.port), timeout=0.2).close()
            except OSError:
                return
            time.sleep(0.05)


class SshHostSet:
    """N sshd hosts on 127.0.0.2.. with one client key and an inventory file for Ansible."""

    def __init__(self, workdir: Path, count: int = 2) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.key = workdir / "id_ed25519"
        self.hosts = [SshHost(f"h{i}", f"127.0.0.{i + 1}", 0, workdir) for i in range(1, count + 1)]

    def start(self) -> SshHostSet:
        if not SSHD.exists():
            raise RuntimeError(f"{SSHD} missing: install openssh-server (scripts/setup.sh --dev)")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        (self.workdir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        for host in self.hosts:
            host.port = _free_port(host.address)
            hostkey = self.workdir / f"hostkey_{host.name}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)], check=True)
            host.config.write_text("\n".join([
                f"Port {host.port}", f"ListenAddress {host.address}", f"HostKey {hostkey}",
                f"PidFile {host.pidfile}", f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
                "Subsystem sftp internal-sftp", "MaxStartups 100", "",
            ]))
            host.start()
        return self

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()

    def write_inventory(self, path: Path) -> Path:
        """An Ansible inventory naming every host (group ``nodes``) with this set's key."""
        hosts = {h.name: {"ansible_host": h.address, "ansible_port": h.port} for h in self.hosts}
        inventory = {"all": {"children": {"nodes": {"hosts": hosts}}, "vars": {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
        }}}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        return path
