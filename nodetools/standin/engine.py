"""The stand-in's engine core: a scheduler loop that batches requests in steps, like vLLM's.

Each step the scheduler gives every running request its next tokens: one decode token, or a
chunk of its prefill, within a budget of ``--max-num-batched-tokens``; then it admits waiting
requests (first come, first served, up to ``--max-num-seqs``) after a prefix lookup. A step
lasts ``step_overhead + prefill_tokens x prefill_s_per_token (+ decode_s_per_token if any
request decodes)`` seconds, really waited with asyncio, so concurrent requests share the
modelled GPU: long prefills slow everyone's decode, as on the real engine. Blocks found in an
offload tier are loaded asynchronously (the request waits, the others don't) for
``tokens x load_s_per_token``. When the KV pool runs out during decode, the newest request is
preempted and later recomputed (vLLM's recompute preemption).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from dataclasses import dataclass

from nodetools.standin.kvcache import ROOT_HASH, KvCacheManager, hash_blocks
from nodetools.standin.request import EngineRequest, RequestState
from nodetools.standin.sleep_memory import SleepMemory
from nodetools.standin.stats import EngineStats
from nodetools.standin.textgen import AnswerGenerator, StandinTokenizer
from nodetools.standin.vllm_log import STYLES, ProcLogger

__all__ = ["Engine", "EngineParams", "MemoryFigures"]

_MAX_CATCH_UP_S = 0.005  # lateness beyond this is real overload: it shows instead of being absorbed


@dataclass(frozen=True)
class EngineParams:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_s_per_token: float
    cpu_load_s_per_token: float
    fs_load_s_per_token: float
    decode_s_per_token: float
    step_overhead_s: float
    text_min_tokens: int
    text_max_tokens: int
    seed: int
    sleep_s: float
    wake_s: float
    log_style: str
    crash_after_requests: int = 0


@dataclass(frozen=True)
class MemoryFigures:
    """GiB figures the sleep-mode lines report."""

    weights_gib: float
    kv_gib: float
    graphs_gib: float
    residual_gib: float


class Engine:
    """Scheduler loop, KV accounting and sleep state of one stand-in engine."""

    def __init__(self, params: EngineParams, kv: KvCacheManager, *, tokenizer: StandinTokenizer, stats: EngineStats,
                 memory: MemoryFigures, log_engine: ProcLogger, log_api: ProcLogger,
                 weights: SleepMemory | None = None) -> None:
        self.p = params
        self.weights = weights or SleepMemory([])  # the weights' host copy across a sleep
        self.kv = kv
        self.tokenizer = tokenizer
        self.stats = stats
        self.memory = memory
        self.log = log_engine
        self.log_api = log_api
        self.waiting: deque[EngineRequest] = deque()
        self.loading: list[EngineRequest] = []
        self.running: list[EngineRequest] = []
        self.sleeping_tags: set[str] = set()
        self.sleep_level = 0
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self.finished = 0
        stats.probe = self

    # Probe for the gauges and the stats line.
    def num_running(self) -> int:
        return len(self.running)

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.loading)

    def kv_usage(self) -> float:
        return self.kv.pool.usage()

    def sleep_state(self) -> str:
        if not self.sleeping_tags:
            return "awake"
        return "weights_offloaded" if self.sleep_level == 1 else "discard_all"

    @property
    def is_sleeping(self) -> bool:
        return bool(self.sleeping_tags)

    # Requests.
    def submit(self, request_id: str, prompt_ids: list[int], *, max_tokens: int, min_tokens: int = 0,
               ignore_eos: bool = False, eos_id: int, seed: int | None = None) -> EngineRequest:
        gen = AnswerGenerator(self.tokenizer, prompt_ids, seed, self.p.seed)
        bs = self.p.block_size
        req = EngineRequest(
            request_id=request_id, prompt_ids=prompt_ids, max_tokens=max_tokens, min_tokens=min_tokens,
            ignore_eos=ignore_eos, eos_id=eos_id,
            natural_len=gen.natural_length(self.p.text_min_tokens, self.p.text_max_tokens),
            gen=gen, arrival=self._loop.time(), hashes=hash_blocks(prompt_ids, bs),
            prompt_blocks=len(prompt_ids) // bs,
        )
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: EngineRequest) -> None:
        if req.state is RequestState.FINISHED:
            return
        if req.state is RequestState.WAITING:
            self.waiting.remove(req)
        elif req.state is RequestState.LOADING:
            self.loading.remove(req)
            if req.load_task is not None:
                req.load_task.cancel()
        else:
            self.running.remove(req)
        self._end(req, "abort")

    def abort_all(self) -> int:
        everyone = [*self.running, *self.loading, *self.waiting]
        for req in everyone:
            self.abort(req)
        return len(everyone)

    # The loop.
    async def run(self) -> None:
        # Steps follow a virtual timeline: a step that ends late (asyncio timers round up to the
        # millisecond) shortens the next one, so lateness does not accumulate over a long decode.
        virtual_end: float | None = None
        while True:
            self._wake.clear()
            batch = self._schedule()
            if not batch:
                virtual_end = None
                await self._wake.wait()
                continue
            prefill = sum(n for r, n, decode in batch if not decode)
            any_decode = any(decode for _, _, decode in batch)
            cost = (self.p.step_overhead_s + prefill * self.p.prefill_s_per_token
                    + (self.p.decode_s_per_token if any_decode else 0.0))
            now = self._loop.time()
            start = now if virtual_end is None else max(virtual_end, now - _MAX_CATCH_UP_S)
            virtual_end = start + cost
            await asyncio.sleep(max(0.0, virtual_end - now))
            self.stats.step_lag.observe(max(0.0, self._loop.time() - virtual_end))
            self._apply(batch)

    def _schedule(self) -> list[tuple[EngineRequest, int, bool]]:
        if self.sleeping_tags:
            return []
        budget = self.p.max_num_batched_tokens
        batch: list[tuple[EngineRequest, int, bool]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            remaining = req.num_tokens - req.num_computed
            n = min(remaining, budget)
            need = self.kv.blocks_for(req.num_computed + n) - (len(req.held) + req.private)
            if need > 0 and not self._grow(req, need):
                while self.running[-1] is not req:
                    self._preempt(self.running[-1])
                    preempted = True
                    if self._grow(req, need):
                        break
                else:
                    self._preempt(req)
                    preempted = True
                    continue
            batch.append((req, n, bool(req.output_ids) and remaining == 1))
            budget -= n
            i += 1
        if not preempted:
            self._admit(batch, budget)
        return batch

    def _grow(self, req: EngineRequest, need: int) -> bool:
        evicted = self.kv.pool.allocate(need)
        if evicted is None:
            return False
        self.kv.on_gpu_evicted(evicted)
        req.private += need
        return True

    def _preempt(self, req: EngineRequest) -> None:
        self.running.remove(req)
        self.kv.pool.release(req.held, req.private)
        req.held, req.private, req.num_computed, req.committed = [], 0, 0, 0
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)
        self.stats.preemptions.inc()

    def _admit(self, batch: list[tuple[EngineRequest, int, bool]], budget: int) -> None:
        bs = self.p.block_size
        pool = self.kv.pool
        while self.waiting and budget > 0 and len(self.running) + len(self.loading) < self.p.max_num_seqs:
            req = self.waiting[0]
            self._extend_hashes(req)
            look = self.kv.lookup(req.hashes, req.num_tokens)
            need = self.kv.blocks_for(req.num_tokens) - look.gpu_blocks
            revived = sum(1 for h in look.gpu_hashes if pool.refs[h] == 0)
            if need + revived > pool.free():
                break  # first come, first served: the head waits for room
            self.waiting.popleft()
            pool.acquire(look.gpu_hashes)
            self._grow(req, need)
            req.held = list(look.gpu_hashes)
            req.committed = look.gpu_blocks
            gpu_tokens = look.gpu_blocks * bs
            by_tier = {t.name: look.blocks_from(t.name) * bs for t in self.kv.tiers}
            ext_tokens = sum(by_tier.values())
            self.stats.record_lookup(req.num_tokens, gpu_tokens, ext_tokens, by_tier)
            if req.cached_tokens is None:
                req.cached_tokens = gpu_tokens + ext_tokens
                req.gpu_hit_tokens, req.ext_hit_tokens = gpu_tokens, ext_tokens
            req.num_computed = gpu_tokens
            if look.external:
                req.state = RequestState.LOADING
                req.pending_ext = [h for _, h in look.external]
                fs_hashes = [h for tier, h in look.external if tier == "fs"]
                costs = {"cpu": self.p.cpu_load_s_per_token, "fs": self.p.fs_load_s_per_token}
                delay = sum(tokens * costs.get(tier, 0.0) for tier, tokens in by_tier.items())
                self.stats.record_load(by_tier, costs, self.log)
                self.loading.append(req)
                req.load_task = asyncio.create_task(self._load(req, delay, fs_hashes))
                continue
            req.state = RequestState.RUNNING
            self.running.append(req)
            n = min(req.num_tokens - req.num_computed, budget)
            batch.append((req, n, False))
            budget -= n

    async def _load(self, req: EngineRequest, delay: float, fs_hashes: list[int]) -> None:
        fs = self.kv.fs_tier()
        if fs is not None and fs_hashes:
            await asyncio.gather(asyncio.sleep(delay), fs.read(fs_hashes))
        else:
            await asyncio.sleep(delay)
        if req.state is not RequestState.LOADING:
            return
        self.loading.remove(req)
        req.num_computed += len(req.pending_ext) * self.p.block_size
        req.pending_ext = []
        self._commit_computed(req)
        req.state = RequestState.RUNNING
        self.running.append(req)
        self._wake.set()

    def _extend_hashes(self, req: EngineRequest) -> None:
        bs = self.p.block_size
        full = req.num_tokens // bs
        while len(req.hashes) < full:
            i = len(req.hashes)
            parent = req.hashes[-1] if req.hashes else ROOT_HASH
            req.hashes.extend(hash_blocks(req.token_slice(i * bs, (i + 1) * bs), bs, parent=parent))

    def _commit_computed(self, req: EngineRequest) -> None:
        full = req.num_computed // self.p.block_size
        if req.committed >= full:
            return
        self._extend_hashes(req)
        pool = self.kv.pool
        while req.committed < full:
            h = req.hashes[req.committed]
            if pool.commit(h):
                req.held.append(h)
                req.private -= 1
            self.kv.on_computed(h, req.committed < req.prompt_blocks)
            req.committed += 1

    def _apply(self, batch: list[tuple[EngineRequest, int, bool]]) -> None:
        now = self._loop.time()
        # Prefills first: their handlers wake (and write) before the decode burst, so the stand-in's
        # own per-chunk work delays a first token as little as possible.
        for req, n, _ in sorted(batch, key=lambda item: item[2]):
            if req.state is not RequestState.RUNNING:
                continue  # aborted while the step ran
            req.num_computed += n
            self._commit_computed(req)
            if req.num_computed == req.num_tokens:
                self._sample(req, now)

    def _sample(self, req: EngineRequest, now: float) -> None:
        k = len(req.output_ids) + 1
        reason: str | None = None
        if not req.ignore_eos and k - 1 >= req.min_tokens and k >= req.natural_len:
            token, piece, reason = req.eos_id, "", "stop"
        else:
            token, piece = req.gen.next_piece()
        if reason is None and k >= req.max_tokens:
            reason = "length"
        req.output_ids.append(token)
        if req.first_token_at is None:
            req.first_token_at = now
            self.stats.record_first_token(len(req.prompt_ids), req.gpu_hit_tokens, req.ext_hit_tokens,
                                          now - req.arrival)
        self.stats.record_token()
        req.events.put_nowait((piece, reason))
        if reason is not None:
            self.running.remove(req)
            self._end(req, reason)

    def _end(self, req: EngineRequest, reason: str) -> None:
        self.kv.pool.release(req.held, req.private)
        req.held, req.private = [], 0
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        self.stats.request_success.inc(1, reason)
        self.stats.e2e.observe(self._loop.time() - req.arrival)
        if reason == "abort":
            req.events.put_nowait(("", reason))
        self.finished += 1
        if self.p.crash_after_requests and self.finished >= self.p.crash_after_requests:
            self._crash()

    def _crash(self) -> None:
        """The failure drill: die the way a vLLM worker dies (OOM-killed, NCCL error), mid-load."""
        self.log.error("Worker proc VllmWorker-0 died unexpectedly, shutting down executor.")
        self.log.error("EngineCore encountered a fatal error.")
        logging.shutdown()
        os._exit(1)

    # Cache control and sleep mode.
    def reset_prefix_cache(self) -> bool:
        ok = self.kv.pool.reset()
        self.stats.local_rate.reset()
        if ok:
            self.log.info("Successfully reset prefix cache")
        else:
            self.log.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet",
                             self.kv.pool.used())
        return ok

    async def sleep(self, level: int) -> None:
        if self.sleeping_tags:
            return
        start = self._loop.time()
        self.abort_all()
        self.reset_prefix_cache()
        self.sleeping_tags = {"weights", "kv_cache"}
        self.sleep_level = level
        if level == 1:  # the weights to host memory, while the modelled seconds pass
            await asyncio.gather(asyncio.sleep(self.p.sleep_s), asyncio.to_thread(self.weights.back_up))
        else:
            self.weights.drop()
            await asyncio.sleep(self.p.sleep_s)
        mem = self.memory
        backed_up = mem.weights_gib if level == 1 else 0.0
        freed = mem.weights_gib + mem.kv_gib + mem.graphs_gib
        self.log.info("CuMemAllocator: sleep freed %.2f GiB memory in total, of which %.2f GiB is backed up "
                      "in CPU and the rest %.2f GiB is discarded directly.",
                      freed, backed_up, freed - backed_up)
        self.log.info("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.",
                      freed, mem.residual_gib)
        self.log.info("It took %.6f seconds to fall asleep.", self._loop.time() - start)

    async def wake_up(self, tags: list[str] | None) -> None:
        self.log_api.info("wake up the engine with tags: %s", tags)
        if not self.sleeping_tags:
            return
        start = self._loop.time()
        woken = set(tags) if tags else set(self.sleeping_tags)
        await asyncio.sleep(self.p.wake_s)
        if "weights" in woken:
            self.weights.release()  # copied back (level 1); level 2's must be reloaded
        self.sleeping_tags -= woken
        elapsed = self._loop.time() - start
        if self.p.log_style == "0.24":
            self.log.info(STYLES["0.24"]["wake"], elapsed, woken)
        else:
            self.log.info(STYLES["legacy"]["wake"], elapsed)
        if not self.sleeping_tags:
            self.sleep_level = 0
            self._wake.set()

    async def reload_weights(self) -> None:
        """vLLM's ``reload_weights``: the weights read again from the model's files."""
        self.log.info("Reloading weights inplace...")
        _, seconds = await asyncio.to_thread(self.weights.reload)
        self.log.info("Reloading and processing weights took %.2f seconds", seconds)
