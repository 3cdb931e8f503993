"""The snapshot trial's refusals that need no node, from the facts an earlier run of the same
results folder gathered (``--plan`` shows them and exits 3; a real run refuses before any host is
touched): the engine's GPU memory, which a dump moves to host RAM and a criu image holds, against
the node's whole memory and the whole filesystem of the images folder.

The arithmetic is the node's gates' (``nodetools.snapshot.gates``); the figures are what the node
has in all, never what was free then: the gates check that on the node when the trial starts.
"""

from __future__ import annotations

from typing import Any

from nodetools.offload.preflight import mount_of
from nodetools.snapshot.gates import checkpoint_ram_reasons, engine_gpu_bytes, image_reasons
from nodetools.snapshot.images import RAM_FILESYSTEMS
from runner.experiments.base import TrialContext
from runner.experiments.launch import vllm_arg

__all__ = ["plan_checks"]

_RAM_WORDS = "is there in all (MemTotal, from the facts an earlier run gathered)"


def _gpu_memory_mib(facts: dict[str, Any]) -> dict[int, int]:
    return {int(g["index"]): int(g.get("memory_total_mib") or 0)
            for g in facts.get("gpus") or [] if isinstance(g, dict) and g.get("index") is not None}


def _images_fs(images: str, facts: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The filesystem the facts say holds the images folder (node_facts lists tmpfs at /dev/shm
    only: the mount point is named so a user sees which one was meant), and its size."""
    mount = mount_of(images, facts.get("mounts") or [])
    if mount is None or mount.get("size_bytes") is None:
        return {"fs_type": "?", "in_ram": False}, None
    fstype = str(mount.get("fstype") or "?")
    return {"fs_type": f"{fstype} at {mount['mountpoint']}", "in_ram": fstype in RAM_FILESYSTEMS}, \
        int(mount["size_bytes"])


def plan_checks(ctx: TrialContext) -> list[str]:
    facts, gpus = dict(ctx.facts or {}), [int(g) for g in ctx.engine.get("gpus") or []]
    if not facts or not gpus or (ctx.mode == "vllm_snapshot" and ctx.engine.get("kind") == "stand-in"):
        return []
    fraction = float(vllm_arg(ctx.engine.get("args") or {}, "gpu-memory-utilization"))
    gpu_bytes = engine_gpu_bytes(_gpu_memory_mib(facts), gpus, fraction)
    ram = int((facts.get("memory") or {}).get("total_bytes") or 0) or None
    if not gpu_bytes:
        return []
    if ctx.mode == "criu":
        images = str(ctx.params.get("images_dir") or ctx.node_paths().file("images"))
        fs, size = _images_fs(images, facts)
        return image_reasons(images, fs, size, gpu_bytes, ram, ("in all (its size)", "in all (MemTotal)"))
    return checkpoint_ram_reasons(gpu_bytes, fraction, gpus, ram, _RAM_WORDS) if ram else []
