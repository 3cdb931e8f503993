"""OpenAI-compatible request parsing and response shapes, as vLLM's server writes them."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from nodetools.standin.textgen import StandinTokenizer

__all__ = [
    "ApiError",
    "ChunkTemplate",
    "GenRequest",
    "chat_chunk",
    "chat_prompt_text",
    "chat_response",
    "check_prompts",
    "completion_chunk",
    "completion_response",
    "error_body",
    "parse_chat",
    "parse_completion",
    "usage",
    "usage_chunk",
]


class ApiError(Exception):
    """An error the API answers with vLLM's error body."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


def error_body(err: ApiError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.err_type, "param": err.param, "code": err.status}}


@dataclass
class GenRequest:
    kind: str  # "chat" or "completion"
    request_id: str
    created: int
    model: str | None
    prompts: list[list[int]]
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    seed: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    # Prompt texts still to tokenize (the server encodes long ones off the event loop), else None.
    texts: list[str] | None = None
    add_special_tokens: bool = True


def _int_field(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer, got {value!r}", param=name)
    if value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}", param=name)
    return value


def _common(body: dict[str, Any], kind: str, prompts: list[list[int]], texts: list[str] | None = None,
            add_special_tokens: bool = True) -> GenRequest:
    n = _int_field(body, "n", 1) or 1
    if n != 1:
        raise ApiError(400, "the engine stand-in serves n=1 only", param="n")
    max_tokens = _int_field(body, "max_completion_tokens", 1) if kind == "chat" else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", 1)
    if max_tokens is None and kind == "completion" and "max_tokens" not in body:
        max_tokens = 16  # vLLM's (and OpenAI's) default for /v1/completions; chat has none
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got "
                       f"{min_tokens}.", param="min_tokens")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    stream = bool(body.get("stream", False))
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return GenRequest(
        kind=kind, request_id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()),
        model=body.get("model"), prompts=prompts, max_tokens=max_tokens, min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)), seed=_int_field(body, "seed", -(2**63)),
        stream=stream, include_usage=bool(options.get("include_usage", False)),
        continuous_usage=bool(options.get("continuous_usage_stats", False)),
        texts=texts, add_special_tokens=add_special_tokens,
    )


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    return default if value is None else bool(value)


def chat_prompt_text(body: dict[str, Any], tokenizer: StandinTokenizer) -> str:
    """The prompt text vLLM renders from a request's messages with the model's chat template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "messages must be a non-empty list of objects", param="messages")
    extra = body.get("chat_template_kwargs")
    if extra is not None and not isinstance(extra, dict):
        raise ApiError(400, "chat_template_kwargs must be an object", param="chat_template_kwargs")
    try:
        return tokenizer.render_chat(messages, _flag(body, "add_generation_prompt", True), extra)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="messages") from exc


def parse_chat(body: Any, tokenizer: StandinTokenizer) -> GenRequest:
    """The request, with its rendered prompt in ``texts``: the caller tokenizes it."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    text = chat_prompt_text(body, tokenizer)
    # vLLM tokenizes the rendered chat without adding special tokens (the template has them).
    return _common(body, "chat", [], [text], _flag(body, "add_special_tokens", False))


def parse_completion(body: Any) -> GenRequest:
    """The request; string prompts are left in ``texts`` for the caller to tokenize."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    prompt = body.get("prompt")
    special = _flag(body, "add_special_tokens", True)
    if isinstance(prompt, str):
        return _common(body, "completion", [], [prompt], special)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return _common(body, "completion", [], list(prompt), special)
    prompts: list[list[int]]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [list(prompt)]
    elif (isinstance(prompt, list) and prompt
          and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt)):
        prompts = [list(p) for p in prompt]
    else:
        raise ApiError(400, "prompt must be a string, a list of strings, or token ids", param="prompt")
    return _common(body, "completion", prompts)


def check_prompts(gen: GenRequest) -> None:
    """After tokenizing: vLLM refuses an empty prompt."""
    if not gen.prompts or any(not p for p in gen.prompts):
        raise ApiError(400, "prompt must not be empty", param="messages" if gen.kind == "chat" else "prompt")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, details: bool) -> dict[str, Any]:
    # vLLM fills prompt_tokens_details only with --enable-prompt-tokens-details.
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens} if details else None,
    }


def chat_chunk(gen: GenRequest, model: str, index: int, delta: dict[str, Any], *, finish: str | None = None,
               chunk_usage: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": gen.request_id, "object": "chat.completion.chunk", "created": gen.created, "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish,
                     **({"stop_reason": None} if finish else {})}],
    }
    if chunk_usage is not None:
        chunk["usage"] = chunk_usage
    return chunk


def completion_chunk(gen: GenRequest, model: str, index: int, text: str, *, finish: str | None = None,
                     chunk_usage: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": gen.request_id, "object": "text_completion", "created": gen.created, "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish,
                     "stop_reason": None}],
    }
    if chunk_usage is not None:
        chunk["usage"] = chunk_usage
    return chunk


class ChunkTemplate:
    """Pre-encoded SSE chunk for the common case (a piece, no finish, no usage): the hot path.

    It yields exactly the bytes `chat_chunk` / `completion_chunk` would, a few times faster.
    """

    _pieces: ClassVar[dict[str, bytes]] = {}

    def __init__(self, gen: GenRequest, model: str, index: int) -> None:
        if gen.kind == "chat":
            probe = chat_chunk(gen, model, index, {"content": _MARK})
        else:
            probe = completion_chunk(gen, model, index, _MARK)
        head, tail = _compact(probe).split(_compact(_MARK))
        self.head = b"data: " + head
        self.tail = tail + b"\n\n"

    def piece(self, text: str) -> bytes:
        encoded = self._pieces.get(text)
        if encoded is None:
            encoded = _compact(text)
            if len(self._pieces) < 100_000:
                self._pieces[text] = encoded
        return self.head + encoded + self.tail


_MARK = "\x00standin-piece\x00"


def _compact(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def usage_chunk(gen: GenRequest, model: str, final_usage: dict[str, Any]) -> dict[str, Any]:
    kind = "chat.completion.chunk" if gen.kind == "chat" else "text_completion"
    return {"id": gen.request_id, "object": kind, "created": gen.created, "model": model, "choices": [],
            "usage": final_usage}


def chat_response(gen: GenRequest, model: str, *, text: str, finish: str, final_usage: dict[str, Any]
                  ) -> dict[str, Any]:
    return {
        "id": gen.request_id, "object": "chat.completion", "created": gen.created, "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "tool_calls": [], "reasoning_content": None},
            "logprobs": None, "finish_reason": finish, "stop_reason": None,
        }],
        "service_tier": None, "system_fingerprint": None, "usage": final_usage, "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def completion_response(gen: GenRequest, model: str, *, texts: list[str], finishes: list[str],
                        final_usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": gen.request_id, "object": "text_completion", "created": gen.created, "model": model,
        "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": f, "stop_reason": None,
                     "prompt_logprobs": None} for i, (t, f) in enumerate(zip(texts, finishes, strict=True))],
        "service_tier": None, "system_fingerprint": None, "usage": final_usage, "kv_transfer_params": None,
    }
