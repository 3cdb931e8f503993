"""Every precondition of a snapshot mode, checked on the node before anything runs.

``gates`` returns the unmet ones as reasons a user can act on (the trial is then skipped with
them) and the facts it read (CRIU's version, the network-lock method it would take, the images
folder's filesystem, ...). What a snapshot moves to host memory and writes to its images is the
engine's share of GPU memory, or, quiesced, only the weights a level-1 sleep backs up (at least
the model folder's weight files; nothing counted for dummy weights or a level-2 sleep).
Stdlib only: this runs on the node.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodetools.gpu import driver_major, memory_total_mib, persistence_off
from nodetools.node_state import read_meminfo
from nodetools.snapshot import cuda_tool, images
from nodetools.snapshot.criu_node import (
    DEFAULT_FLAGS,
    MIN_CRIU,
    choose_network_lock,
    criu_check,
    criu_feature,
    criu_version,
    cuda_plugin_dir,
    flag_problems,
    plugin_dirs,
)
from nodetools.snapshot.io_uring import SYSCTL
from nodetools.snapshot.quiesce import LEVELS
from nodetools.vllm_cli import subcommand_reasons

__all__ = ["IPC_RESTORE_DRIVER", "LOCK_ACTION_DRIVER", "checkpoint_ram_reasons", "engine_gpu_bytes", "gates",
           "image_reasons", "mem_available_bytes"]

IPC_RESTORE_DRIVER = 610  # cuda-checkpoint restores processes that use CUDA IPC (any TP>1 engine) from 610 on
LOCK_ACTION_DRIVER = 570  # the separate lock/checkpoint/restore/unlock actions (and the driver API) from 570 on
GIB = 2**30
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
ENGINE_GPU = "the engine's GPU memory"


def mem_available_bytes() -> int:
    return read_meminfo().get("mem_available_bytes", 0)


def engine_gpu_bytes(memory_mib: Mapping[int, int], gpus: list[int], fraction: float) -> int:
    """The GPU memory a dump moves to host RAM: vLLM takes ``fraction`` (gpu-memory-utilization) of
    each of its GPUs (the first H200 run refused a 0.5 engine because the whole 140 GiB card was
    counted against 125 GiB of RAM)."""
    return int(sum(mib for index, mib in memory_mib.items() if index in gpus) * 2**20 * fraction)


def image_reasons(images_dir: str, fs: Mapping[str, Any], room: int | None, gpu_bytes: int, ram: int | None,
                  words: tuple[str, str] = ("free", "available")) -> list[str]:
    """A criu image against its folder's filesystem (``fs``: fs_type, in_ram) with ``room`` bytes,
    and against ``ram`` bytes of host RAM (None: not known); ``words`` say what those figures are."""
    reasons = []
    if gpu_bytes and room is not None and room < gpu_bytes:
        reasons.append(f"the image holds the engine's GPU memory (>= {gpu_bytes / GIB:.1f} GiB) but {images_dir} "
                       f"({fs['fs_type']}) has {room / GIB:.1f} GiB {words[0]}")
    # On tmpfs the image is RAM too, beside the staged GPU memory while the dump writes it.
    need = gpu_bytes * (2 if fs["in_ram"] else 1)
    if need and ram is not None and need > ram:
        reasons.append(f"dumping moves {gpu_bytes / GIB:.1f} GiB of GPU memory to host RAM"
                       f"{' and writes it again to ' + fs['fs_type'] if fs['in_ram'] else ''}: "
                       f"{need / GIB:.1f} GiB needed, {ram / GIB:.1f} GiB {words[1]}")
    return reasons


def checkpoint_ram_reasons(gpu_bytes: int, fraction: float, gpus: list[int], ram: int,
                           words: str = "is available") -> list[str]:
    """cuda-checkpoint's staging of the engine's GPU memory against ``ram`` bytes of host RAM."""
    if gpu_bytes <= ram:
        return []
    return [f"checkpointing moves up to {gpu_bytes / GIB:.1f} GiB of GPU memory ({fraction:g} of GPU(s) "
            f"{','.join(map(str, gpus))}) to host RAM, but only {ram / GIB:.1f} GiB {words}"]


def _criu_gates(criu: str, libdir: str, on_gpu: bool, facts: dict[str, Any]) -> list[str]:
    reasons = []
    version = criu_version(criu)
    facts["criu_version"] = ".".join(map(str, version)) if version else None
    if version is None:
        reasons.append(f"CRIU not found ({criu}): the criu role builds it from source")
    elif version < MIN_CRIU:
        reasons.append(f"CRIU {facts['criu_version']} is too old (needs >= 4.1: older releases fail "
                       f"'criu check' on kernels >= 6.13)")
    else:
        ok, line = criu_check(criu)
        facts["criu_check"] = [line]
        if not ok:
            reasons.append(f"'criu check' fails: {line}")
    facts["cuda_plugin_dir"] = cuda_plugin_dir(libdir)
    if on_gpu and facts["cuda_plugin_dir"] is None:
        reasons.append(f"CRIU's CUDA plugin (cuda_plugin.so) is in none of {plugin_dirs(libdir)}: without it "
                       "GPU mappings cannot be dumped (handle_device_vma plugin failed)")
    return reasons


def weights_on_disk(model: str) -> int:
    """Bytes of the weight files in a local model folder (0 for a model id, or a folder without them)."""
    folder = Path(model) if model.startswith("/") else None
    if folder is None or not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def _quiesce_gates(quiesce: str, launch: dict[str, Any] | None) -> list[str]:
    """A quiesced engine answers /sleep only when started with sleep mode and vLLM's development routes."""
    if not LEVELS[quiesce] or launch is None:
        return []
    argv, env = [str(a) for a in launch.get("argv") or []], launch.get("env") or {}
    missing = [] if "--enable-sleep-mode" in argv else ["--enable-sleep-mode"]
    if str(env.get("VLLM_SERVER_DEV_MODE", "")) != "1" and "VLLM_SERVER_DEV_MODE=1" not in argv:
        missing.append("VLLM_SERVER_DEV_MODE=1")
    return [f"quiesce {quiesce} needs the engine started with {' and '.join(missing)} (the plan adds them)"] \
        if missing else []


def _stage_gates(stage_dir: Path, image_bytes: int, facts: dict[str, Any]) -> list[str]:
    fs = images.filesystem(stage_dir)
    if stage_dir.is_dir():  # an earlier staged copy there is replaced
        fs["free_bytes"] += images.size_bytes(stage_dir)
    facts["stage_dir"] = {"path": str(stage_dir), **fs}
    reasons = [] if fs["in_ram"] else [f"image_source tmpfs stages the images in RAM, but {stage_dir} is on "
                                       f"{fs['fs_type']} ({fs['mount']})"]
    if image_bytes > fs["free_bytes"]:
        reasons.append(f"staging copies the image (>= {image_bytes / GIB:.1f} GiB) into {stage_dir}, which has "
                       f"{fs['free_bytes'] / GIB:.1f} GiB free")
    return reasons


def _criu_mode_gates(criu: str, flags: list[str], network_lock: str, images_dir: Path | None, lazy_pages: bool,
                     disable_io_uring: bool, gpu_bytes: int, facts: dict[str, Any], what: str) -> list[str]:
    """The criu mode's settings (the flags, the network lock, io_uring, the images folder, lazy pages);
    ``gpu_bytes``: what the dump moves to host memory and the image holds at least (``what`` it is)."""
    reasons = flag_problems(flags)
    lock = choose_network_lock(network_lock, criu)
    facts["network_lock"] = lock.as_dict()
    reasons += [lock.problem] if lock.problem else []
    facts["io_uring_sysctl"] = SYSCTL.read_text().strip() if SYSCTL.exists() else None
    if disable_io_uring and SYSCTL.exists() and not os.access(SYSCTL, os.W_OK):
        reasons.append("setting kernel.io_uring_disabled=2 for the engine (CRIU cannot dump io_uring) needs root")
    if lazy_pages and shutil.which(criu):
        ok, line = criu_feature(criu, "uffd")
        facts["criu_uffd"] = line
        if not ok:
            reasons.append(f"lazy_pages needs userfaultfd: 'criu check --feature uffd' says: {line}")
    if images_dir is not None:
        fs = images.filesystem(images_dir)
        if images_dir.is_dir():  # an earlier dump's images there are removed before this one
            fs["free_bytes"] += images.size_bytes(images_dir)
        facts["images_dir"] = {"path": str(images_dir), **fs}
        if gpu_bytes and fs["free_bytes"] < gpu_bytes:
            reasons.append(f"the image holds {what} (>= {gpu_bytes / GIB:.1f} GiB) but {images_dir} "
                           f"({fs['fs_type']}) has {fs['free_bytes'] / GIB:.1f} GiB free")
        # On tmpfs the image is RAM too, beside the staged GPU memory while the dump writes it.
        need = gpu_bytes * (2 if fs["in_ram"] else 1)
        if need and need > mem_available_bytes():
            moved = "GPU memory" if what == ENGINE_GPU else what
            reasons.append(f"dumping moves {gpu_bytes / GIB:.1f} GiB of {moved} to host RAM"
                           f"{' and writes it again to ' + fs['fs_type'] if fs['in_ram'] else ''}: "
                           f"{need / GIB:.1f} GiB needed, {mem_available_bytes() / GIB:.1f} GiB available")
    return reasons


def _gpu_gates(mode: str, cuda_checkpoint: str, gpus: list[int], tp: int, gpu_bytes: int, fraction: float,
               ram_checked: bool, facts: dict[str, Any]) -> list[str]:
    reasons = []
    driver = facts["driver_major"]
    if not gpus or driver is None:
        return ["no GPU: cuda-checkpoint needs an NVIDIA GPU and driver"]
    if not cuda_tool.found(cuda_checkpoint):
        reasons.append(f"cuda-checkpoint not found ({cuda_checkpoint}): the cuda_checkpoint role installs it; "
                       "without NVIDIA's binary, give the path of nodetools/cuda_checkpoint_api.py")
    if mode == "cuda_checkpoint" and driver < LOCK_ACTION_DRIVER:
        reasons.append(f"cuda-checkpoint's lock/checkpoint/restore/unlock actions need driver >= "
                       f"{LOCK_ACTION_DRIVER}; this node has {driver}")
    if tp > 1 and driver < IPC_RESTORE_DRIVER:
        reasons.append(f"TP={tp} uses CUDA IPC, whose checkpoint/restore needs driver >= {IPC_RESTORE_DRIVER}; "
                       f"this node has {driver}")
    off = persistence_off()
    if off:
        reasons.append(f"persistence mode is off on GPU(s) {', '.join(off)}: cuda-checkpoint restore needs it")
    facts["host_ram_needed_bytes"] = gpu_bytes
    if not ram_checked:
        reasons += checkpoint_ram_reasons(gpu_bytes, fraction, gpus, mem_available_bytes())
    return reasons


def _vllm_snapshot_gates(model: str, revision: str, tp: int, launch: dict[str, Any]) -> list[str]:
    reasons = []
    if model.startswith("/") or not model:
        reasons.append("snapshot create requires an immutable remote model: give a model id, not a local path")
    if not re.fullmatch(r"[0-9a-f]{40}", revision or ""):
        reasons.append("snapshot create requires a 40-character --revision (the model's commit hash)")
    if tp != 1:
        reasons.append(f"vllm snapshot supports TP1 only (this engine has TP={tp})")
    return [*reasons, *subcommand_reasons(launch, "snapshot", "vllm_snapshot")]


def gates(mode: str, *, criu: str = "criu", libdir: str = "", cuda_checkpoint: str = "cuda-checkpoint",
          gpus: list[int] | None = None, tp: int = 1, model: str = "", revision: str = "",
          launch: dict[str, Any] | None = None, gpu_memory_fraction: float = 1.0, network_lock: str = "auto",
          criu_flags: list[str] | None = None, images_dir: Path | None = None, lazy_pages: bool = False,
          disable_io_uring: bool = True, quiesce: str = "none",
          stage_dir: Path | None = None) -> tuple[list[str], dict[str, Any]]:
    """(unmet preconditions of ``mode`` in words, the facts read)."""
    gpus = gpus or []
    reasons: list[str] = []
    facts: dict[str, Any] = {"kernel": os.uname().release, "driver_major": driver_major() if gpus else None}
    on_gpu = bool(gpus)
    gpu_bytes = 0
    if on_gpu and facts["driver_major"] is not None:
        gpu_bytes = engine_gpu_bytes(memory_total_mib(), gpus, gpu_memory_fraction)
    what = ENGINE_GPU
    if LEVELS[quiesce]:  # the pool is freed: the weights a level-1 sleep backs up are what is sure to move
        gpu_bytes, what = (weights_on_disk(model) if LEVELS[quiesce] == 1 else 0), "the weights the sleep backs up"
        facts["quiesce"] = {"asked": quiesce, "image_at_least_bytes": gpu_bytes}
    reasons += _quiesce_gates(quiesce, launch)
    if mode in ("criu", "vllm_snapshot"):
        reasons += _criu_gates(criu, libdir, on_gpu, facts)
    if mode == "criu":
        reasons += _criu_mode_gates(criu, list(DEFAULT_FLAGS if criu_flags is None else criu_flags), network_lock,
                                    images_dir, lazy_pages, disable_io_uring, gpu_bytes, facts, what)
        reasons += _stage_gates(stage_dir, gpu_bytes, facts) if stage_dir is not None else []
    if on_gpu or mode == "cuda_checkpoint":
        reasons += _gpu_gates(mode, cuda_checkpoint, gpus, tp, gpu_bytes, gpu_memory_fraction,
                              mode == "criu" and images_dir is not None, facts)
    if mode == "vllm_snapshot":
        reasons += _vllm_snapshot_gates(model, revision, tp, launch or {"argv": ["vllm", "serve", model]})
    return reasons, facts
