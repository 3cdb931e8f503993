"""Read, override, validate and resolve a campaign file: every problem at once, one line each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runner.errors import SpecError
from runner.experiments import KINDS
from runner.experiments.launch import flag_name
from runner.inventory import InventorySources, is_host_list, path_exists
from runner.overrides import Override, apply_overrides
from runner.secrets import looks_like_credential
from runner.spec.hosts import resolve_hosts
from runner.spec.messages import errors_of
from runner.spec.models import Campaign, LoadedCampaign
from runner.spec.modes import check_modes
from runner.spec.weights import weights_problems
from runner.yaml_input import InputError, Loc, format_loc, line_for, read_yaml

__all__ = ["load_campaign"]


def load_campaign(path: Path, *, check_hosts: bool = True, overrides: list[Override] | None = None,
                  inventory: Path | str | Sequence[Path | str] | None = None, limit: str | None = None
                  ) -> LoadedCampaign:
    """Read, validate and resolve a campaign file, or raise ``SpecError`` with every problem.

    ``overrides`` (``-e``) replace values of the file before validation; ``inventory`` (``-i``,
    one or more sources) replaces the file's inventory and ``limit`` (``-l``) narrows its hosts,
    as ``ansible-playbook`` does. An error in one names the option it came from instead of a line."""
    name = str(path)
    try:
        text, data, lines = read_yaml(path)
    except InputError as exc:
        raise SpecError([f"{name}:{exc.line}: {exc.message}"]) from exc
    if not isinstance(data, dict):
        raise SpecError([f"{name}:1: a campaign must be a YAML mapping"])
    from_options = apply_overrides(data, list(overrides or []))
    _override_replaces_its_flag(data, from_options)

    def where(loc: Loc) -> str:
        for path_, source in from_options.items():
            if loc[: len(path_)] == path_ or path_[: len(loc)] == loc:
                return source
        return f"{name}:{line_for(lines, loc)}"

    def fail(errors: list[tuple[Loc, str]], option_lines: tuple[str, ...] = ()) -> SpecError:
        errors = sorted(errors, key=lambda e: line_for(lines, e[0]))
        return SpecError([f"{where(loc)}: {format_loc(_shown_loc(loc))}: {msg}" for loc, msg in errors]
                         + list(option_lines))

    modes, errors = check_modes(data)
    try:
        campaign = Campaign.model_validate(data)
    except ValidationError as exc:
        raise fail(errors_of(exc, (), Campaign, data) + errors) from exc

    errors.extend(_experiment_problems(campaign, errors))
    given = [inventory] if isinstance(inventory, str | Path) else list(inventory or [])
    option = " ".join(f"-i {g}" for g in given) or None
    sources = (InventorySources.of(given, from_command_line=True) if given else
               InventorySources.of([campaign.inventory], base=path.parent, from_command_line=False))
    option_lines: list[str] = []
    if check_hosts:
        hosts, problems = resolve_hosts(sources, campaign.hosts, limit, option)
    else:  # still: an inventory that is not there is a typo the user wants to hear about
        hosts, problems = [], [(option or "inventory", f"inventory {s} does not exist") for s in sources.sources
                               if not is_host_list(s) and not path_exists(s)][:1]
    for where_, message in problems:
        if where_ in ("hosts", "inventory"):
            errors.append(((where_,), message))
        else:
            option_lines.append(f"{where_}: {message}")
    if errors or option_lines:
        raise fail(errors, tuple(option_lines))
    given_options = [*(f"-i {g}" for g in given), *([f"-l {limit}"] if limit is not None else [])]
    return LoadedCampaign(campaign, path.resolve(), text, sources, tuple(hosts), tuple(modes),
                          tuple(sorted({*from_options.values(), *given_options})))


def _override_replaces_its_flag(data: dict[str, Any], applied: dict[tuple[str | int, ...], str]) -> None:
    """``-e engine.args.max_model_len=4096`` replaces the file's ``max-model-len``: an override names a
    flag however it spells it, and the file's other spelling would be the same flag given twice."""
    for path in applied:
        if not ((len(path) == 3 and path[:2] == ("engine", "args"))
                or (len(path) == 4 and path[0] == "experiments" and path[2] == "engine_args")):
            continue
        node = data
        for part in path[:-1]:
            node = node[part]  # apply_overrides made every step of the path
        key = path[-1]
        if isinstance(node, dict) and isinstance(key, str):
            for other in [k for k in node if isinstance(k, str) and k != key and flag_name(k) == flag_name(key)]:
                del node[other]


def _shown_loc(loc: Loc) -> Loc:
    """A key that may be a credential pasted in the wrong place is not repeated in a message."""
    return tuple("(a key not shown)" if isinstance(p, str) and looks_like_credential(p) else p for p in loc)


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
