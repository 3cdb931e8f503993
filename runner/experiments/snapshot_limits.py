"""A restore's physical limit: the seconds the node's measured rates allow it.

``limit_s = image bytes / the read rate of where the restore read the image + GPU bytes / the
pinned host-to-GPU copy rate`` (decimal GB/s, as fio and the reference campaign quote rates):

- where: ``disk`` with the page cache dropped reads the disk (the mode's ``disk_read_gb_s``, else
  the host's ``storage`` read of a disk, buffered first); an image in RAM (``tmpfs``: staged there
  or dumped there, or a ``warm`` restore's page cache) reads memory (``tmpfs_read_gb_s``, else the
  host's ``storage`` ``ram_read``, which needs no fio, else a fio ``storage`` read whose target is on
  tmpfs: ``NodeLimits.ram_read``);
- GPU bytes: what the engine held on the GPU at the dump (CRIU's CUDA plugin puts it back), plus,
  quiesced at level 1, the weights the wake copies back from host memory (the sleep's growth of
  the engine's host memory; an engine without GPU memory, the stand-in, copies nothing);
- the pinned host-to-GPU rate: the mode's ``h2d_gb_s``, else the host's ``storage`` ``h2d_copy``.

A rate neither gives leaves the limit empty, never 0; a term of 0 bytes needs no rate. Only the
copies are modelled: CRIU's process work, the wake's allocations and the first answer are what a
restore spends above its limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.experiments.limits import NodeLimits, Rate

__all__ = ["restore_limit"]

GB = 1e9
GIB = 2**30


def _rate(param: Any, measured: Rate | None) -> tuple[float | None, str]:
    if isinstance(param, int | float) and param > 0:
        return float(param), "mode parameter"
    return (measured.gb_s, f"storage: {measured.source}") if measured else (None, "")


def restore_limit(metrics: Mapping[str, Any], params: Mapping[str, Any], limits: NodeLimits | None) -> dict[str, Any]:
    """The limit of a trial's first restore from its metrics (``image_gib``, ``gpu_gib``, ``sleep_host_gib``,
    ``quiesce``, ``image_source``, ``restore_cache``), the mode's rates and the host's measured ones."""
    image = metrics.get("image_gib")
    if not isinstance(image, int | float):
        return {}
    in_ram = metrics.get("image_source") == "tmpfs" or metrics.get("restore_cache") == "warm"
    if in_ram:
        read, read_from = _rate(params.get("tmpfs_read_gb_s"), limits.ram_read() if limits else None)
    else:
        read, read_from = _rate(params.get("disk_read_gb_s"), limits.disk_read() if limits else None)
    gpu = float(metrics.get("gpu_gib") or 0.0)
    if metrics.get("quiesce") == "sleep" and metrics.get("gpu_mem_mib_awake"):  # a GPU engine's wake copies
        gpu += float(metrics.get("sleep_host_gib") or 0.0)                        # the backed-up weights back
    h2d, h2d_from = _rate(params.get("h2d_gb_s"), limits.copy("h2d", "pinned") if limits else None)
    out: dict[str, Any] = {"limit_read_gb_s": read, "limit_read_from": read_from or None,
                           "limit_gpu_gib": round(gpu, 3), "limit_h2d_gb_s": h2d, "limit_h2d_from": h2d_from or None}
    if (read or not image) and (h2d or not gpu):
        seconds = (image * GIB / GB / read if image else 0.0) + (gpu * GIB / GB / h2d if gpu and h2d else 0.0)
        out["limit_s"] = round(seconds, 3)
    return {k: v for k, v in out.items() if v is not None}
