"""Read, override, validate and resolve a campaign file: every problem at once, one line each."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from runner.errors import SpecError
from runner.experiments import KINDS
from runner.overrides import Override, apply_overrides
from runner.spec.hosts import resolve_hosts
from runner.spec.messages import errors_of
from runner.spec.models import Campaign, LoadedCampaign
from runner.spec.modes import check_modes
from runner.spec.weights import weights_problems
from runner.yaml_input import InputError, Loc, format_loc, line_for, read_yaml

__all__ = ["load_campaign"]


def load_campaign(path: Path, *, check_hosts: bool = True, overrides: list[Override] | None = None,
                  inventory: Path | None = None, limit: str | None = None) -> LoadedCampaign:
    """Read, validate and resolve a campaign file, or raise ``SpecError`` with every problem.

    ``overrides`` (``-e``), ``inventory`` (``-i``) and ``limit`` (``-l``) replace values of the file
    before validation; an error in one names the option it came from instead of a line."""
    name = str(path)
    try:
        text, data, lines = read_yaml(path)
    except InputError as exc:
        raise SpecError([f"{name}:{exc.line}: {exc.message}"]) from exc
    if not isinstance(data, dict):
        raise SpecError([f"{name}:1: a campaign must be a YAML mapping"])
    given = list(overrides or [])
    if inventory is not None:
        given.append((("inventory",), str(inventory.resolve()), f"-i {inventory}"))
    if limit is not None:
        given.append((("hosts",), limit, f"-l {limit}"))
    from_options = apply_overrides(data, given)

    def where(loc: Loc) -> str:
        for path_, source in from_options.items():
            if loc[: len(path_)] == path_ or path_[: len(loc)] == loc:
                return source
        return f"{name}:{line_for(lines, loc)}"

    def fail(errors: list[tuple[Loc, str]]) -> SpecError:
        errors = sorted(errors, key=lambda e: line_for(lines, e[0]))
        return SpecError([f"{where(loc)}: {format_loc(loc)}: {msg}" for loc, msg in errors])

    modes, errors = check_modes(data)
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as exc:
        raise fail(errors_of(exc, (), Campaign) + errors) from exc

    errors.extend(_experiment_problems(campaign, errors))
    inventory_path = (path.parent / campaign.inventory).resolve()
    hosts: list[str] = []
    if not inventory_path.exists():
        errors.append((("inventory",), f"inventory {inventory_path} does not exist"))
    elif check_hosts:
        hosts, problem = resolve_hosts(inventory_path, campaign.hosts)
        if problem:
            errors.append((("hosts",) if problem.startswith("host pattern") else ("inventory",), problem))
        elif not hosts:
            errors.append((("hosts",), f"host pattern {campaign.hosts!r} matches no host in {inventory_path}"))
    if errors:
        raise fail(errors)
    return LoadedCampaign(campaign, path.resolve(), text, inventory_path, tuple(hosts), tuple(modes),
                          tuple(sorted(source for source in set(from_options.values()))))


def _experiment_problems(campaign: Campaign, known: list[tuple[Loc, str]]) -> list[tuple[Loc, str]]:
    """An engine for the kinds that start one, its weights, and distinct experiment names;
    ``known`` are the errors already found (a weights problem is reported once, not per experiment)."""
    errors: list[tuple[Loc, str]] = []
    labels: dict[str, int] = {}
    for i, exp in enumerate(campaign.experiments):
        if KINDS[exp.kind].needs_engine and campaign.engine is None:
            errors.append((("experiments", i, "kind"), f"kind {exp.kind} starts an engine: the campaign needs engine:"))
        if KINDS[exp.kind].needs_engine and campaign.engine is not None:
            errors.extend(e for e in weights_problems(campaign.engine, exp, i) if e not in errors and e not in known)
        if exp.label in labels:
            errors.append(((*("experiments", i), "name"), f"experiment name {exp.label!r} is used twice "
                           f"(also experiments[{labels[exp.label]}]): give each a distinct name"))
        labels.setdefault(exp.label, i)
    return errors
