"""What a trial can change on a node, read in a millisecond after the engine's stop: host memory,
the page cache, and the ``vllm_offload_*`` buffers left in ``/dev/shm`` (a stale one still holds
host RAM). The node's full facts (GPUs, NUMA, disks, mounts: what a trial does not change) come
from the campaign's ``facts`` experiment and the ``node_facts`` module; reading them after every
trial cost 0.64 s on the H200 (an Ansible module run and nvidia-smi), outside the measured
windows. The timer records the GPUs' memory after the stop itself (``gpu_mem_mib_after_stop``).
Stdlib only: this runs on the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MEMINFO_KEYS = {"MemTotal": "mem_total_bytes", "MemAvailable": "mem_available_bytes", "Cached": "page_cache_bytes",
                "Dirty": "dirty_bytes", "Shmem": "shmem_bytes"}


def read_meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """The keys of ``MEMINFO_KEYS`` in bytes (a key the kernel does not print is left out)."""
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        words = rest.split()
        if name in MEMINFO_KEYS and words and words[0].isdigit():
            out[MEMINFO_KEYS[name]] = int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    return out


def shm_offload_files(shm: Path = Path("/dev/shm")) -> list[dict[str, Any]]:
    """The ``vllm_offload_*`` files in ``shm`` with their sizes."""
    files = []
    for path in sorted(shm.glob("vllm_offload_*")):
        try:
            files.append({"name": path.name, "size_bytes": path.lstat().st_size})
        except OSError:
            continue  # removed between the listing and the stat
    return files


def node_state(meminfo: Path = Path("/proc/meminfo"), shm: Path = Path("/dev/shm")) -> dict[str, Any]:
    """Host memory and page cache, and the offload buffers left in ``shm``."""
    return {**read_meminfo(meminfo), "shm_offload_files": shm_offload_files(shm)}
