"""Quiesce an engine before its snapshot (vLLM's sleep mode), and wake it after the restore.

``sleep`` (level 1): ``POST /sleep?level=1``: vLLM frees its KV pool and copies the weights into
host buffers, so the image holds the weights and the processes, not the pool; after the restore
``POST /wake_up`` puts them back on the GPU. ``sleep2`` (level 2): the weights are dropped too;
after the restore vLLM 0.24.0 wakes their memory (``POST /wake_up?tags=weights``), reads them back
from the model's files (``POST /collective_rpc {"method": "reload_weights"}``, a development
route like the sleep's: ``VLLM_SERVER_DEV_MODE=1``), then wakes the KV pool (``POST
/wake_up?tags=kv_cache``), which resumes scheduling. The reload is timed as its own stage
(``reload_s``); ``wake_s`` is the wakes' seconds.

What the sleep took from host memory (``sleep_host_bytes``): the growth of the engine's resident
memory, VmRSS summed over its process group, which counts anonymous, file-backed and shared pages
alike, so a pinned buffer counts whether it is anonymous memory, a memfd or a driver mapping; it
is the engine's own, where /proc/meminfo's Shmem and MemAvailable (recorded beside it,
``meminfo_delta``) move with everything on the node. Stdlib only: this runs on the node.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path
from typing import Any

from nodetools.gpu import memory_used_mib
from nodetools.http_probe import post
from nodetools.node_state import read_meminfo
from nodetools.proc import PROC, group_members

__all__ = ["LEVELS", "Quiesce", "group_memory"]

LEVELS = {"none": 0, "sleep": 1, "sleep2": 2}
RELOAD = {"method": "reload_weights"}
_STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")
HTTP_TIMEOUT_S = 600  # an 8B engine's reload reads 16 GB


def group_memory(pgid: int, proc_root: Path = PROC) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and RssShmem in bytes, summed over the live processes of group ``pgid``."""
    total = dict.fromkeys(_STATUS_KEYS, 0)
    for pid, _ in group_members(pgid, proc_root):
        try:
            lines = (proc_root / str(pid) / "status").read_text().splitlines()
        except OSError:
            continue  # gone between the listing and the read
        for line in lines:
            name, _, rest = line.partition(":")
            words = rest.split()
            if name in total and words and words[0].isdigit():
                total[name] += int(words[0]) * 1024
    return total


class Quiesce:
    """The sleep before a snapshot and the wake after it; ``level`` 0 does nothing."""

    def __init__(self, quiesce: str, port: int, gpus: list[int]) -> None:
        self.name = quiesce
        self.level = LEVELS[quiesce]
        self.port = port
        self.gpus = gpus

    def _post(self, path: str, body: dict[str, Any] | None = None) -> tuple[float, str]:
        """POST ``path``: (seconds, an error naming the step, or "")."""
        started = time.time()
        try:
            status, answer = post(self.port, path, body, HTTP_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as exc:
            return round(time.time() - started, 4), f"POST {path} failed: {exc}"
        took = round(time.time() - started, 4)
        if status != 200:
            return took, f"POST {path} answered HTTP {status}: {answer[:300].decode(errors='replace')} (see server.log)"
        return took, ""

    def sleep(self, pgid: int, record: dict[str, Any]) -> str:
        """Put the engine to sleep at its level; the figures into ``record``; an error or ""."""
        if not self.level:
            return ""
        record.update(level=self.level, gpu_mem_mib_awake=memory_used_mib(self.gpus))
        rss, meminfo = group_memory(pgid), read_meminfo()
        record["sleep_s"], error = self._post(f"/sleep?level={self.level}")
        if error:
            return f"quiesce {self.name}: {error}"
        after_rss, after_meminfo = group_memory(pgid), read_meminfo()
        record["gpu_mem_mib_asleep"] = memory_used_mib(self.gpus)
        record["host_memory_awake"], record["host_memory_asleep"] = rss, after_rss
        record["sleep_host_bytes"] = max(0, after_rss["VmRSS"] - rss["VmRSS"])
        record["meminfo_delta"] = {k: after_meminfo[k] - meminfo[k] for k in ("shmem_bytes", "mem_available_bytes")
                                   if k in meminfo and k in after_meminfo}
        return ""

    def wake(self, record: dict[str, Any]) -> str:
        """Wake the restored engine (level 2: its weights, their reload, its KV pool); seconds into
        ``record`` (``wake_s``, ``reload_s``); an error naming the step, or ""."""
        if not self.level:
            return ""
        if self.level == 1:
            record["wake_s"], error = self._post("/wake_up")
            return f"wake after the restore: {error}" if error else ""
        weights_s, error = self._post("/wake_up?tags=weights")
        if error:
            return f"wake after the restore: {error}"
        record["reload_s"], error = self._post("/collective_rpc", RELOAD)
        if error:
            return f"weights reload after the level-2 wake: {error}"
        kv_s, error = self._post("/wake_up?tags=kv_cache")
        record["wake_s"] = round(weights_s + kv_s, 4)
        return f"wake after the restore: {error}" if error else ""
