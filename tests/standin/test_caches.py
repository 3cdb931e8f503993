"""The stand-in's caches: its own root unless told otherwise, never the folders a real vLLM reads.

Started as docs/standin.md shows (no cache variables), with HOME pointed at a temporary folder: a
real vLLM on the same machine reads ``~/.cache/vllm`` and ``~/.cache/flashinfer``, so the stand-in's
fake compile artefacts and JIT markers must land in ``~/.cache/nodetools-standin`` instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.standin.support import FAST_KNOBS, REPO, Standin, free_port

# What a user's shell may hold that would tell the stand-in where its caches go: the test starts from none.
CACHE_VARIABLES = ("VLLM_CACHE_ROOT", "STANDIN_JIT_DIR", "XDG_CACHE_HOME")
COMPILE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch.compile")
JIT_LINE = re.compile(r"\[stand-in\] kernel JIT warmup: cache (hit|miss) in (\S+),")


def _environment(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES and not k.startswith("STANDIN_")}
    return {**env, **FAST_KNOBS, "HOME": str(home), "PYTHONPATH": str(REPO), **extra}


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/standin.md's make-model, once for the module (it trains a tokenizer); it writes no cache either."""
    home, folder = tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("made") / "model"
    subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(folder), "--size-mib", "1"],
                   env=_environment(home), cwd=REPO, check=True, capture_output=True, timeout=120)
    assert _files(home) == []
    return folder


def _serve_and_stop(home: Path, model: Path, log: Path, **extra: str) -> str:
    """docs/standin.md's serve command (on loopback: a shared machine), until ready; then SIGTERM. Its log."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nodetools.standin", "serve", str(model), "--host", "127.0.0.1", "--port",
             str(port), "--max-model-len", "8192", "--enable-prompt-tokens-details"],
            stdout=out, stderr=subprocess.STDOUT, env=_environment(home, **extra), cwd=REPO)
    server = Standin(proc, port, log)
    try:
        server.wait_ready()
    finally:
        assert server.stop() == 0, server.log()
    return server.log()


def test_started_as_documented_it_keeps_its_caches_out_of_a_real_engines(model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = _serve_and_stop(home, model, tmp_path / "first.log")

    assert not (home / ".cache" / "vllm").exists()
    assert not (home / ".cache" / "flashinfer").exists()
    own = home / ".cache" / "nodetools-standin"
    assert {p.relative_to(home).parts[:3] for p in _files(home)} <= {(".cache", "nodetools-standin", "vllm"),
                                                                     (".cache", "nodetools-standin", "jit")}
    compile_dir = COMPILE_DIR.search(first)
    assert compile_dir and Path(compile_dir.group(1)).is_relative_to(own / "vllm" / "torch_compile_cache")
    assert (Path(compile_dir.group(1)) / "standin_graph.bin").stat().st_size > 0
    jit = JIT_LINE.search(first)
    assert jit and jit.groups() == ("miss", str(own / "jit")) and len(_files(own / "jit")) == 1

    # Its own root persists like vLLM's: a restart finds both caches warm.
    again = _serve_and_stop(home, model, tmp_path / "again.log")
    assert "from the cache, took" in again and "Compiling a graph" not in again
    assert (jit := JIT_LINE.search(again)) and jit.group(1) == "hit"


def test_the_variables_the_runner_passes_still_win(model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    caches = tmp_path / "campaign-caches"
    log = _serve_and_stop(home, model, tmp_path / "told.log", VLLM_CACHE_ROOT=str(caches / "vllm"),
                          STANDIN_JIT_DIR=str(caches / "flashinfer"))

    compile_dir = COMPILE_DIR.search(log)
    assert compile_dir and Path(compile_dir.group(1)).is_relative_to(caches / "vllm" / "torch_compile_cache")
    assert (jit := JIT_LINE.search(log)) and jit.group(2) == str(caches / "flashinfer")
    assert _files(caches / "flashinfer") and _files(home) == []


def test_xdg_cache_home_moves_its_root(model: Path, tmp_path: Path) -> None:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    log = _serve_and_stop(home, model, tmp_path / "xdg.log", XDG_CACHE_HOME=str(xdg))

    assert (jit := JIT_LINE.search(log)) and jit.group(2) == str(xdg / "nodetools-standin" / "jit")
    assert not (xdg / "vllm").exists() and not (xdg / "flashinfer").exists() and _files(home) == []
