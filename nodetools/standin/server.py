"""The stand-in's process: bind, start the engine, serve HTTP, stop on a signal (aiohttp).

Like vLLM, the port is bound early (so a port conflict fails fast) but only listens once the
engine has started, so ``/health`` cannot answer before ``Application startup complete.``.
SIGTERM and SIGINT abort in-flight requests, log vLLM's ``[shutdown]`` and uvicorn's
``Shutting down`` lines, and exit 0. The routes are in openai_api.py and admin_api.py, listening
in http_app.py, the engine's start-up sequence in engine_setup.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from typing import Any

from nodetools.standin.config import STANDIN_VERSION, ServeConfig
from nodetools.standin.engine_setup import build_engine, start_engine_core
from nodetools.standin.http_app import build_routes, start_http
from nodetools.standin.startup import StartupError, model_config, resolve_max_model_len
from nodetools.standin.stats import StatsLogger
from nodetools.standin.tokenizer import load_tokenizer
from nodetools.standin.vllm_log import ProcLogger, get_loggers

__all__ = ["serve"]


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
    api.info("[stand-in] bound %s:%d; it listens once startup completes", cfg.host or "0.0.0.0",
             sock.getsockname()[1])

    # The tokenizer loads (or is made, for an old make-model folder) in a thread while the engine starts.
    tokenizer_load = asyncio.create_task(asyncio.to_thread(
        load_tokenizer, cfg.model_path, cfg.knobs.tokenizer, cfg.knobs.vocab_size))
    startup = asyncio.create_task(start_engine_core(cfg, eng, max_model_len, environ))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({startup, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not startup.done():  # a signal during start-up: stop without ever listening
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
    engine = build_engine(cfg, result, max_model_len, api, eng, tok)
    routes = build_routes(cfg, engine, max_model_len, tok.info)
    engine_task = asyncio.create_task(engine.run())
    await asyncio.sleep(cfg.knobs.api_start_s)
    runner = await start_http(cfg, routes, sock, api, environ)
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
