"""Which inventory sources a run reads, and the checks made before Ansible opens any of them.

A campaign file is shared data, so the inventory it names is read as data only: Ansible's
``yaml``, ``ini``, ``toml`` and ``host_list`` plugins, never its ``script`` plugin (which runs
every executable it finds in the folder) or plugins that call out (``auto`` and what it loads).
Inventories given with ``-i`` are the user's own choice and get Ansible's configured plugins.
Either way, special files (a FIFO would hang the plan), kernel file systems (``/proc/self/environ``
would be parsed as hosts) and trees too large to be an inventory are refused before Ansible looks.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA_ONLY_PLUGINS", "LIMITS", "InventoryError", "InventorySources", "is_host_list", "path_exists",
           "source_problem"]

DATA_ONLY_PLUGINS = ("host_list", "yaml", "ini", "toml")
LIMITS = {"entries": 5000, "depth": 12, "bytes": 4 * 1024 * 1024}
_KERNEL_FS = ("/proc", "/sys", "/dev")
_VARS_DIRS = ("group_vars", "host_vars")  # read by Ansible's vars plugin as YAML, beside a source


class InventoryError(Exception):
    """An inventory that cannot be read safely or at all; the message is one line and never holds
    the inventory's content."""


def is_host_list(source: str) -> bool:
    """``-i 'h1,h2,'``: Ansible's host_list form (a comma, and no such path)."""
    return "," in source and not path_exists(source)


def path_exists(path: str | Path) -> bool:
    """``Path.exists`` that never raises: a host list of more than 255 bytes is no file name, and
    ``Path.exists`` raised ENAMETOOLONG for it (a traceback)."""
    return os.path.exists(path)  # noqa: PTH110 -- never raises


@dataclass(frozen=True)
class InventorySources:
    """The inventory a run reads: absolute paths or host lists, in ``-i`` order."""

    sources: tuple[str, ...]
    from_command_line: bool = False  # -i: the user's own choice; else the campaign file's: data only

    @classmethod
    def of(cls, given: Iterable[str | Path], base: Path | None = None, *, from_command_line: bool) -> InventorySources:
        """Paths made absolute (relative to ``base``, or the working folder as Ansible does)."""
        out = []
        for item in given:
            text = str(item)
            path = base / text if base is not None else Path(text)  # base / an absolute path is that path
            out.append(text if "," in text and not path_exists(path) else str(path.resolve()))
        return cls(tuple(out), from_command_line)

    @property
    def enabled_plugins(self) -> tuple[str, ...] | None:
        """The inventory plugins Ansible may use; None for Ansible's own configuration."""
        return None if self.from_command_line else DATA_ONLY_PLUGINS

    def ansible_env(self) -> dict[str, str]:
        """The environment that makes ``ansible-playbook`` read these sources as they were checked."""
        plugins = self.enabled_plugins
        return {} if plugins is None else {"ANSIBLE_INVENTORY_ENABLED": ",".join(plugins)}

    def describe(self) -> str:
        return ", ".join(self.sources)


def source_problem(source: str, data_only: bool) -> str:
    """Why ``source`` must not be handed to Ansible, or ""."""
    if is_host_list(source):
        return ""
    path = Path(source)
    if not os.path.lexists(path):
        return f"inventory {source} does not exist"
    if _on_kernel_fs(path):
        return f"inventory {source} is on a kernel or device file system (/proc, /sys, /dev), not an inventory"
    walker = _Walk(data_only)
    try:
        if path.is_dir():
            walker.tree(path, 0, vars_dir=False)
        else:
            walker.file(path, vars_dir=False)
            for name in _VARS_DIRS:  # Ansible reads group_vars/ and host_vars/ beside an inventory file
                if (path.parent / name).is_dir():
                    walker.tree(path.parent / name, 1, vars_dir=True)
    except InventoryError as exc:
        return f"inventory {source}: {exc}"
    return ""


def _on_kernel_fs(path: Path) -> bool:
    real = os.path.realpath(path)
    return any(real == top or real.startswith(top + "/") for top in _KERNEL_FS)


class _Walk:
    """Everything under an inventory folder that Ansible may open, within bounds; symlinks are
    followed as Ansible follows them, each folder once."""

    def __init__(self, data_only: bool) -> None:
        self.data_only = data_only
        self.entries = 0
        self.bytes = 0
        self.seen: set[tuple[int, int]] = set()

    def tree(self, folder: Path, depth: int, *, vars_dir: bool) -> None:
        if depth > LIMITS["depth"]:
            raise InventoryError(f"{folder} nests deeper than {LIMITS['depth']} folders: is it an inventory?")
        info = self._stat(folder)
        if (info.st_dev, info.st_ino) in self.seen:
            return
        self.seen.add((info.st_dev, info.st_ino))
        try:
            names = sorted(p.name for p in folder.iterdir())
        except OSError as exc:
            raise InventoryError(f"cannot read {folder}: {exc.strerror}") from exc
        for name in names:
            if name.startswith("."):
                continue  # Ansible never reads hidden files of an inventory
            self.entries += 1
            if self.entries > LIMITS["entries"]:
                raise InventoryError(f"holds more than {LIMITS['entries']} files and folders: is it an inventory?")
            child = folder / name
            if _on_kernel_fs(child):
                raise InventoryError(f"{child} leads into a kernel or device file system (/proc, /sys, /dev)")
            if child.is_dir():
                self.tree(child, depth + 1, vars_dir=vars_dir or name in _VARS_DIRS)
            else:
                self.file(child, vars_dir=vars_dir)

    def file(self, path: Path, *, vars_dir: bool) -> None:
        info = self._stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise InventoryError(f"{path} is not a regular file (a FIFO, socket or device is never read)")
        self.bytes += info.st_size
        if self.bytes > LIMITS["bytes"]:
            raise InventoryError(f"is larger than {LIMITS['bytes'] // 2**20} MiB: is it an inventory?")
        if self.data_only and not vars_dir and info.st_mode & 0o111:
            raise InventoryError(f"{path} is executable, and Ansible would run it as an inventory script: a campaign "
                                 "file names data-only inventories (clear its executable bit, or pass the inventory "
                                 "with -i to run it)")

    @staticmethod
    def _stat(path: Path) -> os.stat_result:
        try:
            return path.stat()
        except OSError as exc:
            raise InventoryError(f"cannot read {path}: {exc.strerror}") from exc
