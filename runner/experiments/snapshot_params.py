"""The snapshot kind's campaign values: each mode's parameters, bounded, every default here and only here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from nodetools.snapshot.criu_node import DEFAULT_FLAGS, RESERVED_FLAGS
from runner.experiments.base import ModeParams

MAX_GB_S = 10_000.0  # a rate a campaign may give: past any disk, RAM or PCIe link

__all__ = ["QUIESCE_LEVELS", "CriuParams", "CudaCheckpointParams", "VllmSnapshotParams"]

QUIESCE_LEVELS = ("none", "sleep", "sleep2")


class _Params(ModeParams):
    cuda_checkpoint: str = Field(default="cuda-checkpoint", min_length=1,
                                 description="NVIDIA's cuda-checkpoint or the path of cuda_checkpoint_api.py; in the "
                                             "criu mode the one CRIU's CUDA plugin runs")
    poll_s: float = Field(default=0.05, gt=0, le=1.0)


class _Quiesce(ModeParams):
    quiesce: Literal["none", "sleep", "sleep2"] = Field(
        default="none", description="put the engine to sleep before the snapshot and wake it after the restore "
                                    "(vLLM's sleep mode: sleep = level 1, the KV pool freed, the weights kept in host "
                                    "memory; sleep2 = level 2, the weights dropped too and reloaded from the model's "
                                    "files after the wake); adds --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 to "
                                    "the engine's launch")


class CudaCheckpointParams(_Params, _Quiesce):
    """In place: the GPU state to host RAM and back, the process alive throughout."""


class _CriuParams(_Params):
    criu: str = Field(default="criu", min_length=1, description="CRIU binary on the node (>= 4.1)")
    libdir: str = Field(default="", description="CRIU plugin folder (-L); default: CRIU_LIBS_DIR or its PLUGINDIR")
    images_dir: str = Field(default="", pattern=r"^(/.*)?$",
                            description="where images go (default: the trial's node-side folder); tmpfs allowed, "
                                        "recorded as such")


class VllmSnapshotParams(_CriuParams):
    revision: str = Field(default="", description="the model's 40-character revision")


class CriuParams(_CriuParams, _Quiesce):
    network_lock: Literal["auto", "iptables", "nftables", "skip"] = Field(
        default="auto", description="CRIU's --network-lock; auto: iptables where iptables and iptables-restore "
                                    "are on the PATH, else nftables where CRIU can, else skip")
    criu_flags: tuple[str, ...] = Field(default=DEFAULT_FLAGS, description="dump and restore flags (restore adds -d)")
    restore_cache: tuple[Literal["dropped", "warm"], ...] = Field(
        default=("dropped",), min_length=1, max_length=2,
        description="one restore per page-cache state of the image, in this order, from the same dump")
    image_source: Literal["images_dir", "tmpfs"] = Field(
        default="images_dir", description="where each restore reads the images: images_dir (where the dump wrote "
                                          "them), or tmpfs (copied into stage_dir first, the copy timed as a stage "
                                          "of its own)")
    stage_dir: str = Field(default="", pattern=r"^(/.*)?$",
                           description="image_source tmpfs: the folder in RAM the images are copied into (default "
                                       "/dev/shm/<the trial's name>-stage); removed after the trial")
    lazy_pages: bool = Field(default=False, description="restore with criu lazy-pages: memory on demand")
    thp: Literal["leave", "always", "never"] = Field(
        default="leave", description="transparent huge pages for anonymous and shared memory during the restores "
                                     "(set after the dump, put back after the trial; needs root); leave: as the "
                                     "node has them. Every restore records the settings and its page faults")
    disable_io_uring: bool = Field(default=True, description="kernel.io_uring_disabled=2 for the engine's life")
    answers: int = Field(default=3, ge=0, le=20, description="timed answers before the dump and after each restore")
    keep_images: bool = Field(default=False, description="leave the images on the node (removed by default: tens "
                                                         "of GB a trial)")
    disk_read_gb_s: float | None = Field(default=None, gt=0, le=MAX_GB_S,
                                         description="the disk's read rate (GB/s) for the restore's limit; else "
                                                     "storage.csv")
    tmpfs_read_gb_s: float | None = Field(default=None, gt=0, le=MAX_GB_S,
                                          description="the read rate of RAM (tmpfs, page cache; GB/s) for the limit "
                                                      "of a restore from there; else a storage read on tmpfs")
    h2d_gb_s: float | None = Field(default=None, gt=0, le=MAX_GB_S,
                                   description="pinned host-to-GPU rate (GB/s) for the restore's limit; else "
                                               "storage.csv's h2d_copy")

    @field_validator("criu_flags")
    @classmethod
    def _flags(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        for flag in flags:
            name = flag.split("=", 1)[0]
            if not flag.startswith("-"):
                raise ValueError(f"{flag!r} is not a flag (starts with '-')")
            if name in RESERVED_FLAGS or (name.startswith("-v") and name[2:].isdigit()):
                raise ValueError(f"{flag!r} is set by the tool (network_lock, lazy_pages, images_dir, libdir)")
        return flags

    @field_validator("restore_cache")
    @classmethod
    def _distinct(cls, states: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(states)) != len(states):
            raise ValueError("each page-cache state once")
        return states

    @model_validator(mode="after")
    def _staging(self) -> CriuParams:
        if self.stage_dir and self.image_source != "tmpfs":
            raise ValueError("stage_dir is where image_source tmpfs copies the images: set image_source: tmpfs")
        return self
