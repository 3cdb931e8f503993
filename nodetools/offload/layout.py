"""Where an offload trial's engine copies keep their files, and which GPUs each copy gets.

Copy 0 works in the trial's folder (``server.log``, ``metrics_before.txt``...), copy i in
``copy<i>/``; the controller fetches copy i's ``x.ext`` as ``x.c<i>.ext``. Stdlib only: the
runner plans with the same functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

__all__ = ["COPY_FILES", "TRIAL_FILES", "copy_dir", "fetched_name", "split_gpus"]

# What the trial's folder holds for the controller to fetch, and per engine copy.
TRIAL_FILES = ("server.log", "requests.jsonl", "run.json", "launch.json", "preflight.json", "facts_before.json",
               "metrics_before.txt", "metrics_after.txt", "quality.jsonl", "dmesg.txt")
COPY_FILES = ("server.log", "metrics_before.txt", "metrics_after.txt")


def copy_dir(workdir: Path, index: int) -> Path:
    return workdir if index == 0 else workdir / f"copy{index}"


def fetched_name(name: str, index: int) -> str:
    """Copy ``index``'s file ``name`` as the controller keeps it: server.log, server.c1.log, ..."""
    if index == 0:
        return name
    path = PurePosixPath(name)
    return f"{path.stem}.c{index}{path.suffix}"


def split_gpus(gpus: Sequence[int], copies: int) -> list[list[int]]:
    """The GPUs of each engine copy: consecutive, equal shares (none for an engine without GPUs)."""
    if not gpus:
        return [[] for _ in range(copies)]
    if len(gpus) % copies:
        raise ValueError(f"{len(gpus)} GPUs cannot be split evenly between {copies} engine copies")
    share = len(gpus) // copies
    return [list(gpus[i * share:(i + 1) * share]) for i in range(copies)]
