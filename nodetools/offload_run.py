"""The node-side driver of one offload trial: protect the node, start, load, snapshot, stop, clean.

    python -m nodetools.offload_run clear-leftovers [--shm /dev/shm]
    python -m nodetools.offload_run preflight --facts FACTS.json|- --need JSON [--out preflight.json]
        [--facts-out facts.json]
    python -m nodetools.offload_run run --launch launch.json --dir WORKDIR --load JSON [--quality JSON]
        [--max-failed N] [--timeout-s 1800] [--poll-s 0.2] [--trial ID] [--lease-dir DIR] [--lock-dir DIR]
    python -m nodetools.offload_run cleanup --dir WORKDIR --port N [--shm /dev/shm] [--trial ID] [--lease-dir DIR]

``preflight`` decides from the ``node_facts`` module's facts (and ``docker ps``) whether the
trial may run: the host RAM its offload tier pins (per engine copy, times the copies, times a
safety factor for vLLM's measured overshoot) against what is free on the NUMA nodes of the
copies' GPUs, ``/dev/shm`` against the native backend's mapped buffer, stale
``/dev/shm/vllm_offload_*`` files and leftover engine containers (an earlier run lost a trial to
the OOM killer with both on the node), free space for a file-system tier, and the context the load needs
against ``max-model-len``. It prints ``{"reasons": [...], "checks": {...}}``: every reason carries
its numbers. ``clear-leftovers`` removes the stale files and containers (a campaign's
``cleanup: true``) before the facts are read.

``run`` takes every copy's port lock and writes its lease (``nodetools.lease``, as the cold-start
timer does), starts every engine copy with ``nodetools.coldstart``'s ``Timer`` (own process group,
``engine.pgid``, the group in the lease), waits for each to answer, snapshots ``/metrics``, drives the multi-turn load
(``nodetools.loadgen``) while watching the engines, snapshots ``/metrics`` again, runs the
quality check, and stops every copy; ``run.json`` says what happened. Copy 0 logs to
``WORKDIR/server.log``, copy i to ``WORKDIR/copy<i>/server.log``.

``cleanup`` (always, after the trial) stops whatever a killed run left (what the trial's leases
name, each copy's recorded group), removes the
``vllm_offload_*`` files this trial created and its file-system tier, and keeps the kernel log
lines written since the trial began (``dmesg.txt``: the OOM killer's evidence).

Exit codes of ``run`` (nodetools.exitcodes): 0 ok; 2 bad input; 3 an engine exited (before it
answered, or during the run); 4 not ready in time, the load stopped at its wall-time cap, or
stopped by SIGTERM; 6 more failed requests than allowed; 7 an engine port is locked by another run
or already answers. Stdlib and aiohttp only: this runs on the node.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.coldstart import Timer, add_claim_options, cleanup
from nodetools.lease import Claim, PortBusy, claim, default_lease_dir, default_trial
from nodetools.loadgen.multiturn import MultiTurnLoad, Workload
from nodetools.loadgen.quality import QualityCheck, QualitySpec
from nodetools.preflight import check as node_check
from nodetools.proc import interrupt_on_term, write_json_atomic

__all__ = ["Need", "clear_leftovers", "leftover_containers", "preflight", "preflight_node", "remove_trial_files",
           "split_gpus"]

GIB = 2**30
CONTAINER_PREFIX = "gpu-campaign-"


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


# --- preflight -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    """What one trial asks of its node (built by the playbook from the mode's recipe)."""

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


def split_gpus(gpus: tuple[int, ...] | list[int], copies: int) -> list[list[int]]:
    """The GPUs of each engine copy: consecutive, equal shares (none for an engine without GPUs)."""
    if not gpus:
        return [[] for _ in range(copies)]
    if len(gpus) % copies:
        raise ValueError(f"{len(gpus)} GPUs cannot be split evenly between {copies} engine copies")
    share = len(gpus) // copies
    return [list(gpus[i * share:(i + 1) * share]) for i in range(copies)]


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _n(value: float) -> str:
    """A size as the campaign wrote it: 200, 0.5, 10,000,000 (never 1e+07)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _numa_available(facts: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """Per NUMA node: bytes a new allocation can get there, and how that figure was made.

    Free memory plus the page cache that can be dropped (file pages minus shared memory, which is
    counted as a file page but cannot be dropped: stale offload files live there)."""
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
        free = int(node.get("mem_free_bytes") or 0)
        reclaimable = max(0, int(node.get("file_pages_bytes") or 0) - int(node.get("shmem_bytes") or 0))
        out[str(node["node"])] = (free + reclaimable, f"free {_gib(free)} + reclaimable page cache {_gib(reclaimable)}")
    return out


def _ram_checks(facts: dict[str, Any], need: Need) -> tuple[list[str], list[dict[str, Any]]]:
    per_copy = need.offload_gib * GIB * need.safety_factor
    numa = _numa_available(facts)
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
                avail = int((facts.get("memory") or {}).get("available_bytes") or 0)
                how = "MemAvailable"
                if facts.get("numa"):
                    how += " (the NUMA nodes' meminfo covers less than 90% of MemTotal: a VM growing its memory)"
            where = "this host"
        else:
            avail, how = numa[node]
            where = f"NUMA node {node}"
        copies = round(copies_on[node], 2)
        checks.append({"where": where, "gpus": gpus_on.get(node, []), "copies": copies,
                       "need_gib": round(need_bytes / GIB, 2), "available_gib": round(avail / GIB, 2), "how": how})
        if need_bytes > avail:
            gpus = f" (GPUs {','.join(map(str, gpus_on[node]))})" if gpus_on.get(node) else ""
            plural = "y" if copies == 1 else "ies"
            reasons.append(
                f"host RAM: {copies:g} engine cop{plural} x {_n(need.offload_gib)} GiB offload x safety "
                f"{need.safety_factor:g} = {_gib(need_bytes)} needed on {where}{gpus}, but only {_gib(avail)} is "
                f"available there ({how})")
    return reasons, checks


def _shm_check(facts: dict[str, Any], need: Need) -> tuple[list[str], dict[str, Any]]:
    shm = facts.get("shm") or {}
    reasons: list[str] = []
    stale = shm.get("vllm_offload_files") or []
    if stale:
        listed = ", ".join(f"{f['name']} ({_gib(f['size_bytes'])})" for f in stale[:5])
        held = _gib(shm.get("vllm_offload_bytes", 0))
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
                plural = "y" if need.copies == 1 else "ies"
                reasons.append(f"{shm.get('path', '/dev/shm')}: {need.copies} engine cop{plural} x "
                               f"{_n(need.offload_gib)} GiB = {_gib(need_bytes)} needed for the native offload "
                               f"buffers, but it has {_gib(free)} free (size {_gib(shm.get('size_bytes') or 0)})")
    return reasons, check


def _mount_of(path: str, mounts: list[dict[str, Any]]) -> dict[str, Any] | None:
    best = None
    for mount in mounts:
        point = str(mount.get("mountpoint") or "")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(str(best["mountpoint"]))):
            best = mount
    return best


def _fs_available(path: str, facts: dict[str, Any]) -> tuple[int | None, str]:
    mount = _mount_of(path, facts.get("mounts") or [])
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
                f"{_gib(avail)} available"], check
    return [], check


def _context_check(need: Need) -> list[str]:
    # 1% + 32 tokens for the chat template's markers around every message.
    context = int(need.context_tokens * 1.01) + 32 if need.context_tokens else 0
    if need.max_model_len is None or not context or context <= need.max_model_len:
        return []
    return [f"context: the load needs about {context:,} tokens per request (longest prompt, its output and the "
            f"chat template), more than max-model-len {need.max_model_len:,}"]


def _engine_checks(need: Need) -> list[str]:
    """The generic preconditions (nodetools.preflight): ports free, GPUs idle, image and binaries there."""
    reasons: list[str] = []
    for i, port in enumerate(need.ports):
        reasons += node_check(port, list(need.gpus) if i == 0 else [], 2048, list(need.exists) if i == 0 else [],
                              "", "", need.image if i == 0 else "", "")
    return reasons


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


def clear_leftovers(shm: Path, docker: str = "docker") -> list[str]:
    """Remove stale ``vllm_offload_*`` files and leftover engine containers (``cleanup: true``)."""
    removed = []
    for path in sorted(shm.glob("vllm_offload_*")):
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            removed.append(f"{path} ({_gib(size)})")
    containers, _ = leftover_containers(docker)
    for c in containers:
        done = subprocess.run([docker, "rm", "--force", c["name"]], capture_output=True, text=True, check=False,
                              timeout=120)
        if done.returncode == 0:
            removed.append(f"container {c['name']} ({c['image']})")
    return removed


# --- run -----------------------------------------------------------------------------------------


def _metrics(port: int, path: Path) -> str | None:
    """Scrape ``/metrics`` to ``path``; the error in words when it cannot."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            path.write_bytes(resp.read())
    except OSError as exc:
        return f"/metrics on port {port}: {exc}"
    return None


def _copy_dir(workdir: Path, index: int) -> Path:
    return workdir if index == 0 else workdir / f"copy{index}"


@dataclass
class _Run:
    launch: dict[str, Any]
    workdir: Path
    poll_s: float
    timeout_s: float
    timers: list[Timer] = field(default_factory=list)
    out: dict[str, Any] = field(default_factory=lambda: {"copies": [], "errors": []})
    died: str | None = None
    claim: Claim | None = None  # the port locks and the lease every copy's group goes into

    def start(self) -> int:
        for i, spec in enumerate(self.launch["copies"]):
            log_dir = _copy_dir(self.workdir, i)
            log_dir.mkdir(parents=True, exist_ok=True)
            timer = Timer(spec, log_dir / "server.log", self.poll_s, self.timeout_s)
            timer.claim = self.claim
            self.timers.append(timer)
            timer.start()  # all copies start together, as a node's replicas would
        for i, timer in enumerate(self.timers):
            rc = timer.wait_first_token("ready")
            if rc != exitcodes.OK:
                what = "exited" if rc == exitcodes.DIED else f"did not answer within {self.timeout_s:.0f} s"
                self.out["error"] = f"engine copy {i} {what} before it answered (see its server.log)"
                if rc == exitcodes.DIED:
                    self.died = self.out["error"]
                return rc
        self.out["ready_s"] = max(t.out["events"]["ready"] for t in self.timers)
        return exitcodes.OK

    def snapshot(self, name: str) -> None:
        for i, timer in enumerate(self.timers):
            error = _metrics(timer.port, _copy_dir(self.workdir, i) / f"metrics_{name}.txt")
            if error:
                self.out["errors"].append(error)

    def dead(self) -> str | None:
        for i, timer in enumerate(self.timers):
            if timer.proc is not None and timer.proc.poll() is not None:
                rc = timer.proc.returncode
                how = f"killed by signal {-rc}" if rc < 0 else f"rc {rc}"
                return f"engine copy {i} exited ({how})"
        return None

    async def load(self, workload: Workload, model: str) -> dict[str, Any]:
        urls = [f"http://127.0.0.1:{t.port}" for t in self.timers]
        load = MultiTurnLoad(workload, urls, model, self.workdir / "requests.jsonl")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        reasons: list[str] = []

        def on_term() -> None:
            reasons.append("the runner stopped the trial (SIGTERM)")
            stop.set()

        async def watch() -> None:
            while not stop.is_set():
                died = self.dead()
                if died:
                    self.died = died
                    reasons.append(died)
                    stop.set()
                await asyncio.sleep(0.2)

        loop.add_signal_handler(signal.SIGTERM, on_term)
        watcher = asyncio.create_task(watch())
        try:
            return await load.run(stop, lambda: reasons[0] if reasons else "stopped")
        finally:
            watcher.cancel()
            loop.remove_signal_handler(signal.SIGTERM)

    def stop(self) -> None:
        for timer in self.timers:
            timer.stop()
        self.out["copies"] = [t.out for t in self.timers]


def _run(args: argparse.Namespace) -> int:
    try:
        launch = json.loads(args.launch.read_text())
        if not launch.get("copies"):
            raise KeyError("copies")
        workload = Workload(**_known(Workload, json.loads(args.load)))
        quality = QualitySpec(**_known(QualitySpec, json.loads(args.quality))) if args.quality else None
        ports = [int(spec["port"]) for spec in launch["copies"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _err(f"offload_run: bad input: {exc}")
        return exitcodes.BAD_INPUT
    try:
        with claim("offload_run run", args.trial or default_trial(args.dir), args.dir, ports, args.lease_dir,
                   args.lock_dir) as held:
            return _run_claimed(_Run(launch, args.dir, args.poll_s, args.timeout_s, claim=held), args, workload,
                                quality)
    except PortBusy as exc:
        _err(f"offload_run: {exc}")
        return exitcodes.BUSY


def _run_claimed(run: _Run, args: argparse.Namespace, workload: Workload, quality: QualitySpec | None) -> int:
    interrupt_on_term()  # a phase timeout, or the reaper, must still stop the engines
    rc = exitcodes.BAD_INPUT
    try:
        rc = run.start()
        if rc == exitcodes.OK:
            rc = _measure(run, args, workload, quality)
    except KeyboardInterrupt:
        run.out["error"] = "interrupted (SIGTERM)"
        rc = exitcodes.TIMEOUT
    finally:
        run.stop()
        run.out["rc"] = rc
        run.out["engine_died"] = run.died
        write_json_atomic(args.dir / "run.json", run.out)
    if rc != exitcodes.OK:
        _err(f"offload_run: {run.out.get('error') or 'failed'}")
    return rc


def kv_bytes_per_token(model_dir: Path, engine_argv: list[str]) -> int | None:
    """KV-cache bytes per token from the model's config.json (K and V of every layer's KV heads),
    or None for a model this formula does not describe (no local config, MLA, missing fields).

    vLLM's log gives GPU bytes per token only as 'Available KV cache memory' over 'GPU KV cache
    size', which --num-gpu-blocks-override breaks: the first H200 offload run priced a token at
    1.2 MB instead of 64 KiB that way."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (config.get("hidden_size") // heads if heads and config.get("hidden_size")
                                          else None)
    if not (layers and kv_heads and head_dim) or config.get("kv_lora_rank"):
        return None
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    size = 4 if "32" in dtype else 2
    if "--kv-cache-dtype" in engine_argv and "fp8" in engine_argv[engine_argv.index("--kv-cache-dtype") + 1]:
        size = 1
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * size


def _measure(run: _Run, args: argparse.Namespace, workload: Workload, quality: QualitySpec | None) -> int:
    model = str(run.launch["copies"][0]["model"])
    run.out["kv_bytes_per_token"] = kv_bytes_per_token(Path(model), list(run.launch["copies"][0].get("argv") or []))
    run.snapshot("before")
    # Where the load starts and ends in each server log: the report reads the log's last stats
    # line *of the load*, not one that also counts the quality check's requests.
    logs = [t.log for t in run.timers]
    run.out["log_offsets"] = [{"load_start": _size(log)} for log in logs]
    summary = asyncio.run(run.load(workload, model))
    interval = float((run.launch["copies"][0].get("env") or {}).get("VLLM_LOG_STATS_INTERVAL") or 10)
    for offsets, log in zip(run.out["log_offsets"], logs):  # noqa: B905 (one per log; Python 3.8 has no strict)
        offsets["load_end"] = _next_stats_line(log, _size(log), interval + 2)
    interrupt_on_term()  # the loop's handler is gone: ours again
    run.out["load"] = summary
    if run.died is None:
        run.died = run.dead()
    if run.died is None:
        run.snapshot("after")
    counts = summary["counts"]
    failed = counts["failed"] + counts["not_sent"]
    if quality is not None and run.died is None:
        check = QualityCheck(quality, f"http://127.0.0.1:{run.timers[0].port}", model, args.dir / "quality.jsonl",
                             engine_kind=str(run.launch.get("engine_kind") or ""))
        run.out["quality"] = asyncio.run(check.run())
    if run.died is not None:
        turn = summary.get("first_failed_turn")
        run.out["error"] = (f"{run.died} during {'the load' if turn is None else f'turn {turn} of the load'} "
                            f"({counts['ok']} ok, {counts['failed']} failed, {counts['not_sent']} not sent of "
                            f"{workload.sessions * workload.turns} requests)")
        return exitcodes.DIED
    if summary["stopped"]:
        run.out["error"] = f"load stopped: {summary['stopped']}"
        return exitcodes.TIMEOUT
    if failed > args.max_failed:
        run.out["error"] = (f"{failed} of {workload.sessions * workload.turns} requests failed or were not sent "
                            f"(allowed: {args.max_failed}); see requests.jsonl")
        return exitcodes.FAILED_REQUESTS
    return exitcodes.OK


def _next_stats_line(log: Path, offset: int, timeout_s: float) -> int:
    """Where the first stats line written after ``offset`` ends (the one covering the load's last
    seconds), waiting for it up to ``timeout_s``; ``offset`` itself when none comes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), log.open("rb") as fh:
            fh.seek(offset)
            tail = fh.read()
            at = tail.find(b"Prefix cache hit rate")
            end = tail.find(b"\n", at)
            if at >= 0 and end >= 0:
                return offset + end + 1
        time.sleep(0.1)
    return offset


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _known(cls: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that ``cls`` (a dataclass) takes: a mode's params carry more."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


# --- cleanup -------------------------------------------------------------------------------------


def remove_trial_files(shm: Path, since: float, fs_dir: str) -> list[str]:
    """The ``vllm_offload_*`` files created since ``since`` (a dead engine leaves its buffer behind)
    and the trial's own file-system tier folder."""
    removed = []
    for path in sorted(shm.glob("vllm_offload_*")):
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            if stat.st_mtime >= since - 1:
                path.unlink()
                removed.append(f"{path} ({_gib(stat.st_size)})")
    if fs_dir and Path(fs_dir).is_dir():
        shutil.rmtree(fs_dir, ignore_errors=True)
        removed.append(f"file-system tier {fs_dir}")
    return removed


def _kernel_log_since(since: float) -> str:
    """Kernel log lines stamped after ``since`` (unix seconds), or why they cannot be read."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        done = subprocess.run(["dmesg"], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"# kernel log not readable: {exc}\n"
    if done.returncode != 0:
        return f"# kernel log not readable: {done.stderr.strip()[:200]}\n"
    boot = time.time() - uptime
    keep = []
    for line in done.stdout.splitlines():
        stamp, _, _ = line.lstrip("[ ").partition("]")
        with contextlib.suppress(ValueError):
            if boot + float(stamp) >= since - 1:
                keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def _cleanup(args: argparse.Namespace) -> dict[str, Any]:
    launch_file = args.dir / "launch.json"
    launch = json.loads(launch_file.read_text()) if launch_file.is_file() else {}
    copies = launch.get("copies") or []
    stopped: list[str] = []
    free = True
    trial, lease_dir = args.trial or default_trial(args.dir), args.lease_dir or default_lease_dir(args.dir)
    for i, spec in enumerate(copies or [{"port": args.port}]):
        result = cleanup(_copy_dir(args.dir, i), int(spec["port"]), str(spec.get("container") or ""), trial,
                         lease_dir)
        stopped += result["stopped"]
        free = free and result["port_free"]
    # An engine was started iff a timer wrote its group id: only then can there be files to remove.
    starts = [p.stat().st_mtime for i in range(max(1, len(copies)))
              if (p := _copy_dir(args.dir, i) / "engine.pgid").is_file()]
    removed: list[str] = []
    if starts:
        removed = remove_trial_files(args.shm, min(starts), str(launch.get("fs_dir") or ""))
        (args.dir / "dmesg.txt").write_text(_kernel_log_since(min(starts)))
    return {"stopped": stopped, "ports_free": free, "removed": removed}


# --- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.offload_run", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("clear-leftovers")
    c.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    f = sub.add_parser("preflight")
    f.add_argument("--facts", required=True, help="node_facts output: a JSON file, or - for stdin")
    f.add_argument("--need", required=True, help="JSON: what the trial asks of the node (Need)")
    f.add_argument("--out", type=Path, help="where to keep the result (its folder is created)")
    f.add_argument("--facts-out", type=Path, help="where to keep the facts it decided on")
    r = sub.add_parser("run")
    r.add_argument("--launch", type=Path, required=True)
    r.add_argument("--dir", type=Path, required=True)
    r.add_argument("--load", required=True, help="JSON: the Workload")
    r.add_argument("--quality", default="", help="JSON: the QualitySpec (empty: no quality check)")
    r.add_argument("--max-failed", type=int, default=0)
    r.add_argument("--timeout-s", type=float, default=1800, help="per engine copy, to its first answer")
    r.add_argument("--poll-s", type=float, default=0.2)
    add_claim_options(r)
    k = sub.add_parser("cleanup")
    k.add_argument("--dir", type=Path, required=True)
    k.add_argument("--port", type=int, required=True, help="the engine port, checked when nothing was launched")
    k.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    k.add_argument("--trial", default="", help="whose leases to reap (the folder's name)")
    k.add_argument("--lease-dir", type=Path, default=None, help="the lease folder (.leases beside --dir)")
    args = p.parse_args(argv)
    if args.command == "clear-leftovers":
        _out(json.dumps({"removed": clear_leftovers(args.shm)}))
        return exitcodes.OK
    if args.command == "preflight":
        try:
            facts = json.loads(sys.stdin.read() if args.facts == "-" else Path(args.facts).read_text())
            need = Need.from_json(json.loads(args.need))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            _err(f"offload_run preflight: bad input: {exc}")
            return exitcodes.BAD_INPUT
        result = preflight_node(facts, need)
        for path, data in ((args.out, result), (args.facts_out, facts)):
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        _out(json.dumps(result))
        return exitcodes.OK
    if args.command == "run":
        return _run(args)
    _out(json.dumps(_cleanup(args)))
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
