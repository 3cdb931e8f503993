"""The engine's secrets on the node: read once from the 0600 file the playbook wrote, then removed.

A campaign names credentials (``engine.env_from_controller``: ``HF_TOKEN``); the planned launch
lists those names as ``secret_env``. The playbook that starts the engine writes their values, with
``no_log``, as a JSON object to ``secrets.json`` in the trial's folder (created 0600); the program
that starts the engine takes them from there before anything else (its prepare may empty the
folder), removes the file, and adds them to the engine's environment only
(:func:`nodetools.proc.launch_env`). The values are never written anywhere else, never printed,
and no error here quotes the file's content. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SECRETS_FILE", "SecretsError", "secret_names", "take_secrets"]

SECRETS_FILE = "secrets.json"  # playbooks/experiments/vars/engine.yml names the same file
_MAX_BYTES = 64 * 1024


class SecretsError(ValueError):
    """The secrets the launch names cannot be read: the message names the file and the variable."""


def secret_names(launches: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every name the launches' ``secret_env`` lists (an offload trial starts several copies)."""
    return sorted({str(n) for launch in launches for n in (launch.get("secret_env") or [])})


def _read(path: Path) -> bytes:
    """The file's bytes, refused unless it is a regular file of ours that nobody else may read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretsError(f"{path}: not a regular file")
        if st.st_uid != os.geteuid():
            raise SecretsError(f"{path}: owned by uid {st.st_uid}, not by this user ({os.geteuid()})")
        if st.st_mode & 0o077:
            raise SecretsError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read it (must be 0600)")
        if st.st_size > _MAX_BYTES:
            raise SecretsError(f"{path}: {st.st_size} bytes, more than the {_MAX_BYTES} a secrets file may hold")
        return os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)


def take_secrets(workdir: Path, names: Iterable[str]) -> dict[str, str]:
    """The values of ``names`` from ``workdir/secrets.json``, which is removed; {} when no name is
    asked for (a file there is removed all the same). Raises :class:`SecretsError` when the file is
    missing, unsafe or lacks a name; the message never holds a value."""
    path = workdir / SECRETS_FILE
    wanted = sorted(set(names))
    try:
        data = _read(path) if wanted else b""
    except FileNotFoundError:
        raise SecretsError(f"{path}: missing: the engine needs {', '.join(wanted)} from the controller "
                           "(the playbook that starts the engine writes this file)") from None
    except OSError as exc:
        raise SecretsError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    if not wanted:
        return {}
    try:
        values = json.loads(data)
    except ValueError:
        raise SecretsError(f"{path}: not JSON") from None
    if not isinstance(values, dict):
        raise SecretsError(f"{path}: not a JSON object")
    missing = [n for n in wanted if not isinstance(values.get(n), str) or not values[n]]
    if missing:
        raise SecretsError(f"{path}: no value for {', '.join(missing)}")
    return {n: values[n] for n in wanted}
