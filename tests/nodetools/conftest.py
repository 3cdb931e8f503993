"""Fixtures for the node-side tools: a tiny model and real engine stand-in servers on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
# Near-instant startup; a 20K-token GPU pool; costs small enough for sub-second loads.
FAST = {"STANDIN_PROCESS_START_S": "0", "STANDIN_MODEL_INIT_S": "0", "STANDIN_DYNAMO_S": "0",
        "STANDIN_COMPILE_MISS_S": "0", "STANDIN_COMPILE_HIT_S": "0", "STANDIN_PROFILE_S": "0",
        "STANDIN_JIT_MISS_S": "0", "STANDIN_JIT_HIT_S": "0", "STANDIN_GRAPH_CAPTURE_S": "0",
        "STANDIN_KV_ALLOC_S": "0", "STANDIN_API_START_S": "0", "STANDIN_OFFLOAD_PIN_S_PER_GIB": "0",
        "STANDIN_PREFILL_S_PER_TOKEN": "2e-6", "STANDIN_DECODE_S_PER_TOKEN": "0.002",
        "STANDIN_KV_CAPACITY_TOKENS": "20000"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


Start = Callable[..., Server]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    # The documented command line, not the stand-in's internals (another engineer's module).
    subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(path), "--size-mib", "1"],
                   check=True, capture_output=True, cwd=REPO)
    return path


@pytest.fixture
def standin(tiny_model: Path, tmp_path: Path) -> Iterator[Start]:
    """``standin(*flags, env={...})`` starts a stand-in named ``m`` and waits until it answers."""
    started: list[Server] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> Server:
        port = free_port()
        log = tmp_path / f"server-{port}.log"
        full_env = {**os.environ, **FAST, "VLLM_CACHE_ROOT": str(tmp_path / "cache"),
                    "STANDIN_JIT_DIR": str(tmp_path / "jit"), **(env or {})}
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "nodetools.standin", "serve", str(tiny_model), "--host", "127.0.0.1",
                 "--port", str(port), "--served-model-name", "m", "--enable-prompt-tokens-details", *flags],
                stdout=fh, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
        server = Server(proc, port, log)
        started.append(server)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                    return server
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError(f"stand-in not ready:\n{log.read_text()}")

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.terminate()
            server.proc.wait(timeout=10)
