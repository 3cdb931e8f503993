"""The live-log follower reaches a host as Ansible would: its connection variables templated by
Ansible's own variable manager (``ansible_port: "{{ base_port }}"`` is legal inventory), and a
connection it cannot resolve is a warning, never an exception that stops the run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runner.inventory import Inventory
from runner.livelog import start_following

INVENTORY = """\
all:
  vars:
    base_port: 2222
    lab: example.internal
  hosts:
    h1:
      ansible_port: "{{ base_port }}"
      ansible_host: "{{ inventory_hostname }}.{{ lab }}"
      ansible_user: "{{ 'bench' }}"
      ansible_python_interpreter: "{{ ansible_playbook_python }}"  # a play's variable: never templated here
    h2:
      ansible_ssh_common_args: "-o ProxyJump={{ jump_host }}"
    h3:
      ansible_port: "twenty-two"
"""


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    return Inventory(tmp_path / "hosts.yml")


def test_connection_variables_are_templated_by_ansible(inventory: Inventory) -> None:
    conn = inventory.connection("h1")
    assert (conn.kind, conn.address, conn.port, conn.user) == ("ssh", "h1.example.internal", 2222, "bench")
    assert type(conn.port) is int and type(conn.address) is str


@pytest.mark.parametrize(("host", "message"), [
    ("h2", "ansible_ssh_common_args: 'jump_host' is undefined"),
    ("h3", "ansible_port is not a number"),
    ("nope", "host nope is not in the inventory"),
])
def test_an_unresolvable_connection_names_the_variable(inventory: Inventory, host: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        inventory.connection(host)


def test_following_a_host_it_cannot_reach_warns_once_and_goes_on(inventory: Inventory,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="runner.livelog"):
        assert start_following(inventory, "h2", "/tmp/server.log", lambda line: None) is None
        assert start_following(inventory, "h2", "/tmp/server.log", lambda line: None) is None
    assert [r.getMessage() for r in caplog.records] == [
        "not following the server log live on h2: ansible_ssh_common_args: 'jump_host' is undefined "
        "(the trial runs on)"]
