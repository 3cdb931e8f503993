"""Helpers for the stand-in tests: a server subprocess on a free loopback port, and its log."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]

# Tiny timings so a start takes well under a second (the defaults are seconds-scale).
FAST_KNOBS = {
    "STANDIN_PROCESS_START_S": "0",
    "STANDIN_MODEL_INIT_S": "0",
    "STANDIN_DYNAMO_S": "0.02",
    "STANDIN_COMPILE_MISS_S": "0.15",
    "STANDIN_COMPILE_HIT_S": "0.01",
    "STANDIN_PROFILE_S": "0",
    "STANDIN_JIT_MISS_S": "0.02",
    "STANDIN_JIT_HIT_S": "0",
    "STANDIN_GRAPH_CAPTURE_S": "0.02",
    "STANDIN_KV_ALLOC_S": "0",
    "STANDIN_API_START_S": "0",
    "STANDIN_OFFLOAD_PIN_S_PER_GIB": "0",
    "STANDIN_PREFILL_S_PER_TOKEN": "1e-6",
    "STANDIN_CPU_LOAD_S_PER_TOKEN": "1e-7",
    "STANDIN_FS_LOAD_S_PER_TOKEN": "1e-7",
    "STANDIN_DECODE_S_PER_TOKEN": "0.001",
    "STANDIN_SLEEP_S": "0.05",
    "STANDIN_WAKE_S": "0.02",
}

# vLLM's line shapes (anchors §4): timestamped lines, uvicorn lines, and prefixed raw lines.
VLLM_LINE = re.compile(
    r"^\((?P<proc>[A-Za-z_]+\d*) pid=\d+\) (?:"
    r"(?P<lvl>DEBUG|INFO|WARNING|ERROR) \d{2}-\d{2} \d{2}:\d{2}:\d{2} \[[\w.]+:\d+\] .*"
    r"|INFO:     .*"
    r"|Loading safetensors checkpoint shards: .*"
    r"|)$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Standin:
    """One stand-in server process, started by a test."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    base: str = field(init=False)

    def __post_init__(self) -> None:
        self.base = f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url("/health"), timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"stand-in not ready after {timeout} s:\n{self.log()}")

    def wait_log(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log())
            if match:
                return match
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not in the log after {timeout} s:\n{self.log()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"stand-in ignored {sig.name}:\n{self.log()}") from None
        return int(self.proc.returncode)

    def sample(self, name: str, **labels: str) -> float:
        """The one /metrics sample of `name` whose labels include `labels`."""
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        found = [v for k, v in self.metrics().items()
                 if k.split("{", 1)[0] == name and "{" in k and all(w in k for w in wanted)]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics keyed `name{labels}` and by bare name (first sample)."""
        text = httpx.get(self.url("/metrics"), timeout=5).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
            out.setdefault(key.split("{", 1)[0], float(value))
        return out


StandinFactory = Callable[..., Standin]


def start(model: Path, workdir: Path, args: list[str], env: dict[str, str] | None, wait: bool) -> Standin:
    """Start `python -m nodetools.standin serve MODEL` with fast knobs; its log goes to a file."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **FAST_KNOBS, "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
                "STANDIN_JIT_DIR": str(workdir / "jit"), "PYTHONPATH": str(REPO)}
    full_env.update(env or {})
    log_path = workdir / f"server-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nodetools.standin", "serve", str(model), "--host", "127.0.0.1",
             "--port", str(port), *args],
            stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO,
        )
    server = Standin(proc, port, log_path)
    if wait:
        server.wait_ready()
    return server
