"""Read a YAML file that someone else wrote, within bounds, keeping each key's line number.

Campaign files are shared data: a tiny file must not be able to take the controller's memory or
time (an alias bomb, nesting thousands deep, a FIFO or ``/dev/zero`` named as the file), and a
problem must come back as one line naming the file and line, never as a traceback.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import yaml

from runner.files import KERNEL_FILE, NotRegularFile, open_regular, read_at_most

__all__ = ["LIMITS", "InputError", "Loc", "format_loc", "line_for", "load_yaml_text", "lone_surrogate", "read_yaml"]

Loc = tuple[str | int, ...]

# Generous for any real campaign (the largest shipped one is ~3 KiB, ~150 values, depth 6).
LIMITS = {"bytes": 1024 * 1024, "values": 100_000, "depth": 32}
_MAX_DIGITS = 100  # Python refuses to read an integer of over 4,300 digits: the error named no line


class InputError(Exception):
    """A file that cannot be read as bounded YAML: ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(f"{line}: {message}")


def _read_text(path: Path) -> str:
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > LIMITS["bytes"]:
                raise InputError(1, f"is {size} bytes: larger than the {LIMITS['bytes']}-byte limit")
            raw = read_at_most(fh, LIMITS["bytes"] + 1)
    except NotRegularFile as exc:
        if exc.kind == "a directory":
            raise InputError(1, "is a folder, not a file") from exc
        if exc.kind == KERNEL_FILE:
            raise InputError(1, f"is {KERNEL_FILE}: kernel state, never read as input") from exc
        raise InputError(1, "is not a regular file (a FIFO, socket or device is never read)") from exc
    except OSError as exc:
        raise InputError(1, f"cannot read: {exc.strerror or exc}") from exc
    if len(raw) > LIMITS["bytes"]:  # it grew between stat and read
        raise InputError(1, f"is larger than the {LIMITS['bytes']}-byte limit")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError(1, "is UTF-16 text: save it as UTF-8")
    if b"\x00" in raw:
        raise InputError(raw[: raw.index(b"\x00")].count(b"\n") + 1, "holds a NUL byte: not a text file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(line, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x})") from exc


def _key_value(node: yaml.Node) -> Any:
    """A mapping key as the loaded data holds it (``1`` and ``true`` are not strings)."""
    if isinstance(node, yaml.ScalarNode):
        if node.tag == "tag:yaml.org,2002:int":
            try:
                return int(node.value.replace("_", ""), 0)
            except ValueError:
                return node.value
        if node.tag == "tag:yaml.org,2002:bool":
            return node.value.lower() in ("true", "yes", "on")
        return node.value
    return f"<{node.id}>"


def _measure(root: yaml.Node) -> None:
    """Refuse documents that expand past the limits; aliases are counted as often as used, but each
    node is measured once, so a bomb is caught in time linear in the file."""
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values when expanded, depth)
    open_: set[int] = set()  # the nodes whose children are being measured: the current node's ancestors
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if not done and id(node) in open_:  # `&a [*a]`: PyYAML builds a list that holds itself
            raise InputError(node.start_mark.line + 1, "an alias names the mapping or list it is inside "
                             "(a cycle, which expands without end): refused")
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if not done:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        values = 1 + sum(sizes[id(c)][0] for c in children)
        depth = 1 + max((sizes[id(c)][1] for c in children), default=0)
        if values > LIMITS["values"]:
            raise InputError(node.start_mark.line + 1, f"expands to more than {LIMITS['values']} values "
                             "(YAML aliases repeat what they name): refused")
        if depth > LIMITS["depth"]:
            raise InputError(node.start_mark.line + 1, f"nests deeper than {LIMITS['depth']} levels: refused")
        sizes[id(node)] = (values, depth)
        open_.discard(id(node))


def _check_node(node: yaml.Node, seen: set[int]) -> None:
    """Duplicate keys (PyYAML lets the last one win silently) and non-finite numbers."""
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, yaml.MappingNode):
            keys: dict[Any, int] = {}
            for key_node, value_node in n.value:
                key = _key_value(key_node)
                line = key_node.start_mark.line + 1
                if key in keys and isinstance(key_node, yaml.ScalarNode):
                    raise InputError(line, f"key {key!r} is given twice (also line {keys[key]})")
                keys.setdefault(key, line)
                stack.extend((key_node, value_node))
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.ScalarNode):
            if not n.value.isascii() and lone_surrogate(n.value):
                raise InputError(n.start_mark.line + 1, "holds a \\ud800-\\udfff escape: half a UTF-16 pair, "
                                 "which YAML never joins and no UTF-8 file or Ansible variable can carry (write the "
                                 "character itself)")
            if n.tag == "tag:yaml.org,2002:int" and len(n.value) > _MAX_DIGITS:
                raise InputError(n.start_mark.line + 1, f"an integer of {len(n.value)} characters: no value a "
                                 "campaign holds is that long")
            if n.tag == "tag:yaml.org,2002:float":
                value = yaml.safe_load(n.value) if n.style is None else None
                if isinstance(value, float) and not math.isfinite(value):
                    raise InputError(n.start_mark.line + 1, f"{n.value!r} is not a finite number")


def lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate: a YAML ``"\\ud800"`` escape, or a command-line byte
    the locale could not decode. Every trial of a campaign holding one failed where Ansible read it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def line_map(root: yaml.Node) -> dict[Loc, int]:
    """Each key path of the document to its 1-based line; a node reached again through an alias
    is not walked twice (its paths fall back to the alias's own line)."""
    out: dict[Loc, int] = {}
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        out.setdefault(loc, node.start_mark.line + 1)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key_loc = (*loc, _key_value(key_node))
                out[key_loc] = key_node.start_mark.line + 1
                stack.append((value_node, key_loc))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                out[(*loc, i)] = item.start_mark.line + 1
                stack.append((item, (*loc, i)))
    return out


def line_for(lines: dict[Loc, int], loc: Loc) -> int:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top)"


def read_yaml(path: Path) -> tuple[str, Any, dict[Loc, int]]:
    """The file's text, its data and its line map; ``InputError`` for anything out of bounds."""
    text = _read_text(path)
    data, lines = _load(text)
    return text, data, lines


def load_yaml_text(text: str) -> Any:
    """YAML (or JSON) given as text, e.g. on a command line, within the same bounds as a file."""
    if len(text.encode(errors="replace")) > LIMITS["bytes"]:
        raise InputError(1, f"is larger than the {LIMITS['bytes']}-byte limit")
    return _load(text)[0]


def _load(text: str) -> tuple[Any, dict[Loc, int]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError as exc:
        raise InputError(1, f"nests deeper than {LIMITS['depth']} levels: refused") from exc
    except yaml.reader.ReaderError as exc:  # a control character: where it is, not a multi-line dump
        raise InputError(text[: exc.position].count("\n") + 1,
                         f"holds the character U+{exc.character:04X}, which YAML does not allow (a control "
                         "character)") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(mark.line + 1 if mark is not None else 1,
                         f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    if node is None:
        return None, {}
    _measure(node)
    _check_node(node, set())
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:  # composed fine, but no data: a tag such as !!python/object, a bad merge
        mark = exc.problem_mark
        raise InputError(mark.line + 1 if mark is not None else 1,
                         f"not valid YAML: {' '.join(str(exc.problem or exc).split())}") from exc
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise InputError(1, f"not valid YAML: {' '.join(str(exc).split())}") from exc
    return _unshared(data), line_map(node)


def _unshared(data: Any) -> Any:
    """A copy in which no two places are one object. PyYAML gives every use of an alias (``*load``,
    ``<<: *load``) the same dict, so an ``-e`` override of one mode's value changed every mode that
    shares it; ``copy.deepcopy`` would keep the sharing. The alias bounds above keep this small."""
    if isinstance(data, dict):
        return {key: _unshared(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_unshared(value) for value in data]
    return data
