# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""The shared-memory filesystem: its size, and the ``vllm_offload_*`` files a vLLM run leaves there.

A stale one still holds host RAM (tmpfs pages) after the run that wrote it has ended.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_shm(shm_path: str) -> dict[str, Any]:
    """Sizes are None, and ``error`` says why, when ``shm_path`` cannot be read."""
    shm: dict[str, Any] = {
        "path": shm_path,
        "size_bytes": None,
        "free_bytes": None,
        "used_bytes": None,
        "vllm_offload_files": [],
        "vllm_offload_bytes": 0,
        "error": None,
    }
    try:
        st = os.statvfs(shm_path)
    except OSError as exc:
        shm["error"] = f"{shm_path}: {exc.strerror or exc}"
        return shm
    shm["size_bytes"] = st.f_blocks * st.f_frsize
    shm["free_bytes"] = st.f_bavail * st.f_frsize
    shm["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    files = []
    for path in sorted(Path(shm_path).glob("vllm_offload_*")):
        try:
            size = path.lstat().st_size
        except OSError:
            continue
        files.append({"name": path.name, "size_bytes": size})
    shm["vllm_offload_files"] = files
    shm["vllm_offload_bytes"] = sum(f["size_bytes"] for f in files)
    return shm
