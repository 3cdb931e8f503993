"""The engine's vLLM-named metrics, and the periodic ``Engine 000: ...`` stats line.

Counters follow vLLM: prefix-cache queries and hits in tokens (GPU), external queries (the
tokens the GPU did not have) and hits (tokens an offload tier had), prompt tokens counted when a
request produces its first token, generation tokens as they are produced. The stats line is
logged every ``VLLM_LOG_STATS_INTERVAL`` seconds, at INFO while there is traffic and at DEBUG when
this interval and the previous one were idle, as vLLM's LoggingStatLogger does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from nodetools.standin.config import STANDIN_VERSION
from nodetools.standin.metrics import CachingMetrics, Registry
from nodetools.standin.vllm_log import ProcLogger

__all__ = ["EngineProbe", "EngineStats", "StatsLogger"]

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0, 7680.0)
_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)


class EngineProbe(Protocol):
    """What the gauges read from the engine at scrape time."""

    def num_running(self) -> int: ...

    def num_waiting(self) -> int: ...

    def kv_usage(self) -> float: ...

    def sleep_state(self) -> str: ...


class EngineStats:
    """Counters, gauges and rolling hit rates of one engine."""

    def __init__(self, model_name: str, connector: bool, cache_info: dict[str, str],
                 tokenizer: str = "regex", connector_name: str = "", bytes_per_token: int = 0) -> None:
        self.connector = connector
        self.connector_name = connector_name
        self.bytes_per_token = bytes_per_token
        self.probe: EngineProbe | None = None
        reg = self.registry = Registry(model_name)
        self.prefix_queries = reg.counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = reg.counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.ext_queries = reg.counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens.")
        self.ext_hits = reg.counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, "
            "in terms of number of cached tokens.")
        self.prompt_tokens = reg.counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = reg.counter("vllm:generation_tokens",
                                             "Number of generation tokens processed.")
        self.prompt_by_source = reg.counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"],
            preset=[("local_compute",), ("local_cache_hit",), ("external_kv_transfer",)])
        self.preemptions = reg.counter("vllm:num_preemptions",
                                       "Cumulative number of preemption from the engine.")
        self.request_success = reg.counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"],
            preset=[("stop",), ("length",), ("abort",)])
        reg.gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                  fn=lambda: self._probe().num_running())
        reg.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                  fn=lambda: self._probe().num_waiting())
        reg.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                  fn=lambda: self._probe().kv_usage())
        reg.gauge("vllm:engine_sleep_state", "Engine sleep state: 1 for the current state.", ["sleep_state"],
                  fn=self._sleep_states)
        info = reg.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                         list(cache_info))
        info.set(1.0, *cache_info.values())
        self.ttft = reg.histogram("vllm:time_to_first_token_seconds",
                                  "Histogram of time to first token in seconds.", _TTFT_BUCKETS)
        self.e2e = reg.histogram("vllm:e2e_request_latency_seconds",
                                 "Histogram of e2e request latency in seconds.", _E2E_BUCKETS)
        standin = reg.gauge("standin:info", "The engine stand-in: a rehearsal, measuring nothing about vLLM.",
                            ["engine_kind", "version", "tokenizer"])
        standin.set(1.0, "stand-in", STANDIN_VERSION, tokenizer)
        self.tier_hits = reg.counter("standin:external_hits_by_tier", "External hit tokens by offload tier.",
                                     ["tier"])
        # vLLM's offloading connector counts its copies' bytes and seconds by transfer type; the
        # stand-in counts its modelled loads the same way, its file-system tier's as FS_to_GPU.
        self.offload_bytes = reg.counter("vllm:kv_offload_total_bytes", "KV bytes moved by the offloading "
                                         "connector, by transfer type.", ["transfer_type"])
        self.offload_time = reg.counter("vllm:kv_offload_total_time", "Seconds the offloading connector's "
                                        "transfers took, by transfer type.", ["transfer_type"])
        self.step_lag = reg.histogram(
            "standin:engine_step_lag_seconds",
            "How much later than modelled an engine step ended (the stand-in's own overhead).", _LAG_BUCKETS)
        self.local_rate = CachingMetrics()
        self.external_rate = CachingMetrics()
        self.interval_prompt = 0
        self.interval_generation = 0

    def _probe(self) -> EngineProbe:
        if self.probe is None:
            raise RuntimeError("engine probe not bound")
        return self.probe

    def _sleep_states(self) -> dict[tuple[str, ...], float]:
        state = self._probe().sleep_state()
        return {(s,): float(s == state) for s in ("awake", "weights_offloaded", "discard_all")}

    def record_lookup(self, num_tokens: int, gpu_hit: int, ext_hit: int, by_tier: dict[str, int]) -> None:
        self.prefix_queries.inc(num_tokens)
        self.prefix_hits.inc(gpu_hit)
        self.local_rate.observe(num_tokens, gpu_hit)
        if self.connector:
            self.ext_queries.inc(num_tokens - gpu_hit)
            self.ext_hits.inc(ext_hit)
            self.external_rate.observe(num_tokens - gpu_hit, ext_hit)
            for tier, tokens in by_tier.items():
                self.tier_hits.inc(tokens, tier)

    def record_load(self, by_tier: dict[str, int], cost_s_per_token: dict[str, float],
                    log: ProcLogger | None = None) -> None:
        """A request's external hits are being loaded: vLLM's connector counters (OffloadingConnector),
        or LMCache's own line per retrieval (its "GB" is GiB, as LMCache writes it)."""
        seconds = {tier: tokens * cost_s_per_token.get(tier, 0.0) for tier, tokens in by_tier.items() if tokens}
        if not seconds:
            return
        if self.connector_name == "OffloadingConnector":
            for tier, secs in seconds.items():
                kind = "CPU_to_GPU" if tier == "cpu" else f"{tier.upper()}_to_GPU"
                self.offload_bytes.inc(by_tier[tier] * self.bytes_per_token, kind)
                self.offload_time.inc(secs, kind)
        elif self.connector_name.startswith("LMCache") and log is not None:
            tokens = sum(by_tier.values())
            log.info("[stand-in] LMCache INFO: Retrieved %d out of %d required tokens (from %d total tokens). "
                     "size: %.4f gb, cost %.4f ms", tokens, tokens, tokens,
                     tokens * self.bytes_per_token / 2**30, 1000 * sum(seconds.values()))

    def record_first_token(self, prompt_len: int, gpu_hit: int, ext_hit: int, ttft: float) -> None:
        self.prompt_tokens.inc(prompt_len)
        self.interval_prompt += prompt_len
        gpu_hit = min(gpu_hit, prompt_len)
        ext_hit = min(ext_hit, prompt_len - gpu_hit)
        self.prompt_by_source.inc(prompt_len - gpu_hit - ext_hit, "local_compute")
        self.prompt_by_source.inc(gpu_hit, "local_cache_hit")
        self.prompt_by_source.inc(ext_hit, "external_kv_transfer")
        self.ttft.observe(ttft)

    def record_token(self) -> None:
        self.generation_tokens.inc()
        self.interval_generation += 1

    def render(self) -> str:
        return self.registry.render()


class StatsLogger:
    """Logs vLLM's periodic stats line from the APIServer process."""

    def __init__(self, stats: EngineStats, log: ProcLogger, interval_s: float) -> None:
        self.stats = stats
        self.log = log
        self.interval_s = interval_s
        self.last_time = time.monotonic()
        self.last_prompt_tp = 0.0
        self.last_generation_tp = 0.0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.log_once()

    def log_once(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self.last_time, 1e-9)
        prompt_tp = self.stats.interval_prompt / elapsed
        generation_tp = self.stats.interval_generation / elapsed
        self.stats.interval_prompt = 0
        self.stats.interval_generation = 0
        self.last_time = now
        idle = not any((prompt_tp, generation_tp, self.last_prompt_tp, self.last_generation_tp))
        self.last_prompt_tp, self.last_generation_tp = prompt_tp, generation_tp
        if idle and not self.log.is_debug():
            return
        probe = self.stats.probe
        if probe is None:
            return
        parts = [
            f"Avg prompt throughput: {prompt_tp:.1f} tokens/s",
            f"Avg generation throughput: {generation_tp:.1f} tokens/s",
            f"Running: {probe.num_running()} reqs",
            f"Waiting: {probe.num_waiting()} reqs",
            f"GPU KV cache usage: {probe.kv_usage() * 100:.1f}%",
            f"Prefix cache hit rate: {self.stats.local_rate.hit_rate * 100:.1f}%",
        ]
        if self.stats.connector:
            parts.append(f"External prefix cache hit rate: {self.stats.external_rate.hit_rate * 100:.1f}%")
        line = "Engine 000: " + ", ".join(parts)
        if idle:
            self.log.debug("%s", line)
        else:
            self.log.info("%s", line)
