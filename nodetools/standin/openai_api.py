"""The OpenAI-compatible routes: models, completions and chat completions, and vLLM's tokenizer endpoints."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from nodetools.standin.access_log import remember_peer
from nodetools.standin.config import ServeConfig
from nodetools.standin.engine import Engine
from nodetools.standin.protocol import (
    ApiError,
    GenRequest,
    chat_prompt_text,
    chat_response,
    check_prompts,
    completion_response,
    parse_chat,
    parse_completion,
    usage,
)
from nodetools.standin.request import EngineRequest
from nodetools.standin.responses import error_response, json_response
from nodetools.standin.streaming import stream_events
from nodetools.standin.tokenizer import TokenizerInfo

__all__ = ["OpenAIRoutes"]

# Prompts longer than this (characters, ~60 tokens) are tokenized in a worker thread, as vLLM's API server
# does, so they do not stall the engine steps and the other streams (the batch call releases the GIL); the
# thread hop costs more than encoding a shorter one inline. One worker, so requests reach the engine in the
# order they arrived: a pool of threads would let a short prompt overtake a long one and turn a round-robin
# visit order into a shuffled one, which changes what an LRU prefix cache keeps.
INLINE_TOKENIZE_CHARS = 256


class OpenAIRoutes:
    """Handlers of the serving API for one model (``--served-model-name``), checked against ``--api-key``."""

    def __init__(self, cfg: ServeConfig, engine: Engine, max_model_len: int, tokenizer_info: TokenizerInfo) -> None:
        self.cfg = cfg
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.tokenizer_info = tokenizer_info
        self.max_model_len = max_model_len
        self.model_name = cfg.served_model_name
        self.created = int(time.time())
        self._tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    async def models(self, request: web.Request) -> web.Response:
        if (denied := self._check_key(request)) is not None:
            return denied
        return json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.cfg.model, "parent": None, "max_model_len": self.max_model_len,
            "permission": [{"id": "modelperm-standin", "object": "model_permission", "created": self.created,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}],
            # Not in vLLM's card: what the stand-in counts tokens with (the model's tokenizer, or not).
            "standin_tokenizer": self.tokenizer_info.as_dict(),
        }]})

    async def tokenize(self, request: web.Request) -> web.Response:
        # vLLM's /tokenize: a prompt is encoded with special tokens, messages render the chat template
        # and are encoded without (each overridable with add_special_tokens).
        try:
            body = await _body(request)
            if not isinstance(body, dict):
                raise ApiError(400, "request body must be a JSON object")
            if "messages" in body:
                text = chat_prompt_text(body, self.tokenizer)
                special = body.get("add_special_tokens", False)
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
                special = body.get("add_special_tokens", True)
            else:
                raise ApiError(400, "give `prompt` (a string) or `messages`", param="prompt")
        except ApiError as err:
            return error_response(err)
        tokens = (await self._encode([text], bool(special)))[0]
        token_strs = self.tokenizer.token_strs(tokens) if body.get("return_token_strs") else None
        return json_response({"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens,
                              "token_strs": token_strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await _body(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ApiError(400, "tokens must be a list of integers", param="tokens")
            if any(t < 0 or t >= self.tokenizer.vocab_size for t in tokens):
                raise ApiError(400, f"Token id out of vocabulary [0, {self.tokenizer.vocab_size})",
                               param="tokens")
        except ApiError as err:
            return error_response(err)
        return json_response({"prompt": self.tokenizer.decode(tokens)})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    def _check_key(self, request: web.Request) -> web.Response | None:
        if self.cfg.api_key and request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
            return json_response({"error": "Unauthorized"}, 401)
        return None

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        remember_peer(request)
        if (denied := self._check_key(request)) is not None:
            return denied
        try:
            body = await _body(request)
            gen = parse_chat(body, self.tokenizer) if kind == "chat" else parse_completion(body)
            if gen.texts is not None:
                gen.prompts = await self._encode(gen.texts, gen.add_special_tokens)
            check_prompts(gen)
            reqs = self._submit(gen)
        except ApiError as err:
            return error_response(err)
        try:
            if gen.stream:
                return await stream_events(request, gen, reqs, self.model_name, self._usage)
            return await self._collect(gen, reqs)
        finally:
            for req in reqs:
                self.engine.abort(req)  # a no-op once finished; frees a disconnected client's request

    def _submit(self, gen: GenRequest) -> list[EngineRequest]:
        """Check every prompt against the model and the context length, then hand them all to the engine."""
        if gen.model is not None and gen.model != self.model_name:
            raise ApiError(404, f"The model `{gen.model}` does not exist.", "NotFoundError", "model")
        if self.engine.is_sleeping:
            raise ApiError(503, "The engine is sleeping: POST /wake_up first.", "ServiceUnavailableError")
        if self.engine.weights.need_reload:  # vLLM would answer with garbage: the stand-in says why
            raise ApiError(503, "The weights were discarded by a level-2 sleep: POST /collective_rpc "
                           "{\"method\": \"reload_weights\"} first.", "ServiceUnavailableError")
        limit = self.max_model_len
        plans: list[tuple[list[int], int]] = []
        for prompt in gen.prompts:
            if any(t < 0 or t >= self.tokenizer.vocab_size for t in prompt):
                raise ApiError(400, f"Token id out of vocabulary [0, {self.tokenizer.vocab_size})",
                               param="prompt")
            max_tokens = gen.max_tokens if gen.max_tokens is not None else limit - len(prompt)
            if len(prompt) >= limit or len(prompt) + max_tokens > limit:
                raise ApiError(400, (
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, {max_tokens} in the "
                    "completion). Please reduce the length of the messages or completion."),
                    param="max_tokens" if len(prompt) < limit else "messages")
            plans.append((prompt, max_tokens))
        eos = self.tokenizer.eos_chat if gen.kind == "chat" else self.tokenizer.eos_text
        return [self.engine.submit(f"{gen.request_id}-{i}", prompt, max_tokens=max_tokens,
                                   min_tokens=gen.min_tokens, ignore_eos=gen.ignore_eos, eos_id=eos,
                                   seed=gen.seed)
                for i, (prompt, max_tokens) in enumerate(plans)]

    async def _encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        if sum(len(t) for t in texts) <= INLINE_TOKENIZE_CHARS:
            encode = self.tokenizer.encode
            return [encode(t, add_special_tokens) for t in texts]
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenize_pool, self.tokenizer.encode_many, texts, add_special_tokens)

    def _usage(self, reqs: list[EngineRequest]) -> dict[str, Any]:
        return usage(sum(len(r.prompt_ids) for r in reqs), sum(len(r.output_ids) for r in reqs),
                     sum(r.cached_tokens or 0 for r in reqs), self.cfg.enable_prompt_tokens_details)

    async def _collect(self, gen: GenRequest, reqs: list[EngineRequest]) -> web.Response:
        """The non-streaming answer: wait for every prompt to finish, then one JSON body."""
        texts: list[str] = []
        finishes: list[str] = []
        for req in reqs:
            pieces: list[str] = []
            while True:
                piece, reason = await req.events.get()
                pieces.append(piece)
                if reason is not None:
                    break
            texts.append("".join(pieces))
            finishes.append(reason)
        if "abort" in finishes:
            return error_response(ApiError(503, "The request was aborted (engine asleep or shutting down).",
                                           "ServiceUnavailableError"))
        final = self._usage(reqs)
        if gen.kind == "chat":
            return json_response(chat_response(gen, self.model_name, text=texts[0], finish=finishes[0],
                                               final_usage=final))
        return json_response(completion_response(gen, self.model_name, texts=texts, finishes=finishes,
                                                 final_usage=final))


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from exc
