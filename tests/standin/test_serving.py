"""The OpenAI-compatible API of the stand-in, through the official client and plain HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.standin.support import Standin


@pytest.fixture(scope="module")
def client(shared_standin: Standin) -> openai.OpenAI:
    return openai.OpenAI(base_url=shared_standin.url("/v1"), api_key="unused", max_retries=0)


def _model(server: Standin) -> str:
    return httpx.get(server.url("/v1/models"), timeout=5).json()["data"][0]["id"]


def test_openai_client_streams_a_chat_completion(shared_standin: Standin, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=_model(shared_standin), max_tokens=12, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Tell me about the page cache and the compile cache."}],
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 5, chunks
    assert "".join(pieces).strip()
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens == 12
    assert usage.prompt_tokens > 10
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0


def test_answers_are_deterministic_text_seeded_by_the_prompt(shared_standin: Standin,
                                                            client: openai.OpenAI) -> None:
    model = _model(shared_standin)

    def ask(prompt: str) -> str:
        out = client.completions.create(model=model, prompt=prompt, max_tokens=24,
                                        extra_body={"ignore_eos": True})
        return out.choices[0].text

    first, again, other = ask("Describe a disk."), ask("Describe a disk."), ask("Describe a kernel.")
    assert first == again
    assert first != other
    words = first.split()
    assert len(set(words)) > len(words) // 2  # varied words, not one token repeated


def test_max_tokens_min_tokens_and_ignore_eos(shared_standin: Standin, client: openai.OpenAI) -> None:
    model = _model(shared_standin)
    forced = client.completions.create(model=model, prompt="Go on.", max_tokens=300,
                                       extra_body={"ignore_eos": True})
    assert forced.usage.completion_tokens == 300
    assert forced.choices[0].finish_reason == "length"
    natural = client.completions.create(model=model, prompt="Go on.", max_tokens=1000)
    assert natural.choices[0].finish_reason == "stop"
    assert natural.usage.completion_tokens <= 256  # the default natural length range is 16-256
    at_least = client.completions.create(model=model, prompt="Go on.", max_tokens=400,
                                         extra_body={"min_tokens": 280})
    assert at_least.usage.completion_tokens >= 280


def test_tokenize_and_detokenize_round_trip(shared_standin: Standin) -> None:
    text = "The same text always gives the same tokens, doesn't it?"
    out = httpx.post(shared_standin.url("/tokenize"), json={"prompt": text}, timeout=5).json()
    assert out["count"] == len(out["tokens"]) > 5
    assert out["max_model_len"] == 8192
    again = httpx.post(shared_standin.url("/tokenize"), json={"prompt": text}, timeout=5).json()
    assert again["tokens"] == out["tokens"]
    back = httpx.post(shared_standin.url("/detokenize"), json={"tokens": out["tokens"]}, timeout=5).json()
    assert back["prompt"] == text


def test_errors_are_vllm_shaped(shared_standin: Standin) -> None:
    wrong = httpx.post(shared_standin.url("/v1/completions"), json={"model": "nope", "prompt": "x"},
                       timeout=5)
    assert wrong.status_code == 404
    assert "does not exist" in wrong.json()["error"]["message"]
    too_long = httpx.post(shared_standin.url("/v1/completions"),
                          json={"prompt": list(range(100, 8100)), "max_tokens": 500}, timeout=5)
    assert too_long.status_code == 400
    assert "maximum context length is 8192" in too_long.json()["error"]["message"]
    # Sleep endpoints exist only with --enable-sleep-mode, like vLLM's dev endpoints.
    assert httpx.post(shared_standin.url("/sleep?level=1"), timeout=5).status_code == 404
    assert httpx.get(shared_standin.url("/is_sleeping"), timeout=5).status_code == 404


def test_metrics_use_vllm_names(shared_standin: Standin) -> None:
    text = httpx.get(shared_standin.url("/metrics"), timeout=5).text
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert f"\n{name}{{" in text, name
    assert 'model_name="' in text and 'engine_kind="stand-in"' in text
