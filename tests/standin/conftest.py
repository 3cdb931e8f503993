"""Fixtures for the engine stand-in tests: a tiny model, and real server subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodetools.standin.cli import make_model
from tests.standin.support import Standin, StandinFactory, start


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    make_model(path, size_mib=2, shards=2, max_position_embeddings=8192)
    return path


@pytest.fixture
def standin(model_dir: Path, tmp_path: Path) -> Iterator[StandinFactory]:
    """Start stand-ins with `standin(*flags, env=..., workdir=..., wait=True)`; stopped at teardown."""
    started: list[Standin] = []

    def factory(*args: str, env: dict[str, str] | None = None, workdir: Path | None = None,
                wait: bool = True, model: Path | None = None) -> Standin:
        server = start(model or model_dir, workdir or tmp_path, list(args), env, wait)
        started.append(server)
        return server

    yield factory
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="module")
def shared_standin(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standin]:
    """One server for a whole module: prompt-token details on, stats every second."""
    server = start(model_dir, tmp_path_factory.mktemp("shared"),
                    ["--enable-prompt-tokens-details", "--max-model-len", "8192"],
                    {"VLLM_LOG_STATS_INTERVAL": "1"}, wait=True)
    yield server
    rc = server.stop()
    assert rc == 0, server.log()
