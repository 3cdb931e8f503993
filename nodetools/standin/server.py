"""The stand-in's HTTP server and process lifecycle (aiohttp).

Like vLLM, the port is bound early (so a port conflict fails fast) but only listens once the
engine has started, so ``/health`` cannot answer before ``Application startup complete.``.
SIGTERM and SIGINT abort in-flight requests, log vLLM's ``[shutdown]`` and uvicorn's
``Shutting down`` lines, and exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from nodetools.standin.config import STANDIN_VERSION, ServeConfig
from nodetools.standin.engine import Engine, EngineParams, EngineRequest, MemoryFigures
from nodetools.standin.kvcache import FsTier, HostTier, KvCacheManager
from nodetools.standin.protocol import (
    ApiError,
    ChunkTemplate,
    GenRequest,
    chat_chunk,
    chat_prompt_text,
    chat_response,
    check_prompts,
    completion_chunk,
    completion_response,
    error_body,
    parse_chat,
    parse_completion,
    usage,
    usage_chunk,
)
from nodetools.standin.startup import (
    StartupError,
    StartupResult,
    compile_cache_key,
    model_config,
    resolve_max_model_len,
    run_engine_startup,
)
from nodetools.standin.stats import EngineStats, StatsLogger
from nodetools.standin.tokenizer import TokenizerChoice, TokenizerInfo, load_tokenizer
from nodetools.standin.vllm_log import STYLES, ProcLogger, get_loggers

__all__ = ["serve"]

_JSON_DUMPS = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# Prompts longer than this (characters, ~60 tokens) are tokenized in a worker thread, as vLLM's API server
# does, so they do not stall the engine steps and the other streams (the batch call releases the GIL); the
# thread hop costs more than encoding a shorter one inline. One worker, so requests reach the engine in the
# order they arrived: a pool of threads would let a short prompt overtake a long one and turn a round-robin
# visit order into a shuffled one, which changes what an LRU prefix cache keeps.
_INLINE_TOKENIZE_CHARS = 256


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_JSON_DUMPS(data).encode(), status=status, content_type="application/json")


def _error(err: ApiError) -> web.Response:
    return _json(error_body(err), err.status)


class _UvicornAccessLogger(AbstractAccessLogger):
    """Access lines as uvicorn writes them in vLLM's log."""

    api: ProcLogger | None = None

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if self.api is None:
            return
        peer = request.get("standin_peer") or (
            request.transport.get_extra_info("peername") if request.transport else None)
        client = f"{peer[0]}:{peer[1]}" if peer else "-"
        v = request.version
        self.api.uvicorn('%s - "%s %s HTTP/%d.%d" %d %s', client, request.method, request.path_qs,
                         v.major, v.minor, response.status, response.reason)


class StandinServer:
    """Routes and state of one stand-in serving one model."""

    def __init__(self, cfg: ServeConfig, engine: Engine, max_model_len: int, api: ProcLogger,
                 tokenizer_info: TokenizerInfo) -> None:
        self.cfg = cfg
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.tokenizer_info = tokenizer_info
        self.max_model_len = max_model_len
        self.api = api
        self.model_name = cfg.served_model_name
        self.created = int(time.time())
        self._tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def routes(self) -> list[web.RouteDef]:
        routes = [
            web.get("/health", self.health, allow_head=False),
            web.get("/version", self.version, allow_head=False),
            web.get("/metrics", self.metrics, allow_head=False),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/v1/models", self.models, allow_head=False),
            web.post("/reset_prefix_cache", self.reset_prefix_cache),
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
        ]
        if self.cfg.enable_sleep_mode:
            routes += [web.post("/sleep", self.sleep), web.post("/wake_up", self.wake_up),
                       web.get("/is_sleeping", self.is_sleeping, allow_head=False)]
        return routes

    # Plain endpoints.
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": f"{STANDIN_VERSION}+standin", "engine": "stand-in",
                      "tokenizer": self.tokenizer_info.kind})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.engine.stats.render(), content_type="text/plain",
                            headers={"X-Engine": "stand-in"})

    async def models(self, request: web.Request) -> web.Response:
        if (denied := self._check_key(request)) is not None:
            return denied
        return _json({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.cfg.model, "parent": None, "max_model_len": self.max_model_len,
            "permission": [{"id": "modelperm-standin", "object": "model_permission", "created": self.created,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}],
            # Not in vLLM's card: what the stand-in counts tokens with (the model's tokenizer, or not).
            "standin_tokenizer": self.tokenizer_info.as_dict(),
        }]})

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except ValueError as exc:
            raise ApiError(400, f"invalid JSON body: {exc}") from exc

    async def tokenize(self, request: web.Request) -> web.Response:
        # vLLM's /tokenize: a prompt is encoded with special tokens, messages render the chat template
        # and are encoded without (each overridable with add_special_tokens).
        try:
            body = await self._body(request)
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
            return _error(err)
        tokens = (await self._encode([text], bool(special)))[0]
        token_strs = self.tokenizer.token_strs(tokens) if body.get("return_token_strs") else None
        return _json({"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens,
                      "token_strs": token_strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ApiError(400, "tokens must be a list of integers", param="tokens")
            if any(t < 0 or t >= self.tokenizer.vocab_size for t in tokens):
                raise ApiError(400, f"Token id out of vocabulary [0, {self.tokenizer.vocab_size})",
                               param="tokens")
        except ApiError as err:
            return _error(err)
        return _json({"prompt": self.tokenizer.decode(tokens)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.engine.reset_prefix_cache()
        return web.Response(status=200)

    # Sleep mode (routes exist only with --enable-sleep-mode).
    async def sleep(self, request: web.Request) -> web.Response:
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            return _error(ApiError(400, "level must be 1 or 2", param="level"))
        if level not in (1, 2):
            return _error(ApiError(400, "level must be 1 or 2", param="level"))
        await self.engine.sleep(level)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", None)
        await self.engine.wake_up(list(tags) if tags else None)
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return _json({"is_sleeping": self.engine.is_sleeping})

    # Generation.
    def _check_key(self, request: web.Request) -> web.Response | None:
        if self.cfg.api_key and request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
            return _json({"error": "Unauthorized"}, 401)
        return None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    def _submit(self, gen: GenRequest) -> list[EngineRequest]:
        if gen.model is not None and gen.model != self.model_name:
            raise ApiError(404, f"The model `{gen.model}` does not exist.", "NotFoundError", "model")
        if self.engine.is_sleeping:
            raise ApiError(503, "The engine is sleeping: POST /wake_up first.", "ServiceUnavailableError")
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

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        # Remember the peer now: a client that leaves mid-stream takes the transport with it.
        request["standin_peer"] = request.transport.get_extra_info("peername") if request.transport else None
        if (denied := self._check_key(request)) is not None:
            return denied
        try:
            body = await self._body(request)
            gen = parse_chat(body, self.tokenizer) if kind == "chat" else parse_completion(body)
            if gen.texts is not None:
                gen.prompts = await self._encode(gen.texts, gen.add_special_tokens)
            check_prompts(gen)
            reqs = self._submit(gen)
        except ApiError as err:
            return _error(err)
        try:
            if gen.stream:
                return await self._stream(request, gen, reqs)
            return await self._collect(gen, reqs)
        finally:
            for req in reqs:
                self.engine.abort(req)  # a no-op once finished; frees a disconnected client's request

    async def _encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        if sum(len(t) for t in texts) <= _INLINE_TOKENIZE_CHARS:
            encode = self.tokenizer.encode
            return [encode(t, add_special_tokens) for t in texts]
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenize_pool, self.tokenizer.encode_many, texts, add_special_tokens)

    def _usage(self, reqs: list[EngineRequest]) -> dict[str, Any]:
        return usage(sum(len(r.prompt_ids) for r in reqs), sum(len(r.output_ids) for r in reqs),
                     sum(r.cached_tokens or 0 for r in reqs), self.cfg.enable_prompt_tokens_details)

    async def _collect(self, gen: GenRequest, reqs: list[EngineRequest]) -> web.Response:
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
            return _error(ApiError(503, "The request was aborted (engine asleep or shutting down).",
                                   "ServiceUnavailableError"))
        final = self._usage(reqs)
        if gen.kind == "chat":
            return _json(chat_response(gen, self.model_name, text=texts[0], finish=finishes[0],
                                       final_usage=final))
        return _json(completion_response(gen, self.model_name, texts=texts, finishes=finishes,
                                         final_usage=final))

    async def _stream(self, request: web.Request, gen: GenRequest, reqs: list[EngineRequest]
                      ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        events: asyncio.Queue[tuple[int, str, str | None]] = asyncio.Queue()
        forwarders: list[asyncio.Task[None]] = []
        if len(reqs) == 1:
            source: asyncio.Queue[Any] = reqs[0].events
        else:
            source = events
            forwarders = [asyncio.create_task(_forward(i, r, events)) for i, r in enumerate(reqs)]
        chat = gen.kind == "chat"
        model = self.model_name
        templates = [ChunkTemplate(gen, model, i) for i in range(len(reqs))]
        try:
            if chat:
                await _sse(resp, chat_chunk(gen, model, 0, {"role": "assistant", "content": ""}))
            done = 0
            while done < len(reqs):
                item = await source.get()
                index, piece, reason = item if len(reqs) > 1 else (0, *item)
                if reason is None and not gen.continuous_usage:
                    await resp.write(templates[index].piece(piece))
                    continue
                if reason is not None:
                    done += 1
                per_chunk = self._usage(reqs) if gen.continuous_usage else None
                if chat:
                    await _sse(resp, chat_chunk(gen, model, index, {"content": piece}, finish=reason,
                                                chunk_usage=per_chunk))
                else:
                    await _sse(resp, completion_chunk(gen, model, index, piece, finish=reason,
                                                      chunk_usage=per_chunk))
            if gen.include_usage:
                await _sse(resp, usage_chunk(gen, model, self._usage(reqs)))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            return resp  # the client left; _generate aborts its requests
        finally:
            for task in forwarders:
                task.cancel()
        await resp.write_eof()
        return resp


async def _forward(index: int, req: EngineRequest, out: asyncio.Queue[tuple[int, str, str | None]]) -> None:
    while True:
        piece, reason = await req.events.get()
        out.put_nowait((index, piece, reason))
        if reason is not None:
            return


async def _sse(resp: web.StreamResponse, data: dict[str, Any]) -> None:
    await resp.write(b"data: " + _JSON_DUMPS(data).encode() + b"\n\n")


def _bind(host: str | None, port: int) -> socket.socket:
    """Bind without listening: connections are refused until startup completes."""
    infos = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _log_frontend(cfg: ServeConfig, api: ProcLogger, max_model_len: int) -> None:
    # `non-default args` comes first: parsers use it as the process-start marker.
    api.info("non-default args: %s", cfg.non_default_args)
    api.info("[stand-in] vLLM engine stand-in %s serving %s: a rehearsal that measures nothing about vLLM",
             STANDIN_VERSION, cfg.model)
    for flag in cfg.unmodelled_flags:
        api.warning("flag %s is accepted but not modelled by the stand-in", flag)
    api.info("[stand-in] engine=stand-in; knobs differing from defaults: %s", cfg.knobs.non_default())
    if cfg.enable_sleep_mode:
        api.info("Enabling cumem allocator because sleep mode requires it.")
    arch = model_config(cfg.model_path).get("architectures")
    if isinstance(arch, list) and arch:
        api.info("Resolved architecture: %s", arch[0])
    api.info("Using max model len %d", max_model_len)
    api.info("Chunked prefill is enabled with max_num_batched_tokens=%d.", cfg.max_num_batched_tokens)
    if cfg.enforce_eager:
        api.warning("Enforce eager set, disabling torch.compile and CUDAGraphs. This is equivalent to "
                    "setting -cc.mode=none -cc.cudagraph_mode=none")
        api.info("Cudagraph is disabled under eager mode")


def _build_engine(cfg: ServeConfig, result: StartupResult, max_model_len: int, api: ProcLogger,
                  eng: ProcLogger, tok: TokenizerChoice) -> Engine:
    k = cfg.knobs
    tiers: list[HostTier] = []
    if cfg.offload.cpu_bytes:
        tiers.append(HostTier(cfg.offload.cpu_bytes // k.offload_bytes_per_token // cfg.block_size))
    if cfg.offload.fs_root:
        cap = int(k.kv_fs_capacity_gib * 2**30 // k.offload_bytes_per_token // cfg.block_size)
        digest = compile_cache_key(cfg, max_model_len)[:16]
        tag = cfg.model_path.name or "model"
        tiers.append(FsTier(Path(cfg.offload.fs_root).expanduser(), tag, digest, capacity_blocks=cap or None,
                            file_bytes=k.kv_fs_file_bytes))
    gpu_blocks = result.kv_tokens // cfg.block_size
    kv = KvCacheManager(cfg.block_size, gpu_blocks, prefix_caching=cfg.enable_prefix_caching, tiers=tiers,
                        policy=k.offload_policy, offload_prompt_only=cfg.offload.offload_prompt_only)
    cache_info = {"block_size": str(cfg.block_size), "num_gpu_blocks": str(gpu_blocks),
                  "enable_prefix_caching": str(cfg.enable_prefix_caching),
                  "cpu_offload_tokens": str(sum(t.capacity_blocks for t in tiers[:1]) * cfg.block_size
                                            if cfg.offload.cpu_bytes else 0)}
    stats = EngineStats(cfg.served_model_name, kv.has_connector, cache_info, tok.info.kind)
    params = EngineParams(
        block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        prefill_s_per_token=k.prefill_s_per_token, cpu_load_s_per_token=k.cpu_load_s_per_token,
        fs_load_s_per_token=k.fs_load_s_per_token, decode_s_per_token=k.decode_s_per_token,
        step_overhead_s=k.step_overhead_s, text_min_tokens=k.text_min_tokens,
        text_max_tokens=k.text_max_tokens,
        seed=cfg.seed, sleep_s=k.sleep_s, wake_s=k.wake_s, log_style=k.log_style,
        crash_after_requests=k.crash_after_requests)
    memory = MemoryFigures(result.model_gib, result.kv_gib, result.graphs_gib, k.sleep_residual_gib)
    return Engine(params, kv, tokenizer=tok.tokenizer, stats=stats, memory=memory, log_engine=eng, log_api=api)


async def serve(cfg: ServeConfig, environ: dict[str, str]) -> int:
    """Run the stand-in until SIGTERM/SIGINT; returns the exit code."""
    api, eng = get_loggers(cfg.knobs.log_style)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    state: dict[str, Any] = {"signal": None}

    def on_signal(sig: signal.Signals) -> None:
        if state["signal"] is None:
            state["signal"] = sig
            eng.info("[shutdown] EngineCore: trigger received signal=%s", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    max_model_len = resolve_max_model_len(cfg)
    _log_frontend(cfg, api, max_model_len)
    if not cfg.model_path.exists() and not cfg.knobs.weights_file:
        api.error("[stand-in] model path %s does not exist (the stand-in reads local weights only)",
                  cfg.model)
        return 1
    try:
        sock = _bind(cfg.host, cfg.port)
    except OSError as exc:
        api.error("OSError: [Errno %s] %s", exc.errno, exc.strerror)
        return 1
    bound = sock.getsockname()
    shown_host = cfg.host or "0.0.0.0"
    api.info("[stand-in] bound %s:%d; it listens once startup completes", shown_host, bound[1])

    # The tokenizer loads (or is made, for an old make-model folder) in a thread while the engine starts.
    tokenizer_load = asyncio.create_task(asyncio.to_thread(
        load_tokenizer, cfg.model_path, cfg.knobs.tokenizer, cfg.knobs.vocab_size))
    startup = asyncio.create_task(_startup(cfg, eng, max_model_len, environ))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({startup, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not startup.done():
        startup.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await startup
        sock.close()
        _log_shutdown(api, eng, server_started=False)
        return 0
    stopper.cancel()
    try:
        result = startup.result()
    except StartupError as exc:
        eng.error("EngineCore failed to start.")
        eng.error("ValueError: %s", exc)
        api.error("RuntimeError: Engine core initialization failed. See root cause above. "
                  "Failed core proc(s): {}")
        sock.close()
        return 1

    tok = await tokenizer_load
    for level, line in tok.log:
        getattr(api, level)("%s", line)
    engine = _build_engine(cfg, result, max_model_len, api, eng, tok)
    server = StandinServer(cfg, engine, max_model_len, api, tok.info)
    engine_task = asyncio.create_task(engine.run())
    await asyncio.sleep(cfg.knobs.api_start_s)
    app = web.Application()
    app.add_routes(server.routes())
    access = None if cfg.disable_uvicorn_access_log else api.logger
    _UvicornAccessLogger.api = api
    runner = web.AppRunner(app, access_log_class=_UvicornAccessLogger, access_log=access,
                           handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    api.info("Supported tasks: ['generate']")
    if environ.get("VLLM_SERVER_DEV_MODE", "0") not in ("", "0"):
        api.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in "
                    "production!")
    api.info(STYLES[cfg.knobs.log_style]["server_start"], f"http://{shown_host}:{bound[1]}")
    api.info("Available routes are:")
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter") or ""
        api.info("Route: %s, Methods: %s", path, route.method)
    site = web.SockSite(runner, sock, shutdown_timeout=1.0)
    await site.start()
    api.uvicorn("Started server process [%d]", os.getpid())
    api.uvicorn("Waiting for application startup.")
    api.uvicorn("Application startup complete.")
    stats_task = None
    if not cfg.disable_log_stats:
        interval = float(environ.get("VLLM_LOG_STATS_INTERVAL", "10") or 10)
        stats_logger = StatsLogger(engine.stats, api, interval)
        stats_task = asyncio.create_task(stats_logger.run())

    await stop.wait()
    aborted = engine.abort_all()
    _log_shutdown(api, eng, server_started=True, aborted=aborted)
    for task in (engine_task, stats_task):
        if task is not None:
            task.cancel()
    await runner.cleanup()
    engine.kv.close()
    api.uvicorn("Waiting for application shutdown.")
    api.uvicorn("Application shutdown complete.")
    return 0


async def _startup(cfg: ServeConfig, eng: ProcLogger, max_model_len: int, environ: dict[str, str]
                   ) -> StartupResult:
    await asyncio.sleep(cfg.knobs.process_start_s)
    eng.info("Initializing a V1 LLM engine (v%s+standin) with config: model=%r, served_model_name=%s, "
             "max_seq_len=%d, load_format=%s, tensor_parallel_size=%d, dtype=%s, enforce_eager=%s, seed=%d, "
             "enable_prefix_caching=%s, block_size=%d", STANDIN_VERSION, cfg.model, cfg.served_model_name,
             max_model_len, cfg.load_format, cfg.tensor_parallel_size, cfg.dtype, cfg.enforce_eager, cfg.seed,
             cfg.enable_prefix_caching, cfg.block_size)
    tp = cfg.tensor_parallel_size
    workers = [eng] if tp == 1 else [ProcLogger(eng.logger, f"Worker_TP{r}") for r in range(tp)]
    return await run_engine_startup(cfg, eng, workers, max_model_len, environ)


def _log_shutdown(api: ProcLogger, eng: ProcLogger, server_started: bool, aborted: int = 0) -> None:
    api.info("[shutdown] API server: shutdown triggered")
    api.info("[shutdown] API server: stopping engine client mode=abort timeout=0s")
    eng.info("[shutdown] EngineCore: start mode=abort timeout=0s")
    if aborted:
        eng.info("[stand-in] aborted %d in-flight requests", aborted)
    eng.info("[shutdown] EngineCore: request processing complete; starting resource teardown")
    eng.info("[shutdown] EngineCore: exiting busy loop")
    api.info("[shutdown] API server: engine client stopped")
    if server_started:
        api.info("[shutdown] API server: signalling HTTP server shutdown")
        api.info("[shutdown] API server: shutting down FastAPI HTTP server")
    api.uvicorn("Shutting down")
