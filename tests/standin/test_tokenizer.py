"""Token counts that agree with the model's tokenizer, as clients that count with it (GuideLLM, AIPerf) see them.

The stand-in runs on loopback and is driven with the official ``openai`` client; every count is checked
against ``tokenizers`` loading the same ``tokenizer.json`` from the model folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jinja2
import openai
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from nodetools import model_maker
from nodetools.standin.textgen import AnswerGenerator
from nodetools.standin.tokenizer import HfTokenizer, check_answers, load_tokenizer
from tests.standin.support import Standin, StandinFactory, start

PROMPT = ("A rehearsal must count tokens as the model does: the page cache holds the weights, the compile "
          "cache holds the graphs, and every request sends its whole history again. " * 4).strip()


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    server = start(model_dir, tmp_path_factory.mktemp("tok"), ["--max-model-len", "8192"], None, wait=True)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def client(server: Standin) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _model(server: Standin) -> dict[str, Any]:
    return httpx.get(server.url("/v1/models"), timeout=5).json()["data"][0]


def _stream_completion(client: openai.OpenAI, model: str, prompt: str, **extra: Any
                       ) -> tuple[list[str], list[str | None], Any]:
    stream = client.completions.create(model=model, prompt=prompt, stream=True,
                                       stream_options={"include_usage": True}, **extra)
    texts: list[str] = []
    finishes: list[str | None] = []
    usage = None
    for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
            finishes.append(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    return texts, finishes, usage


def test_streamed_completion_counts_agree_with_the_models_tokenizer(server: Standin, client: openai.OpenAI,
                                                                    hf: Tokenizer) -> None:
    model = _model(server)
    assert model["standin_tokenizer"]["kind"] == "tokenizers"
    expected = hf.encode(PROMPT).ids
    assert len(expected) != len(PROMPT.split())  # a word count would not pass for the tokenizer's count
    texts, finishes, usage = _stream_completion(client, model["id"], PROMPT, max_tokens=64,
                                                extra_body={"ignore_eos": True})
    assert usage is not None
    assert usage.prompt_tokens == len(expected)
    # One token per chunk, as vLLM streams them; the usage counts exactly the chunks.
    assert usage.completion_tokens == len(texts) == 64
    assert finishes == [None] * 63 + ["length"]
    assert all(texts), texts
    streamed = "".join(texts)
    assert len(hf.encode(streamed).ids) == usage.completion_tokens  # a client re-tokenizing the text agrees

    # /tokenize (and /detokenize) give the same ids as the tokenizer itself.
    out = httpx.post(server.url("/tokenize"), json={"prompt": PROMPT, "return_token_strs": True}, timeout=5).json()
    assert out["tokens"] == expected and out["count"] == len(expected)
    assert out["token_strs"] == [hf.id_to_token(t) for t in expected]
    back = httpx.post(server.url("/detokenize"), json={"tokens": expected}, timeout=5).json()
    assert back["prompt"] == hf.decode(expected) == PROMPT


def test_a_natural_stop_counts_the_eos_token_as_vllm_does(server: Standin, client: openai.OpenAI,
                                                          hf: Tokenizer) -> None:
    texts, finishes, usage = _stream_completion(client, _model(server)["id"], "Go on.", max_tokens=1000)
    assert usage is not None and finishes[-1] == "stop"
    # vLLM's completion_tokens include the EOS token; its chunk carries no text.
    assert usage.completion_tokens == len(texts) and texts[-1] == ""
    assert len(hf.encode("".join(texts)).ids) == usage.completion_tokens - 1


def test_non_streamed_and_token_id_prompts_agree(server: Standin, client: openai.OpenAI, hf: Tokenizer) -> None:
    name = _model(server)["id"]
    out = client.completions.create(model=name, prompt=PROMPT, max_tokens=20, extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == len(hf.encode(PROMPT).ids)
    assert len(hf.encode(out.choices[0].text).ids) == out.usage.completion_tokens == 20
    ids = hf.encode(PROMPT).ids
    by_ids = client.completions.create(model=name, prompt=ids, max_tokens=20, extra_body={"ignore_eos": True})
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == out.choices[0].text  # the same prompt ids, the same answer


def test_chat_prompts_are_the_rendered_chat_template(server: Standin, client: openai.OpenAI, hf: Tokenizer,
                                                     model_dir: Path) -> None:
    messages = [{"role": "system", "content": "You answer about storage."},
                {"role": "user", "content": "What is a RAID0 array, and why does it matter here?"}]
    template = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    rendered = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(
        messages=messages, add_generation_prompt=True)
    expected = hf.encode(rendered, add_special_tokens=False).ids
    tokenized = httpx.post(server.url("/tokenize"), json={"messages": messages}, timeout=5).json()
    assert tokenized["tokens"] == expected

    stream = client.chat.completions.create(model=_model(server)["id"], messages=messages, max_tokens=30,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == len(expected)
    assert usage.completion_tokens == len(pieces) == 30
    answer = "".join(pieces)
    assert len(hf.encode(answer).ids) == 30

    # The next turn quotes the answer: its prompt re-tokenizes the first turn's prompt and answer.
    history = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "And NVMe?"}]
    second = httpx.post(server.url("/tokenize"), json={"messages": history}, timeout=5).json()["tokens"]
    answer_ids = hf.encode(answer, add_special_tokens=False).ids
    assert second[: len(expected) + len(answer_ids)] == expected + answer_ids


def test_the_regex_fallback_is_announced_never_silent(standin: StandinFactory, tmp_path: Path) -> None:
    forced = standin("--standin-tokenizer", "regex")
    card = _model(forced)["standin_tokenizer"]
    assert card["kind"] == "regex" and "forced" in card["source"]
    assert httpx.get(forced.url("/version"), timeout=5).json()["tokenizer"] == "regex"
    assert 'tokenizer="regex"' in httpx.get(forced.url("/metrics"), timeout=5).text
    assert "WARNING" in forced.wait_log(r".*\[stand-in\] tokenizer: regex word pieces \(NOT the model's.*").group(0)
    assert forced.stop() == 0

    # A node without the tokenizers package: the same fallback, with the reason.
    shim = tmp_path / "shim" / "tokenizers"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('tokenizers hidden by the test')\n")
    from tests.standin.support import REPO

    hidden = standin(env={"PYTHONPATH": f"{shim.parent}:{REPO}"})
    card = _model(hidden)["standin_tokenizer"]
    assert card["kind"] == "regex" and "tokenizers hidden by the test" in card["source"]
    hidden.wait_log(r"WARNING .*\[stand-in\] tokenizer: regex word pieces.*not importable")
    assert hidden.stop() == 0


def test_an_old_standin_folder_gets_a_tokenizer_and_a_model_maker_folder_is_used_as_is(
        standin: StandinFactory, tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"\0" * 4096)
    (old / "config.json").write_text(json.dumps({"model_type": "standin", "max_position_embeddings": 4096}))
    server = standin(model=old)
    assert _model(server)["standin_tokenizer"]["kind"] == "tokenizers"
    server.wait_log(r"had no tokenizer.json: trained one \(byte-level BPE, vocab 8192\)")
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {p.name for p in old.iterdir()}
    assert server.stop() == 0

    made = tmp_path / "made"
    model_maker.make_model(made, "qwen3-tiny")
    before = (made / "tokenizer.json").read_bytes()
    server = standin(model=made)
    card = _model(server)["standin_tokenizer"]
    assert card["kind"] == "tokenizers" and card["vocab_size"] == 1024 and card["answers_round_trip"] is True
    tok = Tokenizer.from_file(str(made / "tokenizer.json"))
    out = httpx.post(server.url("/v1/completions"), timeout=10,
                     json={"prompt": PROMPT, "max_tokens": 16, "ignore_eos": True}).json()
    assert out["usage"]["prompt_tokens"] == len(tok.encode(PROMPT).ids)
    assert len(tok.encode(out["choices"][0]["text"]).ids) == out["usage"]["completion_tokens"] == 16
    assert server.stop() == 0
    assert (made / "tokenizer.json").read_bytes() == before


def test_generated_answers_round_trip_through_the_made_tokenizer(model_dir: Path) -> None:
    choice = load_tokenizer(model_dir)
    tok = choice.tokenizer
    assert isinstance(tok, HfTokenizer) and choice.info.answers_round_trip
    hf = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for seed in range(20):
        gen = AnswerGenerator(tok, hf.encode(f"prompt {seed}").ids, seed=None, base_seed=0)
        pieces = [gen.next_piece() for _ in range(400)]
        ids = [i for i, _ in pieces]
        text = "".join(p for _, p in pieces)
        # Each streamed piece is what decoding its token adds; the whole text re-tokenizes to the ids
        # (the last word may be cut mid-word by the 400-token limit, so compare all but its tail).
        assert hf.decode(ids) == text
        cut = text.rfind(" ")
        assert hf.encode(text[:cut]).ids == ids[: len(hf.encode(text[:cut]).ids)]
        assert len(hf.encode(text[:cut]).ids) >= 390


def test_answers_round_trip_with_a_qwen_style_pre_tokenizer(tmp_path: Path) -> None:
    """Qwen's and Llama 3's split regex keep "." and a following newline together: atoms do too."""
    qwen = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            r"|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = ["The end.\nThe start. A word, another word? Yes.\nNo.\n" * 50, model_maker._ENGLISH.replace(" ", ". ")]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    assert len(tok.encode(".\n").ids) == 1  # the merge that separate "." and "\n" atoms would break
    tok.save(str(tmp_path / "tokenizer.json"))
    assert check_answers(HfTokenizer(tmp_path)) is None


def test_chat_templates_render_as_transformers_does_and_their_errors_are_400s(model_dir: Path,
                                                                           tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
                "{{ raise_exception('no tools here') }}{% endif %}"
                "[{{ m['role'] }}|{{ m['content'] }}]{% endfor %}"
                "{% if add_generation_prompt %}[assistant{% if enable_thinking is false %} quick{% endif %}|"
                "{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_end|>"}}))
    tok = HfTokenizer(tmp_path)
    assert tok.template_note == "jinja (tokenizer_config.json)"
    assert tok.eos_chat == tok.encode("<|im_end|>")[0]
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert tok.render_chat([{"role": "user", "content": parts}], True, {"enable_thinking": False}) == (
        "<|endoftext|>[user|one\ntwo][assistant quick|")
    with pytest.raises(ValueError, match="no tools here"):
        tok.render_chat([{"role": "tool", "content": "x"}])

    (tmp_path / "tokenizer_config.json").write_text("{}")  # no template: ChatML, and it says so
    assert HfTokenizer(tmp_path).template_note.startswith("ChatML approximation")
