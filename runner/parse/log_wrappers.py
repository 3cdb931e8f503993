"""Log-collector wrappers around a server log: find which one a log has, strip it from a line.

A vLLM log fetched with ``kubectl``, ``docker``, ``journalctl`` or from Cloud Logging carries the
collector's own prefix (timestamp, stream, container or unit name, outer level) before vLLM's
line, or wraps the line in JSON. :func:`detect` picks the format from the first lines of a log;
the chosen :class:`Wrapper`'s ``strip`` turns one raw line back into vLLM's own line (``None``
when the line is not in that format: the caller then keeps the raw line).

Formats, in detection order (``name``: how such a log is made)

* ``kubernetes-cri``: the node's container log file, ``TS stdout F <line>`` (``P`` records are
  parts of a long line: :func:`rejoin_cri` joins them).
* ``kubectl-prefix``: ``kubectl logs --prefix``, ``[pod/NAME/CONTAINER] <line>`` (with or without
  ``--timestamps``).
* ``journald``: ``journalctl -o short-iso`` (or ``short``, ``short-precise``,
  ``short-iso-precise``), ``TS HOST IDENT[PID]: <line>``.
* ``docker-compose``: ``docker compose logs``, ``SERVICE  | <line>`` (with or without
  ``--timestamps``, colour codes allowed).
* ``timestamps``: ``kubectl logs --timestamps`` or ``docker logs --timestamps``, an RFC 3339
  timestamp and a space before each line.
* ``gcp-logging-json``: a Cloud Logging export, one JSON entry per line, the line in
  ``textPayload`` or ``jsonPayload.message``.
* ``journald-json``: ``journalctl -o json``, one JSON entry per line, the line in ``MESSAGE``.
* ``other-prefix``: any other text before vLLM's line (a logging console's text export, a kernel
  log's ``[ 1234.567890]`` stamp, a line shipper's own timestamp): :func:`vllm_line_start` finds
  where vLLM's line begins, whatever precedes it.

``none`` (a bare log) is the answer when no format fits more than half of the sampled lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["NONE", "WRAPPERS", "Wrapper", "detect", "rejoin_cri", "vllm_line_start"]

_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)"
_ANSI = r"(?:\x1b\[[0-9;]*m)*"
_SYSLOG_TS = r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"

_CRI = re.compile(rf"{_TS} (?:stdout|stderr) [FP](?: |$)")
_KUBECTL_PREFIX = re.compile(rf"\[pod/[^\]\s]+\] (?:{_TS} )?")
_JOURNALD = re.compile(rf"(?:{_TS}|{_SYSLOG_TS}) \S+ [\w.@/-]+(?:\[\d+\])?: ")
_COMPOSE = re.compile(rf"{_ANSI}[\w.@-]+[ \t]*\|{_ANSI}(?: |$)(?:{_TS} )?")
_TIMESTAMPS = re.compile(rf"{_TS} ")
# Where vLLM's own line begins: its process prefix ("(EngineCore_DP0 pid=40)", "(VllmWorker rank=0
# pid=7)", "(RayWorkerWrapper pid=9, ip=...)") or, in a log without one, its level and "MM-DD
# HH:MM:SS" stamp. Bounded parts: each position is looked at in constant work, so a search is linear.
# Each branch starts with a literal, so ``re`` skips a byte that starts none of them without trying a
# match there (a collector's prefix is passed over three times faster than with a group of levels).
_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")
_VLLM_START = re.compile(
    r"\([A-Za-z_][^()\n]{0,100}?\bpid=\d+[^()\n]{0,100}\)"
    + "".join(rf"|{level}[ \t]+\d\d-\d\d \d\d:\d\d:\d\d" for level in _LEVELS)
)
_find_vllm_start = _VLLM_START.search
_COLOURS = re.compile(r"(?:\x1b\[[0-9;?]*[ -/]*[@-~])*")  # vLLM colours its own process prefix


def vllm_line_start(line: str) -> int:
    """Where vLLM's own line begins in ``line`` (``0``: at its start), ``-1`` if it has no vLLM prefix.

    The leftmost process prefix or level-and-stamp wins, so a prefix quoted later in vLLM's own
    message is never taken for it; the text before it is skipped, whatever it is.
    """
    m = _find_vllm_start(line)
    return -1 if m is None else m.start()


@dataclass(frozen=True)
class Wrapper:
    """One collector format: ``strip(line)`` is vLLM's line inside, or ``None`` if not this format."""

    name: str
    strip: Callable[[str], str | None]


def _prefix_stripper(regex: re.Pattern[str]) -> Callable[[str], str | None]:
    match = regex.match

    def strip(line: str) -> str | None:
        m = match(line)
        return None if m is None else line[m.end() :]

    return strip


def _json_entry(line: str) -> dict[str, object] | None:
    if not line.startswith("{"):
        return None
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _chomp(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def _strip_gcp(line: str) -> str | None:
    entry = _json_entry(line)
    if entry is None:
        return None
    text = entry.get("textPayload")
    if isinstance(text, str):
        return _chomp(text)
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict) and isinstance(payload.get("message"), str):
        return _chomp(payload["message"])
    return None


def _strip_journald_json(line: str) -> str | None:
    entry = _json_entry(line)
    if entry is None:
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald writes a message that is not valid UTF-8 as bytes
        try:
            return bytes(message).decode("utf-8", errors="replace")
        except (TypeError, ValueError):
            return None
    return message if isinstance(message, str) else None


def _strip_other_prefix(line: str) -> str | None:
    m = _find_vllm_start(line)
    if m is None or _COLOURS.fullmatch(line, 0, m.start()) is not None:  # nothing, or colours, before it
        return None
    return line[m.start() :]


NONE = Wrapper("none", lambda line: line)
WRAPPERS: tuple[Wrapper, ...] = (
    Wrapper("kubernetes-cri", _prefix_stripper(_CRI)),
    Wrapper("kubectl-prefix", _prefix_stripper(_KUBECTL_PREFIX)),
    Wrapper("journald", _prefix_stripper(_JOURNALD)),
    Wrapper("docker-compose", _prefix_stripper(_COMPOSE)),
    Wrapper("timestamps", _prefix_stripper(_TIMESTAMPS)),
    Wrapper("gcp-logging-json", _strip_gcp),
    Wrapper("journald-json", _strip_journald_json),
    Wrapper("other-prefix", _strip_other_prefix),  # last: a JSON entry holds vLLM's line after a prefix too
)


def detect(lines: Sequence[str]) -> Wrapper:
    """The format that fits more than half of the non-blank ``lines`` (first one wins), else ``NONE``."""
    sample = [line for line in lines if line.strip()]
    if sample and sample[0].startswith("\ufeff"):
        sample[0] = sample[0][1:]
    for wrapper in WRAPPERS:
        fits = sum(1 for line in sample if wrapper.strip(line) is not None)
        if fits * 2 > len(sample):
            return wrapper
    return NONE


_CRI_BYTES = re.compile(rb"\d{4}-\d\d-\d\dT[\d:.,]+(?:Z|[+-][\d:]+) (stdout|stderr) ([FP]) ?")


def rejoin_cri(chunk: bytes, pending: dict[bytes, bytes], limit: int) -> bytes:
    """Join CRI partial (``P``) records into the full (``F``) record that ends them.

    ``chunk`` holds whole lines; ``pending`` carries the parts of a line still open per stream
    across chunks. A joined line keeps at most ``limit`` bytes of message.
    """
    out: list[bytes] = []
    for line in chunk.split(b"\n"):
        m = _CRI_BYTES.match(line)
        if m is None:
            out.append(line)
            continue
        stream = m.group(1)
        if m.group(2) == b"P":
            pending[stream] = (pending.get(stream, b"") + line[m.end() :])[:limit]
            continue
        if stream in pending:
            out.append(line[: m.end()] + (pending.pop(stream) + line[m.end() :])[:limit])
        else:
            out.append(line)
    return b"\n".join(out)
