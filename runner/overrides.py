"""Command-line overrides of campaign values, read as ``ansible-playbook -e`` reads extra vars:
``-e "key.path=value other=value"`` (each value a string, split by Ansible's own parser),
``-e @file.yml``, ``-e '{"yaml": "or JSON"}'`` (values keep their YAML types).

A key names a campaign value by dotted path (``engine.port``, ``experiments.1.repeats``); the
campaign's own types then apply, so ``engine.port=9000`` is the number 9000. An override is data
like the file it changes: bounded like the file, never templated, and validated with the rest of
the campaign; an error names the ``-e`` it came from, never the value of a secret-looking key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.errors import SpecError
from runner.secrets import is_secret_name, looks_like_credential
from runner.yaml_input import LIMITS, InputError, load_yaml_text, lone_surrogate, read_yaml

__all__ = ["Override", "apply_overrides", "parse_overrides"]

Override = tuple[tuple[str | int, ...], Any, str]  # key path, value, where it came from
_MAX_OVERRIDES = 100
_MAX_KEY_PARTS = LIMITS["depth"]
_SHOWN_VALUE = 40  # characters of a value an error message repeats


def _split(dotted: str) -> tuple[str | int, ...]:
    parts: list[str | int] = []
    for part in dotted.split("."):
        if not part:
            raise ValueError("a key path has an empty part ('a..b', '.a' or 'a.')")
        parts.append(int(part) if part.isascii() and part.isdigit() else part)  # '²' and '٣' are digits too
    if len(parts) > _MAX_KEY_PARTS:
        raise ValueError(f"a key path has more than {_MAX_KEY_PARTS} parts")
    return tuple(parts)


def _flatten(data: Any, prefix: tuple[str | int, ...], source: str) -> list[Override]:
    """Leaves of a mapping as (path, value): a mapping under a key replaces the leaves it names, not
    whole sections (engine: {args: {...}} changes only the flags it names), like Ansible's
    ``hash_behaviour = merge``. Depth is bounded by the YAML reader."""
    if isinstance(data, dict) and (data or not prefix):  # an empty mapping at the top changes nothing
        out: list[Override] = []
        for key, value in data.items():
            out.extend(_flatten(value, (*prefix, *_split(str(key))), source))
        return out
    return [(prefix, data, source)]


def _secret_path(path: tuple[str | int, ...]) -> bool:
    return any(isinstance(p, str) and (is_secret_name(p) or looks_like_credential(p)) for p in path)


def _pair_label(key: str, path: tuple[str | int, ...], value: str) -> str:
    """``-e key=value`` for messages: the value withheld under a secret-looking key or when it
    looks like a credential itself, and cut short otherwise."""
    if _secret_path(path) or looks_like_credential(value):
        return f"-e {key}=(value not shown)"
    shown = value if len(value) <= _SHOWN_VALUE else value[:_SHOWN_VALUE] + "..."
    return f"-e {key}={shown}"


def _key_values(item: str) -> list[Override]:
    """``k=v k2='v 2'``, split and unquoted by Ansible's own parser (what ``ansible-playbook -e``
    does): every value a string."""
    from ansible.errors import AnsibleError  # noqa: PLC0415 - ansible's import costs ~0.3 s: only for this form
    from ansible.parsing.splitter import parse_kv  # noqa: PLC0415

    try:
        pairs = parse_kv(item)
    except (AnsibleError, UnicodeError, ValueError) as exc:
        raise ValueError("unbalanced quotes or {{ }}, or a bad escape (Ansible's key=value form)") from exc
    if "_raw_params" in pairs:
        raise ValueError("a word without '=' (expected KEY=VALUE pairs, @FILE, or a YAML/JSON mapping)")
    out: list[Override] = []
    for key, value in pairs.items():
        if not str(key):
            raise ValueError("a KEY=VALUE pair has no key")
        path = _split(str(key))
        out.append((path, str(value), _pair_label(str(key), path, str(value))))
    return out


def _mapping(data: Any, what: str) -> dict[Any, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{what} could not be made into a mapping of campaign keys")
    return data


def _parse_one(item: str) -> list[Override]:
    if not item.startswith("@") and lone_surrogate(item):  # a file's name may hold any byte; its text is checked
        raise ValueError("holds bytes that are not UTF-8 text (the locale could not decode them)")
    if item.startswith("@"):
        name = item[1:]
        try:
            _, data, _ = read_yaml(Path(name))
        except InputError as exc:
            raise SpecError([f"-e @{name}:{exc.line}: {exc.message}"]) from exc
        return _flatten(_mapping(data, name), (), f"-e @{name}")
    if item[:1] in ("/", "."):
        raise ValueError("a file name must start with '@' (-e @FILE), as for ansible-playbook")
    if item[:1] in ("{", "["):
        try:
            data = load_yaml_text(item)
        except InputError as exc:
            raise ValueError(f"line {exc.line}: {exc.message}") from exc
        return _flatten(_mapping(data, "the YAML/JSON text"), (), "-e {...}")
    return _key_values(item)


def parse_overrides(items: list[str]) -> list[Override]:
    """Each ``-e`` item as (path, value, source) leaves, in order (a later one wins); ``SpecError``
    for one that cannot be read. An empty item is skipped, as Ansible does."""
    if len(items) > _MAX_OVERRIDES:
        raise SpecError([f"-e: at most {_MAX_OVERRIDES} overrides, got {len(items)}"])
    out: list[Override] = []
    for n, item in enumerate(items, 1):
        if not item:
            continue
        try:
            out.extend(_parse_one(item))
        except ValueError as exc:
            key = item.partition("=")[0] if "=" in item and item[:1] not in "{[@" else ""
            plain = key and len(key) <= 80 and not _secret_path((key,))
            shown = f"-e {key}=..." if plain else f"-e (the {_ordinal(n)})"
            raise SpecError([f"{shown}: {' '.join(str(exc).split())}"]) from exc
    return out


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def apply_overrides(data: dict[str, Any], overrides: list[Override]) -> dict[tuple[str | int, ...], str]:
    """Set each value in ``data`` (in place); returns the overridden paths and their sources."""
    applied: dict[tuple[str | int, ...], str] = {}
    for path, value, source in overrides:
        node: Any = data
        for i, part in enumerate(path[:-1]):
            nxt = path[i + 1]
            if isinstance(node, list):
                if not isinstance(part, int) or part >= len(node):
                    raise SpecError([f"{source}: {_dotted(path[: i + 1])}: no such list item"])
                node = node[part]
                continue
            if not isinstance(node, dict):
                raise SpecError([f"{source}: {_dotted(path[:i])} is not a mapping"])
            if node.get(part) is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
        last = path[-1] if path else None
        if isinstance(node, list):
            if not isinstance(last, int) or last >= len(node):
                raise SpecError([f"{source}: {_dotted(path)}: no such list item"])
            node[last] = value
        elif isinstance(node, dict) and last is not None:
            node[last] = value
        else:
            raise SpecError([f"{source}: {_dotted(path[:-1])} is not a mapping"])
        applied[path] = source
    return applied


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join("(a key not shown)" if looks_like_credential(str(p)) else str(p) for p in path) or "(top)"
