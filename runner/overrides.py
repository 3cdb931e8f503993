"""Command-line overrides of campaign values, as Ansible users type them: ``-e key.path=value``,
``-e @file.yml``, ``-e '{"json": ...}'``.

An override is data like the file it changes: parsed as YAML/JSON within the same bounds, never
templated, and validated with the rest of the campaign; an error names the ``-e`` it came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from runner.errors import SpecError
from runner.yaml_input import InputError, read_yaml

__all__ = ["Override", "apply_overrides", "parse_overrides"]

Override = tuple[tuple[str | int, ...], Any, str]  # key path, value, where it came from
_MAX_OVERRIDES = 100


def _flatten(data: Any, prefix: tuple[str | int, ...], source: str) -> list[Override]:
    if isinstance(data, dict) and data:
        out: list[Override] = []
        for key, value in data.items():
            path = (*prefix, *_split(str(key)))
            # A mapping under a dotted key replaces leaves, not whole sections (engine: {args: {...}}
            # changes only the flags it names), like Ansible's hash merging of extra vars.
            out.extend(_flatten(value, path, source))
        return out
    return [(prefix, data, source)]


def _split(dotted: str) -> tuple[str | int, ...]:
    parts: list[str | int] = []
    for part in dotted.split("."):
        if not part:
            raise ValueError(f"empty key in {dotted!r}")
        parts.append(int(part) if part.isdigit() else part)
    return tuple(parts)


def parse_overrides(items: list[str]) -> list[Override]:
    """Each ``-e`` item as (path, value, source); ``SpecError`` for one that cannot be read."""
    if len(items) > _MAX_OVERRIDES:
        raise SpecError([f"-e: at most {_MAX_OVERRIDES} overrides, got {len(items)}"])
    out: list[Override] = []
    for item in items:
        source = f"-e {item[:60]}"
        try:
            if item.startswith("@"):
                _, data, _ = read_yaml(Path(item[1:]))
                if not isinstance(data, dict):
                    raise ValueError(f"{item[1:]} must hold a mapping of campaign keys")
                out.extend(_flatten(data, (), f"-e {item}"))
            elif item.lstrip().startswith("{"):
                data = json.loads(item)
                if not isinstance(data, dict):
                    raise ValueError("JSON must be an object")
                out.extend(_flatten(data, (), source))
            else:
                key, sep, text = item.partition("=")
                if not sep or not key.strip():
                    raise ValueError("expected key.path=value, @file.yml or a JSON object")
                try:  # 8192 is a number, true a bool; text YAML cannot read stays text, as in Ansible
                    value = yaml.safe_load(text) if text.strip() else ""
                except yaml.YAMLError:
                    value = text
                if isinstance(value, dict | list):
                    raise ValueError("a key=value override takes a scalar; give a mapping as JSON or @file.yml")
                out.append((_split(key.strip()), value, source))
        except InputError as exc:
            raise SpecError([f"{item[1:]}:{exc.line}: {exc.message}"]) from exc
        except (ValueError, yaml.YAMLError) as exc:
            raise SpecError([f"{source}: {' '.join(str(exc).split())}"]) from exc
    return out


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
        last = path[-1]
        if isinstance(node, list):
            if not isinstance(last, int) or last >= len(node):
                raise SpecError([f"{source}: {_dotted(path)}: no such list item"])
            node[last] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise SpecError([f"{source}: {_dotted(path[:-1])} is not a mapping"])
        applied[path] = source
    return applied


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path) or "(top)"
