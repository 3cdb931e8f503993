"""An inventory read by Ansible's own parser, after the checks of ``sources``: the hosts a pattern
and limit select, and how to reach a host (its connection variables templated by Ansible).

Only reads; Ansible (through ``execute``) stays the only thing that changes a node. Ansible's
warnings while it reads are kept off the terminal (they can quote a file's content); what went
wrong comes back as one ``InventoryError`` line naming the file.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ansible import constants
from ansible.errors import AnsibleError, AnsibleUndefinedVariable
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader

from runner.inventory.connection import CONNECTION_VARS, Connection, connection_from
from runner.inventory.patterns import has_regex, limit_patterns, match_bounded, pattern_problem
from runner.inventory.sources import InventoryError, InventorySources, source_problem

__all__ = ["Inventory"]


class _Manager(InventoryManager):
    """Ansible's inventory manager with the sources' plugin list, recording each file no plugin
    could parse (Ansible itself only warns, and goes on without that file's hosts and vars)."""

    def __init__(self, loader: DataLoader, sources: InventorySources) -> None:
        self._enabled = sources.enabled_plugins
        self.unparsed: list[str] = []
        super().__init__(loader=loader, sources=list(sources.sources))

    def _fetch_inventory_plugins(self) -> list[Any]:
        if self._enabled is None:
            return super()._fetch_inventory_plugins()
        plugins = [inventory_loader.get(name) for name in self._enabled]
        return [p for p in plugins if p is not None]

    def parse_source(self, source: str, cache: bool = False) -> bool:
        parsed = bool(super().parse_source(source, cache=cache))
        if not parsed and not os.path.isdir(source):  # noqa: PTH112 -- never raises (a long host list)
            self.unparsed.append(str(source))
        return parsed


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Ansible's display writes warnings to sys.stderr; they may quote an inventory's content."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        yield


class Inventory:
    def __init__(self, sources: InventorySources | Path | str) -> None:
        if not isinstance(sources, InventorySources):
            sources = InventorySources.of([sources], from_command_line=False)
        data_only = not sources.from_command_line
        for source in sources.sources:
            problem = source_problem(source, data_only)
            if problem:
                raise InventoryError(problem)
        self.sources = sources
        self._loader = DataLoader()
        plugins = ", ".join(sources.enabled_plugins or ("Ansible's configured",))
        try:
            with _quiet():
                self._manager = _Manager(self._loader, sources)
        except (AnsibleError, OSError, UnicodeError, ValueError) as exc:
            raise InventoryError(f"inventory {sources.describe()}: Ansible cannot read it ({type(exc).__name__}; "
                                 f"`ansible-inventory -i SOURCE --list` says why)") from exc
        if self._manager.unparsed:
            first = self._manager.unparsed[0]
            raise InventoryError(f"inventory {first}: no inventory plugin ({plugins}) could read it "
                                 f"(`ansible-inventory -i {first} --list` says why)")
        self._vars: Any = None  # Ansible's VariableManager, made by the first connection()
        self._lock = threading.Lock()  # Ansible's inventory objects are not made for threads

    def hosts(self, pattern: str, limit: str | None = None) -> list[str]:
        """Host names the pattern matches within ``limit`` (``-l``), in inventory order, as
        ``ansible-playbook -l`` narrows a play's hosts; empty when none."""
        problem = pattern_problem(pattern)
        if problem:
            raise InventoryError(problem)
        limits = limit_patterns(limit) if limit is not None else None
        if limits is not None and not limits:
            raise InventoryError("the limit names no host pattern")

        def match() -> list[str]:
            self._manager.subset(limits)
            try:
                return [h.name for h in self._manager.get_hosts(pattern=pattern)]
            except AnsibleError as exc:
                raise InventoryError(" ".join(exc.message.split())) from exc
            finally:
                self._manager.subset(None)

        with self._lock, _quiet():
            return match_bounded(match) if has_regex([pattern, *(limits or [])]) else match()

    def connection(self, name: str) -> Connection:
        """How to reach ``name``: its connection variables templated as Ansible would template them
        in a play. ValueError (naming the variable, never its value) when one cannot be. Called
        from the run's threads: sys.stderr is left alone (the live display writes there)."""
        # Ansible's variables and templating (their imports ~0.05 s): only for a host's connection,
        # which a campaign asks for only to follow a log; the hosts' names need neither.
        from ansible.template import Templar  # noqa: PLC0415 - see above
        from ansible.vars.manager import VariableManager  # noqa: PLC0415 - see above

        with self._lock:
            host = self._manager.get_host(name)
            if host is None:
                raise ValueError(f"host {name} is not in the inventory")
            if self._vars is None:
                self._vars = VariableManager(loader=self._loader, inventory=self._manager)
            variables = self._vars.get_vars(host=host, include_hostvars=False)
            templar = Templar(loader=self._loader, variables=variables)
            resolved: dict[str, Any] = {}
            for key in CONNECTION_VARS:
                if key not in variables:
                    continue
                try:
                    resolved[key] = templar.template(variables[key])
                except AnsibleUndefinedVariable as exc:
                    raise ValueError(f"{key}: {' '.join(exc.message.split())}") from exc
                except AnsibleError as exc:
                    raise ValueError(f"{key}: Ansible cannot template it ({type(exc).__name__})") from exc
            return connection_from(name, resolved, bool(constants.HOST_KEY_CHECKING))
