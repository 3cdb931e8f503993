"""Block-level prefix cache: a GPU block pool with LRU eviction, and external offload tiers.

Like vLLM's prefix cache, a prompt is cut into full blocks of ``block_size`` tokens and each
block's hash includes its parent's hash, so only a shared *prefix* can hit. The GPU pool has a
fixed number of blocks; blocks that no running request holds stay cached and are evicted least
recently used first (a finished request's blocks are freed tail first, as vLLM does, so a
prefix outlives its tail). Below it sit optional external tiers, searched in order after the GPU
misses: a host-RAM tier (``--kv-offloading-backend native --kv-offloading-size GIB``) and a
file-system tier that writes one small real file per block. The first external tier is fed
write-through (each computed prompt block is stored, as vLLM's OffloadingConnector does) or as a
victim cache (blocks evicted from the GPU); a tier's own evictions go to the next tier.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FsTier",
    "GpuBlockPool",
    "HostTier",
    "KvCacheManager",
    "Lookup",
    "hash_blocks",
]

ROOT_HASH = 0x5EED_0F_B10C
_MASK = (1 << 64) - 1
_log = logging.getLogger("nodetools.standin.kvcache")


def hash_blocks(tokens: Sequence[int], block_size: int, start: int = 0, parent: int = ROOT_HASH,
                end: int | None = None) -> list[int]:
    """Chain hashes of the full blocks ``start`` .. ``end`` (exclusive) of ``tokens``.

    ``parent`` is the hash of block ``start - 1``. Tuples of ints hash identically in every
    process, so the file-system tier's names survive a restart.
    """
    stop = len(tokens) // block_size if end is None else end
    out: list[int] = []
    for i in range(start, stop):
        parent = hash((parent, *tokens[i * block_size:(i + 1) * block_size])) & _MASK
        out.append(parent)
    return out


class GpuBlockPool:
    """Fixed number of KV blocks; cached blocks carry a refcount, unreferenced ones are evictable."""

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self.refs: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.private = 0  # blocks held by requests and not (or not yet) in the cache

    def used(self) -> int:
        return self.private + len(self.refs) - len(self.evictable)

    def free(self) -> int:
        return self.num_blocks - self.used()

    def usage(self) -> float:
        return self.used() / self.num_blocks if self.num_blocks else 0.0

    def match(self, hashes: Sequence[int]) -> int:
        if not self.caching:
            return 0
        n = 0
        for h in hashes:
            if h not in self.refs:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            r = self.refs[h]
            if r == 0:
                del self.evictable[h]
            self.refs[h] = r + 1

    def allocate(self, n: int) -> list[int] | None:
        """Take ``n`` private blocks, evicting cached ones; None when they don't fit."""
        if n > self.free():
            return None
        overflow = self.private + len(self.refs) + n - self.num_blocks
        evicted: list[int] = []
        for _ in range(max(0, overflow)):
            h, _ = self.evictable.popitem(last=False)
            del self.refs[h]
            evicted.append(h)
        self.private += n
        return evicted

    def commit(self, h: int) -> bool:
        """A private block now holds the computed block ``h``; False if ``h`` is cached already."""
        if not self.caching or h in self.refs:
            return False
        self.private -= 1
        self.refs[h] = 1
        return True

    def release(self, held: Sequence[int], private: int) -> None:
        self.private -= private
        # Reverse order: the tail of a sequence is evicted before its prefix.
        for h in reversed(held):
            r = self.refs[h] - 1
            self.refs[h] = r
            if r == 0:
                self.evictable[h] = None

    def reset(self) -> bool:
        """Drop every unreferenced cached block; False when some are still held by requests."""
        for h in self.evictable:
            del self.refs[h]
        self.evictable.clear()
        return not self.refs


class HostTier:
    """Host-RAM tier: an LRU index of block hashes with a capacity in blocks."""

    name = "cpu"

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.lru: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, h: object) -> bool:
        return h in self.lru

    def __len__(self) -> int:
        return len(self.lru)

    def touch(self, h: int) -> None:
        self.lru.move_to_end(h)

    def store(self, h: int) -> list[int]:
        """Insert (or refresh) ``h``; returns the hashes evicted to make room."""
        if h in self.lru:
            self.lru.move_to_end(h)
            return []
        self.lru[h] = None
        evicted: list[int] = []
        while len(self.lru) > self.capacity_blocks:
            evicted.append(self.lru.popitem(last=False)[0])
        self._stored(h)
        self._evicted(evicted)
        return evicted

    def _stored(self, h: int) -> None:
        """Hook for tiers with a backing store."""

    def _evicted(self, hashes: list[int]) -> None:
        """Hook for tiers with a backing store."""


class FsTier(HostTier):
    """File-system tier: one small real file per block, in vLLM's tiered-offload layout.

    Files live under ``<root>/<model>_<digest>_r0/<hhh>/<hh>_g0/<hash>.bin`` next to
    ``<root>/<model>_<digest>/config.json``; they outlive the process, so a restart with the same
    configuration finds them again. File I/O runs on one background thread, in order.
    """

    name = "fs"

    def __init__(self, root: Path, tag: str, digest: str, *, capacity_blocks: int | None,
                 file_bytes: int) -> None:
        super().__init__(capacity_blocks if capacity_blocks else 1 << 62)
        self.root = root
        self.dir = root / f"{tag}_{digest}_r0"
        self.file_bytes = max(16, file_bytes)
        self.io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="standin-kv-fs")
        self.bytes_written = 0
        self.bytes_read = 0
        config_dir = root / f"{tag}_{digest}"
        config_dir.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "config.json").write_text(json.dumps({"engine": "stand-in", "digest": digest}))
        self._adopt_existing()

    def _adopt_existing(self) -> None:
        found: list[tuple[float, int]] = []
        for path in self.dir.glob("*/*_g0/*.bin"):
            try:
                found.append((path.stat().st_mtime, int(path.stem, 16)))
            except (OSError, ValueError):
                continue
        for _, h in sorted(found):
            self.lru[h] = None
        while len(self.lru) > self.capacity_blocks:
            self._evicted([self.lru.popitem(last=False)[0]])

    def path(self, h: int) -> Path:
        hx = f"{h:016x}"
        return self.dir / hx[:3] / f"{hx[3:5]}_g0" / f"{hx}.bin"

    def _write(self, h: int) -> None:
        path = self.path(h)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = (f"{h:016x}".encode() * (self.file_bytes // 16 + 1))[: self.file_bytes]
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(payload)
        tmp.replace(path)
        self.bytes_written += len(payload)

    def _unlink(self, hashes: list[int]) -> None:
        for h in hashes:
            self.path(h).unlink(missing_ok=True)

    def _read(self, hashes: list[int]) -> int:
        total = 0
        for h in hashes:
            try:
                total += len(self.path(h).read_bytes())
            except OSError:
                _log.debug("fs tier block %016x vanished before it was read", h)
        self.bytes_read += total
        return total

    def _stored(self, h: int) -> None:
        self._submit(self._write, h)

    def _evicted(self, hashes: list[int]) -> None:
        if hashes:
            self._submit(self._unlink, hashes)

    def _submit(self, fn: Callable[[Any], object], arg: object) -> Future[object]:
        fut = self.io.submit(fn, arg)
        fut.add_done_callback(_log_failure)
        return fut

    async def read(self, hashes: list[int]) -> int:
        """Really read the files of ``hashes`` (queued behind pending writes)."""
        return await asyncio.wrap_future(self.io.submit(self._read, hashes))

    def close(self) -> None:
        self.io.shutdown(wait=True)


def _log_failure(fut: Future[object]) -> None:
    exc = fut.exception()
    if exc is not None:
        _log.warning("fs tier I/O failed: %s", exc)


@dataclass
class Lookup:
    """Result of a prefix lookup, in blocks from the start of the sequence."""

    gpu_hashes: list[int]
    external: list[tuple[str, int]] = field(default_factory=list)  # (tier name, hash)

    @property
    def gpu_blocks(self) -> int:
        return len(self.gpu_hashes)

    def blocks_from(self, tier: str) -> int:
        return sum(1 for name, _ in self.external if name == tier)


class KvCacheManager:
    """The GPU pool plus external tiers, and the policy that moves blocks between them."""

    def __init__(self, block_size: int, gpu_blocks: int, *, prefix_caching: bool = True,
                 tiers: Sequence[HostTier] = (), policy: str = "write-through",
                 offload_prompt_only: bool = True) -> None:
        if policy not in ("write-through", "victim"):
            raise ValueError(f"offload policy must be write-through or victim, not {policy!r}")
        self.block_size = block_size
        self.pool = GpuBlockPool(gpu_blocks, prefix_caching)
        self.tiers = list(tiers)
        self.policy = policy
        self.offload_prompt_only = offload_prompt_only

    @property
    def has_connector(self) -> bool:
        return bool(self.tiers)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> Lookup:
        # At least one token is always computed, so a fully cached prompt recomputes its last block.
        limit = min(len(hashes), (num_tokens - 1) // self.block_size)
        n_gpu = self.pool.match(hashes[:limit])
        result = Lookup(list(hashes[:n_gpu]))
        for h in hashes[n_gpu:limit]:
            tier = next((t for t in self.tiers if h in t), None)
            if tier is None:
                break
            tier.touch(h)
            result.external.append((tier.name, h))
        return result

    def on_computed(self, h: int, in_prompt: bool) -> None:
        """A block's KV was computed on the GPU: write-through stores it in the first tier."""
        if self.tiers and self.policy == "write-through" and (in_prompt or not self.offload_prompt_only):
            self._store(0, [h])

    def on_gpu_evicted(self, hashes: list[int]) -> None:
        if self.tiers and self.policy == "victim" and hashes:
            self._store(0, hashes)

    def _store(self, index: int, hashes: list[int]) -> None:
        tier = self.tiers[index]
        for h in hashes:
            evicted = tier.store(h)
            if evicted and index + 1 < len(self.tiers):
                self._store(index + 1, evicted)

    def fs_tier(self) -> FsTier | None:
        return next((t for t in self.tiers if isinstance(t, FsTier)), None)

    def close(self) -> None:
        fs = self.fs_tier()
        if fs is not None:
            fs.close()


