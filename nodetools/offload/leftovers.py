"""Stale offload buffers and leftover engine containers: found for the preflight, removed on request.

A dead engine leaves its ``/dev/shm/vllm_offload_*`` buffer behind, and a container of an earlier
run keeps its memory; ``cleanup: true`` in a campaign removes both before the facts are read.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

__all__ = ["CONTAINER_PREFIX", "GIB", "clear_leftovers", "gib", "leftover_containers"]

GIB = 2**30
CONTAINER_PREFIX = "gpu-campaign-"


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def leftover_containers(docker: str = "docker") -> tuple[list[dict[str, str]], str | None]:
    """Running containers that look like engines: ours (``gpu-campaign-*``) or any vLLM/LMCache image."""
    if shutil.which(docker) is None:
        return [], None
    done = subprocess.run([docker, "ps", "--format", "{{.Names}}\t{{.Image}}"], capture_output=True, text=True,
                          check=False, timeout=60)
    if done.returncode != 0:
        return [], f"docker ps failed: {(done.stderr or done.stdout).strip()[:200]}"
    out = []
    for line in done.stdout.splitlines():
        name, _, image = line.partition("\t")
        if name.startswith(CONTAINER_PREFIX) or "vllm" in image.lower() or "lmcache" in image.lower():
            out.append({"name": name, "image": image})
    return out, None


def clear_leftovers(shm: Path, docker: str = "docker") -> list[str]:
    """Remove stale ``vllm_offload_*`` files and leftover engine containers (``cleanup: true``)."""
    removed = []
    for path in sorted(shm.glob("vllm_offload_*")):
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            removed.append(f"{path} ({gib(size)})")
    containers, _ = leftover_containers(docker)
    for c in containers:
        done = subprocess.run([docker, "rm", "--force", c["name"]], capture_output=True, text=True, check=False,
                              timeout=120)
        if done.returncode == 0:
            removed.append(f"container {c['name']} ({c['image']})")
    return removed
