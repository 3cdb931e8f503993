"""Real SSH test hosts for the integration suite, started once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sshd_hosts import SshHostSet


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshHostSet]:
    hosts = SshHostSet(tmp_path_factory.mktemp("sshd"), count=2).start()
    yield hosts
    hosts.stop()


@pytest.fixture
def ssh_inventory(ssh_hosts: SshHostSet, tmp_path: Path) -> Path:
    for host in ssh_hosts.hosts:  # a test may have stopped one
        host.stop()
        host.start()
    return ssh_hosts.write_inventory(tmp_path / "inventory" / "hosts.yml")
