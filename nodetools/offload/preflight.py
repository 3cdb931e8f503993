"""The offload preflight: may this trial run on this node? Every reason carries its numbers.

Pure over the ``node_facts`` module's facts plus ``docker ps``: the host RAM the offload tier pins
(per engine copy, times the copies, times a safety factor for vLLM's measured overshoot) against
what the NUMA nodes of the copies' GPUs can give, ``/dev/shm`` against the native backend's
mapped buffer, stale ``/dev/shm/vllm_offload_*`` files and leftover engine containers (an earlier
run lost a trial to the OOM killer with both on the node), free space for a file-system tier, the
context the load needs against ``max-model-len``, and the generic checks of
``nodetools.preflight`` (ports, GPUs, image, the mode's package). Stdlib only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodetools.loadgen.workload import with_chat_template
from nodetools.node_checks import check as node_check
from nodetools.node_checks import module_reasons
from nodetools.offload.layout import split_gpus
from nodetools.offload.leftovers import GIB, gib, leftover_containers
from nodetools.offload.lmcache_gate import extension_reasons

__all__ = ["Need", "capacity_reasons", "mount_of", "preflight", "preflight_node"]


@dataclass(frozen=True)
class Need:
    """What one trial asks of its node (planned by the runner from the mode's recipe)."""

    offload_gib: float = 0.0  # host RAM each engine copy's offload tier pins
    copies: int = 1
    gpus: tuple[int, ...] = ()  # all the engines' GPUs, split evenly between the copies
    safety_factor: float = 2.0
    uses_shm: bool = False  # vLLM's native backend maps its buffer under /dev/shm
    fs_dir: str = ""
    fs_gib: float = 0.0
    docker: bool = False
    image: str = ""  # docker runtime: the engine image, which must be on the node
    ports: tuple[int, ...] = ()  # one per engine copy: each must be free
    exists: tuple[str, ...] = ()  # paths the engine needs (a venv's vllm)
    python: str = ""  # the engine's Python (process runtime), which must import python_module
    python_module: str = ""  # a package the mode needs beside vLLM (lmcache); in the image for docker
    pythonpath: str = ""  # the engine's PYTHONPATH (vLLM installed with --target lives there)
    refuse_torch_ops: bool = False  # LMCache must bind its compiled CUDA extension (lmcache_gate)
    max_model_len: int | None = None
    context_tokens: int = 0  # the longest prompt the load sends plus its output

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Need:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key, kind in (("gpus", int), ("ports", int), ("exists", str)):
            known[key] = tuple(kind(v) for v in known.get(key) or ())
        known["max_model_len"] = _model_len(known.get("max_model_len"))
        return cls(**known)


def _model_len(value: Any) -> int | None:
    """vLLM's --max-model-len: an integer, or '32k' (x1000) / '32K' (x1024); None when not given."""
    if value in (None, ""):
        return None
    text = str(value).strip()
    scale = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _n(value: float) -> str:
    """A size as the campaign wrote it: 200, 0.5, 10,000,000 (never 1e+07)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _numa_available(facts: dict[str, Any], capacity: bool = False) -> dict[str, tuple[int, str]]:
    """Per NUMA node: bytes a new allocation can get there, and how that figure was made.

    Free memory plus the page cache that can be dropped (file pages minus shared memory, which is
    counted as a file page but cannot be dropped: stale offload files live there); with
    ``capacity``, the node's whole memory (what no later moment can exceed)."""
    out: dict[str, tuple[int, str]] = {}
    nodes = facts.get("numa") or []
    numa_total = sum(int(node.get("mem_total_bytes") or 0) for node in nodes)
    host_total = int((facts.get("memory") or {}).get("total_bytes") or 0)
    if nodes and host_total and numa_total < 0.9 * host_total:
        # Seen on the borrowed H200 (a Firecracker VM that grows its memory as it is used): node0's
        # meminfo said 12.3 GiB while MemTotal said 126 GiB. Per-node figures would refuse any
        # offload size that the host can hold, so the whole host's MemAvailable counts instead.
        return {}
    for node in nodes:
        if capacity:
            out[str(node["node"])] = (int(node.get("mem_total_bytes") or 0), "its MemTotal")
            continue
        free = int(node.get("mem_free_bytes") or 0)
        reclaimable = max(0, int(node.get("file_pages_bytes") or 0) - int(node.get("shmem_bytes") or 0))
        out[str(node["node"])] = (free + reclaimable, f"free {gib(free)} + reclaimable page cache {gib(reclaimable)}")
    return out


def _ram_checks(facts: dict[str, Any], need: Need, capacity: bool = False
                ) -> tuple[list[str], list[dict[str, Any]]]:
    """The offload tier's host RAM per NUMA node against what is available there (``capacity``:
    against all the memory there, for facts gathered earlier, where an unknown figure refuses nothing)."""
    per_copy = need.offload_gib * GIB * need.safety_factor
    numa = _numa_available(facts, capacity)
    gpu_node = {int(g["index"]): g.get("numa_node") for g in facts.get("gpus") or [] if g.get("index") is not None}
    demand: dict[str, float] = {}
    copies_on: dict[str, float] = {}
    gpus_on: dict[str, list[int]] = {}
    for copy_gpus in split_gpus(need.gpus, need.copies):
        # A copy draws on the NUMA node(s) of its GPUs, shared evenly; on the whole host when unknown.
        targets = sorted({str(gpu_node.get(g)) for g in copy_gpus if str(gpu_node.get(g)) in numa}) or ["all"]
        for node in targets:
            demand[node] = demand.get(node, 0.0) + per_copy / len(targets)
            copies_on[node] = copies_on.get(node, 0.0) + 1 / len(targets)
            gpus_on.setdefault(node, []).extend(g for g in copy_gpus if node == "all" or str(gpu_node.get(g)) == node)
    reasons, checks = [], []
    for node, need_bytes in sorted(demand.items()):
        if node == "all":
            if numa:
                avail = sum(v for v, _ in numa.values())
                how = f"summed over NUMA nodes {', '.join(sorted(numa))}"
            else:
                avail = int((facts.get("memory") or {}).get("total_bytes" if capacity else "available_bytes") or 0)
                how = "MemTotal" if capacity else "MemAvailable"
                if facts.get("numa"):
                    how += " (the NUMA nodes' meminfo covers less than 90% of MemTotal: a VM growing its memory)"
            where = "this host"
        else:
            avail, how = numa[node]
            where = f"NUMA node {node}"
        copies = round(copies_on[node], 2)
        checks.append({"where": where, "gpus": gpus_on.get(node, []), "copies": copies,
                       "need_gib": round(need_bytes / GIB, 2), "available_gib": round(avail / GIB, 2), "how": how})
        if need_bytes > avail and not (capacity and avail == 0):
            gpus = f" (GPUs {','.join(map(str, gpus_on[node]))})" if gpus_on.get(node) else ""
            plural = "y" if copies == 1 else "ies"
            there = "there in all" if capacity else "available there"
            reasons.append(
                f"host RAM: {copies:g} engine cop{plural} x {_n(need.offload_gib)} GiB offload x safety "
                f"{need.safety_factor:g} = {gib(need_bytes)} needed on {where}{gpus}, but only {gib(avail)} is "
                f"{there} ({how})")
    return reasons, checks


def _shm_check(facts: dict[str, Any], need: Need) -> tuple[list[str], dict[str, Any]]:
    shm = facts.get("shm") or {}
    reasons: list[str] = []
    stale = shm.get("vllm_offload_files") or []
    if stale:
        listed = ", ".join(f"{f['name']} ({gib(f['size_bytes'])})" for f in stale[:5])
        held = gib(shm.get("vllm_offload_bytes", 0))
        reasons.append(f"stale offload files in {shm.get('path', '/dev/shm')} hold {held}: {listed}; "
                       "remove them or set cleanup: true")
    check = {"path": shm.get("path"), "free_gib": None, "need_gib": 0.0, "stale_files": [f["name"] for f in stale]}
    if need.uses_shm and need.offload_gib > 0:
        need_bytes = need.offload_gib * GIB * need.copies
        check["need_gib"] = round(need_bytes / GIB, 2)
        free = shm.get("free_bytes")
        if free is None:
            reasons.append(f"{shm.get('path', '/dev/shm')} cannot be read ({shm.get('error')}): the native offload "
                           "buffer is mapped there")
        else:
            check["free_gib"] = round(free / GIB, 2)
            if need_bytes > free:
                reasons.append(_shm_shortfall(shm, need, f"{gib(free)} free (size {gib(shm.get('size_bytes') or 0)})"))
    return reasons, check


def _shm_shortfall(shm: dict[str, Any], need: Need, has: str) -> str:
    plural = "y" if need.copies == 1 else "ies"
    return (f"{shm.get('path', '/dev/shm')}: {need.copies} engine cop{plural} x {_n(need.offload_gib)} GiB = "
            f"{gib(need.offload_gib * GIB * need.copies)} needed for the native offload buffers, but it has {has}")


def mount_of(path: str, mounts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The mount (of the node_facts facts) holding ``path``: the longest mount point above it."""
    best = None
    for mount in mounts:
        point = str(mount.get("mountpoint") or "")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(str(best["mountpoint"]))):
            best = mount
    return best


def _fs_available(path: str, facts: dict[str, Any]) -> tuple[int | None, str]:
    mount = mount_of(path, facts.get("mounts") or [])
    if mount is not None and mount.get("available_bytes") is not None:
        return int(mount["available_bytes"]), str(mount["mountpoint"])
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the tier's folder may not exist yet: its nearest existing parent decides
    try:
        st = os.statvfs(probe)
    except OSError:
        return None, str(probe)
    return st.f_bavail * st.f_frsize, str(probe)


def _fs_check(facts: dict[str, Any], need: Need) -> tuple[list[str], dict[str, Any] | None]:
    if not need.fs_dir:
        return [], None
    avail, where = _fs_available(need.fs_dir, facts)
    check = {"dir": need.fs_dir, "filesystem": where, "need_gib": need.fs_gib,
             "available_gib": None if avail is None else round(avail / GIB, 2)}
    if avail is None:
        return [f"file-system tier: the free space of {need.fs_dir} cannot be read"], check
    if need.fs_gib * GIB > avail:
        return [f"file-system tier: {need.fs_dir} needs {_n(need.fs_gib)} GiB free, but its filesystem ({where}) has "
                f"{gib(avail)} available"], check
    return [], check


def _context_check(need: Need) -> list[str]:
    context = with_chat_template(need.context_tokens)
    if need.max_model_len is None or not context or context <= need.max_model_len:
        return []
    return [f"context: the load needs about {context:,} tokens per request (longest prompt, its output and the "
            f"chat template), more than max-model-len {need.max_model_len:,}"]


def _engine_checks(need: Need) -> list[str]:
    """The generic preconditions (nodetools.preflight): ports free, GPUs idle, image, binaries and the
    mode's package (in the image) there."""
    reasons: list[str] = []
    for i, port in enumerate(need.ports):
        first = i == 0
        reasons += node_check(port, list(need.gpus) if first else [], 2048, list(need.exists) if first else [],
                              "", "", need.image if first else "", need.python_module if first and need.image else "")
    return reasons + _module_check(need)


def _module_check(need: Need) -> list[str]:
    """The mode's package importable by the engine's Python (process runtime; in the image for docker)."""
    if not need.python_module or need.image or not need.python:
        return []
    reasons = module_reasons(need.python, need.python_module, need.pythonpath)
    if not reasons and need.python_module == "lmcache" and need.refuse_torch_ops:
        reasons = extension_reasons(need.python, need.pythonpath)
    return reasons


def capacity_reasons(facts: dict[str, Any] | None, need: Need) -> list[str]:
    """What refuses the trial for certain before its node is asked (the runner's plan): the context
    against ``max-model-len`` and, from facts an earlier run gathered (None: none cached), the offload
    tier's host RAM against all the memory of the copies' NUMA nodes (or the host's) and the native
    buffers against the size of /dev/shm. What is free changes by the trial's start, and the node's
    own preflight checks it then; what is there in all does not."""
    reasons = _context_check(need)
    if not facts or need.offload_gib <= 0:
        return reasons
    try:
        ram, _ = _ram_checks(facts, need, capacity=True)
    except ValueError:  # GPUs that do not split between the copies: the plan skips the trial with that reason
        ram = []
    shm = facts.get("shm") or {}
    size = shm.get("size_bytes")
    if need.uses_shm and size and need.offload_gib * GIB * need.copies > size:
        ram.append(_shm_shortfall(shm, need, f"{gib(size)} in all (its size)"))
    return ram + reasons


def preflight(facts: dict[str, Any], need: Need, containers: list[dict[str, str]] | None = None
              ) -> dict[str, Any]:
    """``{"reasons": [...], "checks": {...}}``: an empty ``reasons`` lets the trial start."""
    reasons: list[str] = []
    checks: dict[str, Any] = {"safety_factor": need.safety_factor, "copies": need.copies}
    try:
        ram_reasons, checks["ram"] = _ram_checks(facts, need) if need.offload_gib > 0 else ([], [])
    except ValueError as exc:
        return {"reasons": [str(exc)], "checks": checks}
    reasons += ram_reasons
    shm_reasons, checks["shm"] = _shm_check(facts, need)
    reasons += shm_reasons
    if containers:
        listed = ", ".join(f"{c['name']} ({c['image']})" for c in containers)
        reasons.append(f"leftover engine containers hold memory: {listed}; remove them or set cleanup: true")
    checks["containers"] = containers or []
    fs_reasons, checks["fs"] = _fs_check(facts, need)
    reasons += fs_reasons
    reasons += _context_check(need)
    return {"reasons": reasons, "checks": checks}


def preflight_node(facts: dict[str, Any], need: Need) -> dict[str, Any]:
    """``preflight`` plus what only the node itself can tell: containers, ports, GPUs, image."""
    containers, docker_error = leftover_containers() if need.docker else ([], None)
    result = preflight(facts, need, containers)
    result["reasons"] = _engine_checks(need) + result["reasons"] + ([docker_error] if docker_error else [])
    return result


