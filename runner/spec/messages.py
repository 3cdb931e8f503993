"""pydantic's validation errors as this tool's one-line messages, with "did you mean" for typos."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from runner.yaml_input import Loc

__all__ = ["did_you_mean", "errors_of"]


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # 1048576, not 1.04858e+06
    return f"{value:g}" if isinstance(value, float) else str(value)


_MESSAGES = {
    "extra_forbidden": lambda e: "unknown key",
    "missing": lambda e: "required key is missing",
    "greater_than": lambda e: f"must be > {_num(e['ctx']['gt'])}",
    "greater_than_equal": lambda e: f"must be >= {_num(e['ctx']['ge'])}",
    "less_than_equal": lambda e: f"must be <= {_num(e['ctx']['le'])}",
    "literal_error": lambda e: f"must be one of {e['ctx']['expected']}",
    "string_pattern_mismatch": lambda e: f"must match {e['ctx']['pattern']}",
    "too_short": lambda e: "must not be empty",
}


def _message(err: Any) -> str:
    make = _MESSAGES.get(err["type"])
    if make is not None:
        return str(make(err))
    msg = str(err["msg"])
    return msg.removeprefix("Value error, ")


_ABSENT = object()


def _clean_loc(loc: Loc, data: Any = _ABSENT) -> Loc:
    """``loc`` without the union member pydantic adds where it tried one ("dict[str,...]",
    "function-after[...]"). Where the input ``data`` is given, a part that is a key of it stays:
    a user's key may hold a bracket too (``foo[1]: 1`` was reported as "(top)" at line 1)."""
    out: list[Any] = []
    node = data
    for part in loc:
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_list or (isinstance(node, dict) and part in node):
            out.append(part)
            node = node[part]
        elif isinstance(part, str) and ("[" in part or part.startswith("function-")):
            continue  # a union member: the data below it is the same node
        else:
            out.append(part)
            node = _ABSENT
    return tuple(out)


def did_you_mean(word: object, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def _known_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys allowed where ``loc`` (relative to ``model``) points, for "did you mean"."""
    fields: list[str] = [n for n, f in model.model_fields.items() if not f.exclude]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(str(part))
        sub = getattr(info, "annotation", None) if info else None
        for candidate in (sub, *getattr(sub, "__args__", ())):
            inner = getattr(candidate, "__args__", (candidate,))
            found = next((c for c in (candidate, *inner) if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if found is not None:
                model = found
                break
        else:
            return []
        fields = list(model.model_fields)
    return fields


def _one_level_down(model: type[BaseModel], loc: Loc) -> str:
    """``repeats`` at the top of a campaign: "did you mean 'defaults.repeats'?" (a key of a section)."""
    if len(loc) != 1:
        return ""
    for name, info in model.model_fields.items():
        for sub in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(sub, type) and issubclass(sub, BaseModel) and str(loc[0]) in sub.model_fields:
                return f": did you mean '{name}.{loc[0]}'?"
    return ""


def errors_of(exc: ValidationError, prefix: Loc = (), model: type[BaseModel] | None = None, data: Any = _ABSENT
              ) -> list[tuple[Loc, str]]:
    """Each distinct error of ``exc`` as (location below ``prefix``, message); ``data``: the input
    that was validated, so that its keys are told from pydantic's own location parts."""
    seen: set[tuple[Loc, str]] = set()
    out = []
    for err in exc.errors():
        loc = _clean_loc(tuple(err["loc"]), data)
        message = _message(err)
        if err["type"] == "extra_forbidden" and model is not None and loc:
            message += did_you_mean(loc[-1], _known_keys(model, loc)) or _one_level_down(model, loc)
        item = ((*prefix, *loc), message)
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
