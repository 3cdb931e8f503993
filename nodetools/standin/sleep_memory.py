"""What a sleep does to the stand-in's memory, as vLLM's sleep mode does to an engine's.

vLLM's level-1 sleep copies the weights from the GPU into host buffers and frees the KV pool; the
wake copies them back and frees the buffers. Level 2 backs nothing up: after the wake the weights'
memory holds garbage until they are read again from the model's files (vLLM 0.24.0: ``POST
/collective_rpc {"method": "reload_weights"}``, its default loader only; ``--load-format dummy``
answers ``Model reloading with `dummy` format``). The stand-in has no GPU, so its level-1 sleep
reads the weight files into a host buffer (a memfd mapping: shared memory, as vLLM's pinned
buffers may be) that lives until the wake, and an engine snapshotted asleep carries it in its
image as a quiesced vLLM engine carries its weights. Its level 2 keeps nothing and marks the
weights as needing that reload, which reads the files again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SleepMemory"]

_CHUNK = 1 << 20


def _read_into(view: memoryview | None, files: Sequence[Path]) -> int:
    """Read every byte of ``files`` (into ``view`` when given, else into a scratch buffer); the bytes read."""
    scratch = bytearray(_CHUNK)
    total = 0
    for path in files:
        with path.open("rb", buffering=0) as fh:
            while True:
                target = view[total:total + _CHUNK] if view is not None else memoryview(scratch)
                got = fh.readinto(target)
                if not got:
                    break
                total += got
    return total


class SleepMemory:
    """The weights' host copy across a sleep: ``back_up`` (level 1) until ``release`` (the wake),
    ``drop`` (level 2) until ``reload``."""

    def __init__(self, files: Sequence[Path], load_format: str = "auto") -> None:
        self.files = list(files)
        self.load_format = load_format
        self.need_reload = False
        self._buffer: mmap.mmap | None = None
        self._fd = -1

    @property
    def backed_up_bytes(self) -> int:
        return len(self._buffer) if self._buffer is not None else 0

    def back_up(self) -> int:
        """Level 1: the weight files into a host buffer (a memfd where the kernel has them); its bytes."""
        self.release()
        size = sum(p.stat().st_size for p in self.files)
        if not size:
            return 0
        fd = os.memfd_create("standin-sleep-weights") if hasattr(os, "memfd_create") else -1
        if fd >= 0:
            os.ftruncate(fd, size)
        self._fd = fd
        self._buffer = mmap.mmap(fd, size)  # MAP_SHARED over the memfd; anonymous memory without one
        with memoryview(self._buffer) as view:
            _read_into(view, self.files)
        return size

    def release(self) -> None:
        """The wake copied the weights back: the host buffer goes."""
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def drop(self) -> None:
        """Level 2: nothing kept; the weights must be reloaded after the wake."""
        self.release()
        self.need_reload = True

    def reload(self) -> tuple[int, float]:
        """Read the weights from their files again: (bytes, seconds). A format with no files to read
        is refused as vLLM 0.24.0 refuses it."""
        if self.load_format == "dummy" or not self.files:
            raise NotImplementedError(f"Model reloading with `{self.load_format}` format")
        started = time.monotonic()
        total = _read_into(None, self.files)
        self.need_reload = False
        return total, time.monotonic() - started
