"""The stand-in's sleep levels against its memory: level 1 keeps the weights in a host buffer until
the wake (what a quiesced snapshot carries), level 2 keeps nothing and needs a reload of the weight
files after the wake (vLLM 0.24.0's ``POST /collective_rpc {"method": "reload_weights"}``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from nodetools.standin.cli import make_model
from tests.standin.support import Standin, StandinFactory

PROMPT = {"prompt": "after the sleep", "max_tokens": 2}
MODEL_MIB = 16


@pytest.fixture(scope="module")
def weights_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("weights-model")
    make_model(path, size_mib=MODEL_MIB, shards=2, max_position_embeddings=8192)
    return path


def shared_kib(pid: int) -> int:
    """RssShmem of a process: where the memfd backup shows."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1])
    raise AssertionError("no RssShmem line")


def weight_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.glob("*.safetensors"))


def put_to_sleep(standin: StandinFactory, model: Path, level: int, *flags: str) -> tuple[Standin, int, int]:
    """A stand-in with sleep mode put to sleep at ``level``: it, and its RssShmem (KiB) awake and asleep."""
    server = standin("--enable-sleep-mode", *flags, model=model)
    awake = shared_kib(server.proc.pid)
    assert httpx.post(server.url(f"/sleep?level={level}"), timeout=10).status_code == 200
    return server, awake, shared_kib(server.proc.pid)


def test_a_level_1_sleep_holds_the_weights_in_host_memory_until_the_wake(standin: StandinFactory,
                                                                          weights_model: Path) -> None:
    server, awake, asleep = put_to_sleep(standin, weights_model, 1)
    pid = server.proc.pid
    assert (asleep - awake) * 1024 >= 0.95 * weight_bytes(weights_model)
    assert "/memfd:standin-sleep-weights" in Path(f"/proc/{pid}/maps").read_text()
    assert httpx.post(server.url("/wake_up"), timeout=10).status_code == 200
    assert shared_kib(pid) - awake < 1024  # the buffer went with the wake
    assert httpx.post(server.url("/v1/completions"), json=PROMPT, timeout=5).status_code == 200
    assert server.stop() == 0


def test_a_level_2_sleep_keeps_nothing_and_answers_only_after_the_reload(standin: StandinFactory,
                                                                         weights_model: Path) -> None:
    server, awake, asleep = put_to_sleep(standin, weights_model, 2)
    assert asleep - awake < 1024
    assert server.sample("vllm:engine_sleep_state", sleep_state="discard_all") == 1.0
    # vLLM's level-2 wake: the weights' memory, the reload, then the KV pool (which resumes scheduling).
    assert httpx.post(server.url("/wake_up?tags=weights"), timeout=10).status_code == 200
    assert httpx.get(server.url("/is_sleeping"), timeout=5).json() == {"is_sleeping": True}
    reload = httpx.post(server.url("/collective_rpc"), json={"method": "reload_weights"}, timeout=30)
    assert reload.status_code == 200 and reload.json() == {"results": [None]}
    assert httpx.post(server.url("/wake_up?tags=kv_cache"), timeout=10).status_code == 200
    assert httpx.post(server.url("/v1/completions"), json=PROMPT, timeout=5).status_code == 200
    assert server.stop() == 0
    log = server.log()
    assert "Reloading weights inplace..." in log and "Reloading and processing weights took" in log
    assert "of which 0.00 GiB is backed up in CPU" in log


def test_without_the_reload_the_level_2_engine_says_what_is_missing(standin: StandinFactory,
                                                                    weights_model: Path) -> None:
    server, _, _ = put_to_sleep(standin, weights_model, 2)
    assert httpx.post(server.url("/wake_up"), timeout=10).status_code == 200
    missed = httpx.post(server.url("/v1/completions"), json=PROMPT, timeout=5)
    assert missed.status_code == 503 and "reload_weights" in missed.json()["error"]["message"]
    other = httpx.post(server.url("/collective_rpc"), json={"method": "save_sharded_state"}, timeout=5)
    assert other.status_code == 400 and "reload_weights only" in other.json()["error"]["message"]
    assert httpx.post(server.url("/collective_rpc"), content=b"{not json", timeout=5).status_code == 400
    assert server.stop() == 0


def test_dummy_weights_cannot_be_reloaded_as_in_vllm(standin: StandinFactory, weights_model: Path) -> None:
    server, _, _ = put_to_sleep(standin, weights_model, 2, "--load-format", "dummy")
    assert httpx.post(server.url("/wake_up"), timeout=10).status_code == 200
    refused = httpx.post(server.url("/collective_rpc"), json={"method": "reload_weights"}, timeout=5)
    assert refused.status_code == 500
    assert refused.json()["error"]["message"] == "Model reloading with `dummy` format"
    assert server.stop() == 0
