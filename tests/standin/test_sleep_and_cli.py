"""Sleep mode round trips, the command line's refusals and warnings, and signal handling."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

from runner.parse.vllm_log import parse_log_file
from tests.standin.support import REPO, StandinFactory


def test_sleep_and_wake_round_trip_and_requests_fail_while_asleep(standin: StandinFactory) -> None:
    server = standin("--enable-sleep-mode")
    url = server.url
    prompt = {"prompt": "wake me up", "max_tokens": 3}
    assert httpx.get(url("/is_sleeping"), timeout=5).json() == {"is_sleeping": False}
    assert httpx.post(url("/v1/completions"), json=prompt, timeout=5).status_code == 200

    assert httpx.post(url("/sleep?level=1"), timeout=5).status_code == 200
    assert httpx.get(url("/is_sleeping"), timeout=5).json() == {"is_sleeping": True}
    asleep = httpx.post(url("/v1/completions"), json=prompt, timeout=5)
    assert asleep.status_code == 503
    assert "sleeping" in asleep.json()["error"]["message"]
    assert server.sample("vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1.0
    assert server.sample("vllm:engine_sleep_state", sleep_state="awake") == 0.0

    assert httpx.post(url("/wake_up"), timeout=5).status_code == 200
    assert httpx.get(url("/is_sleeping"), timeout=5).json() == {"is_sleeping": False}
    assert httpx.post(url("/v1/completions"), json=prompt, timeout=5).status_code == 200
    assert server.stop() == 0
    log = server.log()
    assert "Enabling cumem allocator because sleep mode requires it." in log
    assert "seconds to fall asleep." in log
    assert "Sleep mode freed " in log and "GiB memory is still in use." in log
    assert "seconds to wake up tags {" in log


def _serve(model: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "nodetools.standin", "serve", str(model), *flags],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=30, check=False)


def test_unknown_flag_is_refused_with_exit_2(model_dir: Path) -> None:
    out = _serve(model_dir, "--port", "1", "--no-such-flag", "3")
    assert out.returncode == 2
    assert "usage:" in out.stderr
    assert "error: unrecognized arguments: --no-such-flag 3" in out.stderr
    bad_knob = _serve(model_dir, "--standin-decode-s-per-token", "fast")
    assert bad_knob.returncode == 2 and "error:" in bad_knob.stderr


def test_known_unmodelled_flags_are_accepted_with_a_warning(standin: StandinFactory) -> None:
    # --enforce-eager (modelled) plus flags the stand-in only accepts; underscores work as in vLLM.
    server = standin("--enforce-eager", "--trust-remote-code", "--download-dir", "/tmp/hf",
                     "--gpu-memory-utilization", "0.5", "--max_model_len", "4096")
    out = httpx.post(server.url("/v1/completions"), json={"prompt": "eager", "max_tokens": 2}, timeout=5)
    assert out.status_code == 200
    assert server.stop(signal.SIGINT) == 0
    log = server.log()
    for flag in ("--trust-remote-code", "--download-dir", "--gpu-memory-utilization"):
        assert re.search(rf"WARNING .* flag {flag} is accepted but not modelled by the stand-in", log)
    assert "'enforce_eager': True" in log and "'max_model_len': 4096" in log
    assert "'gpu_memory_utilization': 0.5" in log
    # Eager mode skips torch.compile and CUDA graphs, and says so like vLLM.
    assert "Cudagraph is disabled under eager mode" in log
    for absent in ("Using cache directory", "torch.compile took", "Graph capturing finished"):
        assert absent not in log
    assert "[shutdown] EngineCore: trigger received signal=SIGINT" in log


def test_crash_drill_dies_like_a_vllm_worker(tmp_path: Path) -> None:
    """--standin-crash-after-requests: the log carries vLLM's worker-death lines and the exit is 1."""
    model = tmp_path / "m"
    subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(model), "--size-mib", "1"],
                   check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nodetools.standin", "serve", str(model), "--port", str(port),
                                 "--standin-crash-after-requests", "1", "--standin-compile-miss-s", "0",
                                 "--standin-jit-miss-s", "0", "--standin-graph-capture-s", "0"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        body = b'{"model": "%s", "prompt": "hi", "max_tokens": 2}' % str(model).encode()
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}), timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        assert proc.wait(timeout=10) == 1
    finally:
        proc.kill()
    assert {"worker_died", "engine_core_fatal"} <= set(parse_log_file(log)["errors"])
