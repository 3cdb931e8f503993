"""A repeated prompt prefix hits the stand-in's block prefix cache, as it would vLLM's."""

from __future__ import annotations

import re

import httpx

from tests.standin.support import Standin, StandinFactory

BLOCK = 16


def _complete(server: Standin, prompt: list[int] | str, max_tokens: int = 4) -> dict[str, object]:
    resp = httpx.post(server.url("/v1/completions"), json={"prompt": prompt, "max_tokens": max_tokens},
                      timeout=10)
    resp.raise_for_status()
    return resp.json()


def test_repeated_prefix_is_visible_in_usage_metrics_and_stats_line(shared_standin: Standin) -> None:
    before = shared_standin.metrics()
    history = [1000 + i for i in range(400)]
    first = _complete(shared_standin, history)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    second = _complete(shared_standin, [*history, 7, 8, 9])
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == 400 // BLOCK * BLOCK  # whole blocks of the shared prefix
    # Same suffix, different first token: chain hashing makes every block differ.
    third = _complete(shared_standin, [999, *history[1:], 7, 8, 9])
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    after = shared_standin.metrics()
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert hits == cached
    assert queries == 400 + 403 + 403
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == queries

    # The stats line (VLLM_LOG_STATS_INTERVAL=1) shows a non-zero rolling hit rate.
    match = shared_standin.wait_log(r"Engine 000: Avg prompt throughput: [\d.]+ tokens/s, .*"
                                    r"Prefix cache hit rate: ([1-9][\d.]*)%")
    assert "External prefix cache hit rate" not in match.group(0)  # no offload tier here
    assert re.search(r"Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: [\d.]+%", match.group(0))


def test_chat_history_hits_the_cache_turn_after_turn(shared_standin: Standin) -> None:
    messages = [{"role": "system", "content": "You answer about storage. " * 30},
                {"role": "user", "content": "What is a RAID0 array?"}]
    url = shared_standin.url("/v1/chat/completions")
    first = httpx.post(url, json={"messages": messages, "max_tokens": 40}, timeout=10).json()
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And NVMe?"}]
    second = httpx.post(url, json={"messages": messages, "max_tokens": 8}, timeout=10).json()
    # The whole first turn (prompt and answer, re-tokenized from its text) is a cached prefix.
    prev_total = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= (prev_total - 1) // BLOCK * BLOCK - BLOCK


def test_without_prompt_tokens_details_flag_usage_has_no_details(standin: StandinFactory) -> None:
    server = standin()  # vLLM fills prompt_tokens_details only with --enable-prompt-tokens-details
    out = _complete(server, "hello there")
    assert out["usage"]["prompt_tokens_details"] is None
    assert server.stop() == 0
