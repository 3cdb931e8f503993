"""Log writer that prints lines in vLLM's formats.

vLLM prefixes every line with the process that wrote it, ``(APIServer pid=N)`` or
``(EngineCore pid=N)``, then ``LEVEL MM-DD HH:MM:SS [file.py:LINE] message``; uvicorn's lines read
``(APIServer pid=N) INFO:     message``. The stand-in is one process, so both prefixes carry its
own pid, and ``[file.py:LINE]`` names the stand-in's own source line (a parser matches the shape,
and the log stays honest about who wrote it). Stand-in-specific lines start with ``[stand-in]``.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, ClassVar, TextIO

__all__ = [
    "STYLES",
    "ProcLogger",
    "VllmFormatter",
    "get_loggers",
    "setup_logging",
]

LOGGER_NAME = "nodetools.standin"

# Wording that differs between the vLLM versions a parser must handle (anchors §4).
STYLES: dict[str, dict[str, str]] = {
    "0.24": {
        "engine_proc": "EngineCore",
        "server_start": "Starting vLLM server on %s",
        "model_loading": "Model loading took %.2f GiB and %.6f seconds",
        "init_engine": "init engine (profile, create kv cache, warmup model) took %.2f s",
        "init_engine_compiled": "init engine (profile, create kv cache, warmup model) took %.2f s "
                                "(compilation: %.2f s)",
        "wake": "It took %.6f seconds to wake up tags %s.",
        "load_start": "Loading model from scratch...",
    },
    "legacy": {
        "engine_proc": "EngineCore_DP0",
        "server_start": "Starting vLLM API server 0 on %s",
        "model_loading": "Model loading took %.4f GiB memory and %.6f seconds",
        "init_engine": "init engine (profile, create kv cache, warmup model) took %.2f seconds",
        "init_engine_compiled": "init engine (profile, create kv cache, warmup model) took %.2f seconds",
        "wake": "It took %.6f seconds to wake up.",
        "load_start": "Starting to load model %s...",
    },
}

class VllmFormatter(logging.Formatter):
    """Formats records as vLLM's multiprocess log lines."""

    def format(self, record: logging.LogRecord) -> str:
        proc = getattr(record, "vllm_proc", "APIServer")
        prefix = f"({proc} pid={record.process}) "
        kind = getattr(record, "vllm_kind", "vllm")
        message = record.getMessage()
        if record.exc_info:
            message = message + "\n" + self.formatException(record.exc_info)
        if kind == "uvicorn":
            head = f"{prefix}{record.levelname}:     "
        elif kind == "raw":
            head = prefix
        else:
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(record.created))
            head = f"{prefix}{record.levelname} {stamp} [{record.filename}:{record.lineno}] "
        # vLLM repeats the prefix on every line of a multi-line message (tracebacks).
        return "\n".join(head + line for line in message.split("\n"))


class ProcLogger:
    """A logger bound to one vLLM process name (APIServer, EngineCore, Worker_TP1, ...)."""

    _stack: ClassVar[int] = 2  # report the caller of info()/warning(), not this wrapper

    def __init__(self, logger: logging.Logger, proc: str) -> None:
        self.logger = logger
        self.proc = proc

    def _log(self, level: int, msg: str, args: tuple[Any, ...], kind: str, stacklevel: int) -> None:
        if self.logger.isEnabledFor(level):
            self.logger.log(
                level, msg, *args, extra={"vllm_proc": self.proc, "vllm_kind": kind},
                stacklevel=self._stack + stacklevel,
            )

    # stacklevel=2 names the caller's caller in [file.py:LINE], for helpers that log for others.
    def debug(self, msg: str, *args: Any, stacklevel: int = 1) -> None:
        self._log(logging.DEBUG, msg, args, "vllm", stacklevel)

    def info(self, msg: str, *args: Any, stacklevel: int = 1) -> None:
        self._log(logging.INFO, msg, args, "vllm", stacklevel)

    def warning(self, msg: str, *args: Any, stacklevel: int = 1) -> None:
        self._log(logging.WARNING, msg, args, "vllm", stacklevel)

    def error(self, msg: str, *args: Any, stacklevel: int = 1) -> None:
        self._log(logging.ERROR, msg, args, "vllm", stacklevel)

    def uvicorn(self, msg: str, *args: Any, level: int = logging.INFO) -> None:
        self._log(level, msg, args, "uvicorn", 1)

    def raw(self, msg: str, *args: Any, stacklevel: int = 1) -> None:
        """A line without level and time, like tqdm progress bars in vLLM's logs."""
        self._log(logging.INFO, msg, args, "raw", stacklevel)

    def is_debug(self) -> bool:
        return self.logger.isEnabledFor(logging.DEBUG)


def setup_logging(level_name: str = "INFO", stream: TextIO | None = None) -> logging.Logger:
    """Route the stand-in's logger to stdout (vLLM writes its log there) with vLLM's format."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(VllmFormatter())
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, level_name.upper(), logging.INFO))
    logger.propagate = False
    return logger


def get_loggers(style: str) -> tuple[ProcLogger, ProcLogger]:
    """The APIServer and EngineCore loggers for a log style."""
    logger = logging.getLogger(LOGGER_NAME)
    return ProcLogger(logger, "APIServer"), ProcLogger(logger, STYLES[style]["engine_proc"])
