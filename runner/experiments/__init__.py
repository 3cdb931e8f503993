"""The registry of experiment kinds a campaign may name."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

from runner.experiments.base import ExperimentKind

__all__ = ["KINDS", "get_kind"]

# Each kind's module (runner/experiments/<name>.py or package, with its KIND), in this order.
_NAMES = ("facts", "selftest", "startup", "offload", "snapshot", "storage")


class _Kinds(MutableMapping[str, ExperimentKind]):
    """The kinds by name, each module imported when its kind is first used: importing all of them
    cost each start of the runner ~0.2 CPU s (2-core machine), most of it kinds the campaign never
    names."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._kinds: dict[str, ExperimentKind | None] = dict.fromkeys(names)

    def __getitem__(self, name: str) -> ExperimentKind:
        kind = self._kinds[name]  # an unknown name is a KeyError, never an import
        if kind is None:
            kind = self._kinds[name] = importlib.import_module(f"runner.experiments.{name}").KIND
        return kind

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def __setitem__(self, name: str, kind: ExperimentKind) -> None:
        self._kinds[name] = kind

    def __delitem__(self, name: str) -> None:
        del self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)


KINDS: MutableMapping[str, ExperimentKind] = _Kinds(_NAMES)


def get_kind(name: str) -> ExperimentKind:
    return KINDS[name]
