"""Every path a run will create, checked before anything runs: each name within NAME_MAX, each
path within PATH_MAX, and none leaving the folder it belongs in.

A 200-character host with a 64-character experiment name passed ``--plan`` and died with
ENAMETOOLONG at run time (the trial folder's name is ``<experiment>.<mode>.r<n>@<host>``); a host
named ``..`` made the preflight write into the results root. The paths below are the ones a run
makes, locally (the results folder: trial folders, ``raw/<host>/``, ansible-runner's private data
folders and their artifacts, ``previous/``, the lock) and on the node (the trial's remote folder),
with room for the longest file name written into each folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.errors import SpecError
from runner.results_reader import LOCK_NAME, QUARANTINE, RESERVE_NAME

__all__ = ["NODE_LIMITS", "PathCheck", "PathLimits"]

# Names written into the folders a run creates. A playbook's own files are short (the longest,
# h2d_copy.json, has 13 characters); 64 leaves room for new ones. ansible-runner names an event
# file <counter>-<uuid>.json and a fact cache file after the host.
FILE_ROOM = "f" * 64
EVENT_FILE = "9999999-" + "0" * 36 + ".json"
TEMP_FILE = ".summary.json.12345678.tmp"  # files.atomic_write_text: .<name>.<random>.tmp
PREVIOUS_SUFFIX = ".20250101-000000~999"  # store.begin_trial moves an earlier attempt to previous/<id><suffix>
ROOT_FILES = (LOCK_NAME, RESERVE_NAME, QUARANTINE, "campaign.yaml", "plan.json", "run.json", "summary.csv", TEMP_FILE,
              "report.md")


@dataclass(frozen=True)
class PathLimits:
    name_max: int = 255
    path_max: int = 4096  # with its terminating NUL, as the kernel counts


NODE_LIMITS = PathLimits()  # Linux on every filesystem a node uses for its trial folders


def _is_dir(path: Path) -> bool | None:
    """Whether ``path`` is a folder; None when nothing (or nothing reachable) is there."""
    try:
        return path.is_dir() or (False if path.exists() else None)
    except OSError:  # a name over NAME_MAX raises where a missing one says False
        return None


def local_limits(path: Path) -> PathLimits:
    """The limits of the filesystem ``path`` will be on (its nearest existing folder)."""
    probe = path
    while not _is_dir(probe) and probe != probe.parent:
        probe = probe.parent
    try:
        return PathLimits(os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX"))
    except (OSError, ValueError):
        return PathLimits()


def _ansible_tree(phases: Iterable[str], host: str) -> list[tuple[str, ...]]:
    """What ansible-runner writes under a private data folder, one ident per phase."""
    out: list[tuple[str, ...]] = [("env", "extravars"), ("turn",)]
    for phase in phases:
        out += [("artifacts", phase, "job_events", EVENT_FILE), ("artifacts", phase, "fact_cache", host),
                ("artifacts", phase, "stdout")]
    return out


def _short(name: str) -> str:
    return f"{name[:24]}...{name[-12:]}" if len(name) > 48 else name


def _shown(base: str, parts: Sequence[str]) -> str:
    """The path for a message: long names cut in the middle, the room left for a file named so."""
    names = {FILE_ROOM: "<file>", EVENT_FILE: "<event>.json"}
    return "/".join([_short(base), *(names.get(p) or _short(p) for p in parts)])


def problem(base: str, parts: Sequence[str], limits: PathLimits) -> str | None:
    """Why ``base/parts...`` cannot be created inside ``base``, or None."""
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            return f"the name {part!r} would put it outside its folder"
        size = len(os.fsencode(part))
        if size > limits.name_max:
            return (f"the name {_short(part)} is {size} bytes, over the {limits.name_max}-byte limit of its "
                    "filesystem (NAME_MAX)")
    size = len(os.fsencode(str(Path(base, *parts)))) + 1
    if size > limits.path_max:
        return f"the path is {size} bytes, over the {limits.path_max}-byte limit (PATH_MAX)"
    return None


class PathCheck:
    """The paths of one campaign's run: ``refusals`` per trial; a results folder that cannot hold
    any trial is a ``SpecError`` (exit 2) at once."""

    def __init__(self, *, campaign: str, remote_dir: str, results: Path | None) -> None:
        self.node_base = str(Path(remote_dir or "/", campaign))
        self.results = results.absolute() if results is not None else None
        self.local = local_limits(self.results) if self.results is not None else PathLimits()
        if self.results is not None:
            self._check_root(self.results)

    def _check_root(self, root: Path) -> None:
        parts = root.parts[1:]
        why = problem("/", parts, self.local) if parts else "it is the file system's root"
        if why is None and not str(root).isascii():
            try:
                str(root).encode()
            except UnicodeEncodeError:  # bytes the locale could not decode: Ansible cannot carry them
                why = "the path is not UTF-8 text (its trials would fail where Ansible reads it)"
        for name in ROOT_FILES if why is None else ():
            why = problem(str(root), (name,), self.local)
            if why is not None:
                break
        ancestor = root
        while why is None and ancestor != ancestor.parent:
            if _is_dir(ancestor) is False:
                why = f"{ancestor} is not a folder"
            ancestor = ancestor.parent
        if why is not None:
            raise SpecError([f"--results {root}: cannot be a results folder: {why}"])

    def _local(self, trial_id: str, host: str, phases: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
        trial_tree = [("trial.json",), ("skip.txt",), (TEMP_FILE,), ("raw", host, FILE_ROOM),
                      *(("ansible", *p) for p in _ansible_tree(phases, host))]
        host_tree = [("facts.json",), (TEMP_FILE,), *(("ansible", *p) for p in _ansible_tree(["preflight"], host)),
                     *(("probe", *p) for p in _ansible_tree(["probe"], host))]
        return [
            *((str(self.results), ("trials", trial_id, *p)) for p in trial_tree),
            *((str(self.results), ("previous", trial_id + PREVIOUS_SUFFIX, *p)) for p in trial_tree),
            *((str(self.results), ("hosts", host, *p)) for p in host_tree),
        ]

    def refusals(self, trial_id: str, host: str, phases: Sequence[str]) -> list[str]:
        """One line naming the trial's first path that cannot be created, or none."""
        node = [(self.node_base, (host, leaf, FILE_ROOM)) for leaf in (trial_id, "preflight")]
        checks = [(base, parts, NODE_LIMITS, "on the node") for base, parts in node]
        if self.results is not None:
            checks += [(base, parts, self.local, "in the results folder")
                       for base, parts in self._local(trial_id, host, phases)]
        for base, parts, limits, where in checks:
            why = problem(base, parts, limits)
            if why is not None:
                return [f"path {_shown(base, parts)} {where} cannot be created: {why}; shorten the experiment, mode or "
                        "host name, or the folder"]
        return []
