"""Each experiment's modes checked against its kind's mode models.

Works on the raw data, before the Campaign model, so that these errors are reported together with
every other error of the file.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from runner.experiments import KINDS
from runner.spec.messages import did_you_mean, errors_of
from runner.yaml_input import Loc

__all__ = ["check_modes", "validate_modes"]


def validate_modes(kind_name: str, raw_modes: Any, index: int
                   ) -> tuple[dict[str, dict[str, Any]], list[tuple[Loc, str]]]:
    """One experiment's modes (a list, a mapping or None for the kind's defaults) as
    mode -> validated parameters, and the errors found."""
    kind = KINDS[kind_name]
    errors: list[tuple[Loc, str]] = []
    loc_modes: Loc = ("experiments", index, "modes")
    if raw_modes is None:
        raw: dict[str, Any] = dict.fromkeys(kind.default_modes)
    elif isinstance(raw_modes, list):
        raw = dict.fromkeys(str(m) for m in raw_modes)
        if len(raw) != len(raw_modes):
            errors.append((loc_modes, "a mode is listed twice"))
    elif isinstance(raw_modes, dict):
        raw = raw_modes
    else:
        return {}, []  # a wrong type is reported by the Campaign model
    if not raw:
        errors.append((loc_modes, f"no modes given and kind {kind_name} has no default"))
    validated: dict[str, dict[str, Any]] = {}
    for mode, params in raw.items():
        loc: Loc = (*loc_modes, mode)
        model = kind.modes.get(mode)
        if model is None:
            errors.append((loc, f"unknown mode for kind {kind_name} (known: {', '.join(kind.modes)})"
                           f"{did_you_mean(mode, kind.modes)}"))
            continue
        if params is not None and not isinstance(params, dict):
            errors.append((loc, "mode parameters must be a mapping"))
            continue
        try:
            validated[mode] = model.model_validate(params or {}).model_dump(mode="json")
        except ValidationError as exc:
            errors.extend(errors_of(exc, loc, model, params or {}))
    return validated, errors


def check_modes(data: dict[str, Any]) -> tuple[list[dict[str, dict[str, Any]]], list[tuple[Loc, str]]]:
    """Every experiment's validated modes (empty for one whose kind is unknown) and all their errors."""
    experiments = data.get("experiments")
    modes: list[dict[str, dict[str, Any]]] = []
    errors: list[tuple[Loc, str]] = []
    for i, exp in enumerate(experiments if isinstance(experiments, list) else []):
        kind = exp.get("kind") if isinstance(exp, dict) else None
        if isinstance(kind, str) and kind in KINDS:  # a list or mapping is the Campaign model's error
            validated, mode_errors = validate_modes(kind, exp.get("modes"), i)
        else:
            validated, mode_errors = {}, []
        modes.append(validated)
        errors.extend(mode_errors)
    return modes, errors
