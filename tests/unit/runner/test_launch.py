"""The engine's launch: flags and whole launches rendered from data, per runtime and mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.experiments import launch as F
from runner.experiments.startup import RECIPES

REPO = Path(__file__).resolve().parents[3]


VLLM_DOCKER = {"kind": "vllm", "runtime": "docker", "image": "vllm/vllm-openai:v0.24.0", "model": "/mnt/data/models/q",
               "port": 8000, "gpus": [4], "args": {"max-model-len": 32768}, "env": {"VLLM_LOG_STATS_INTERVAL": "10"}}
VLLM_PROCESS = {**VLLM_DOCKER, "runtime": "process", "image": None, "venv": "/opt/vllm"}


def test_engine_argv_rules() -> None:
    assert F.engine_argv({"enforce_eager": True, "no-enable-prefix-caching": True, "seed": 0, "quantization": None,
                          "enable-sleep-mode": False, "cuda-graph-sizes": [1, 2], "kv-transfer-config":
                          {"kv_role": "kv_both", "kv_connector": "OffloadingConnector"}}) == [
        "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0", "--cuda-graph-sizes", "1", "2",
        "--kv-transfer-config", '{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}']
    with pytest.raises(ValueError, match="expected a mapping of flags, got list"):
        F.engine_argv(["--x"])


def test_docker_persistent_caches_gpus_ipc_and_mode_flags() -> None:
    launch = F.engine_launch(VLLM_DOCKER, "c1", "/mnt/data/cache", "/mnt/data/hf", RECIPES["enforce_eager"]["args"])
    assert launch["argv"] == [
        "docker", "run", "--rm", "--name", "c1", "--ipc=host", "--network=host", "--gpus", '"device=4"',
        "-v", "/mnt/data/cache/vllm:/root/.cache/vllm", "-v", "/mnt/data/cache/triton:/root/.triton",
        "-v", "/mnt/data/cache/flashinfer:/root/.cache/flashinfer",
        "-v", "/mnt/data/cache/torchinductor:/root/.cache/torchinductor",
        "-v", "/mnt/data/cache/cuda:/root/.nv/ComputeCache",
        "-v", "/mnt/data/hf:/root/.cache/huggingface", "-v", "/mnt/data/models/q:/mnt/data/models/q:ro",
        "-e", "VLLM_LOG_STATS_INTERVAL=10", "vllm/vllm-openai:v0.24.0", "/mnt/data/models/q",
        "--host", "127.0.0.1", "--port", "8000", "--max-model-len", "32768", "--enforce-eager"]
    assert launch["stop_argv"] == ["docker", "stop", "--time", "30", "c1"]
    assert launch["env"] == {}


def test_docker_fresh_container_mounts_no_cache() -> None:
    launch = F.engine_launch(VLLM_DOCKER, "c2", None, None, RECIPES["fresh_container"].get("args"))
    assert not any(a.startswith("/mnt/data/cache") for a in launch["argv"])
    assert launch["caches"] == {}


def test_process_runtime_env_carries_gpus_and_caches() -> None:
    launch = F.engine_launch(VLLM_PROCESS, "p", "/c", "/hf", RECIPES["runai_streamer"]["args"])
    assert launch["argv"] == ["/opt/vllm/bin/vllm", "serve", "/mnt/data/models/q", "--host", "127.0.0.1",
                              "--port", "8000", "--max-model-len", "32768", "--load-format", "runai_streamer"]
    assert launch["env"] == {"VLLM_LOG_STATS_INTERVAL": "10", "CUDA_VISIBLE_DEVICES": "4", "VLLM_CACHE_ROOT": "/c/vllm",
                             "TRITON_CACHE_DIR": "/c/triton", "FLASHINFER_WORKSPACE_BASE": "/c/flashinfer",
                             "TORCHINDUCTOR_CACHE_DIR": "/c/torchinductor", "CUDA_CACHE_PATH": "/c/cuda",
                             "HF_HOME": "/hf"}
    assert launch["stop_argv"] == []


def test_process_runtime_with_the_nodes_own_python() -> None:
    """vLLM installed with --target into a Python that has torch (the borrowed H200): python -m, PYTHONPATH."""
    engine = {"kind": "vllm", "runtime": "process", "model": "/m", "port": 8000,
              "python": "/opt/torch/.venv/bin/python3", "env": {"PYTHONPATH": "/opt/vllm/site"}}
    launch = F.engine_launch(engine, "p", "/c", None, {"enforce-eager": True})
    assert launch["argv"] == ["/opt/torch/.venv/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve", "/m",
                              "--host", "127.0.0.1", "--port", "8000", "--enforce-eager"]
    assert launch["env"]["PYTHONPATH"] == "/opt/vllm/site"
    assert launch["env"]["CUDA_CACHE_PATH"] == "/c/cuda"


def test_standin_runs_with_the_node_python_and_its_jit_dir() -> None:
    engine = {"kind": "stand-in", "model": "/m", "port": 18000, "served_model_name": "s", "args": {}}
    launch = F.engine_launch(engine, "x", "/c", None, RECIPES["sleep_wake"]["args"], "/venv/bin/python")
    assert launch["argv"] == ["/venv/bin/python", "-m", "nodetools.standin", "serve", "/m", "--host", "127.0.0.1",
                              "--port", "18000", "--served-model-name", "s", "--enable-sleep-mode"]
    assert launch["env"]["STANDIN_JIT_DIR"] == "/c/flashinfer" and "CUDA_VISIBLE_DEVICES" not in launch["env"]


@pytest.mark.parametrize(("engine", "message"), [
    ({"kind": "vllm", "runtime": "docker", "model": "m"}, "needs engine.image"),
    ({"kind": "stand-in", "runtime": "docker", "model": "m", "image": "i"}, "runs as a process"),
    ({"kind": "vllm", "runtime": "k8s", "model": "m"}, "unknown runtime 'k8s'"),
    ({"kind": "vllm"}, "must be a mapping with a model"),
])
def test_bad_engines_are_clear_errors(engine: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        F.engine_launch(engine, "n")


@pytest.mark.parametrize("runtime", ["docker", "process"])
@pytest.mark.parametrize("mode", sorted(RECIPES))
def test_every_mode_renders_its_caches_and_flags(mode: str, runtime: str) -> None:
    recipe = RECIPES[mode]
    engine = {**(VLLM_DOCKER if runtime == "docker" else VLLM_PROCESS), "cache_root": "/mnt/data/cache"}
    root = F.mode_cache_root(recipe["cache"], engine, "/tmp/trial/fresh-cache")
    launch = F.engine_launch(engine, "c", root, None, recipe.get("args"))
    argv = " ".join(launch["argv"])
    for flag in F.engine_argv(recipe.get("args")):
        assert flag in launch["argv"]
    expected_root = {"persistent": "/mnt/data/cache", "fresh": "/tmp/trial/fresh-cache",
                     "none": None if runtime == "docker" else "/tmp/trial/fresh-cache"}[recipe["cache"]]
    assert root == expected_root
    if runtime == "docker":
        assert ("/root/.cache/vllm" in argv) is (expected_root is not None)
        assert "--gpus" in launch["argv"] and "--ipc=host" in launch["argv"]
    else:
        assert launch["env"].get("VLLM_CACHE_ROOT") == f"{expected_root}/vllm"
        assert launch["env"]["CUDA_VISIBLE_DEVICES"] == "4"


def test_unknown_cache_mode() -> None:
    with pytest.raises(ValueError, match="unknown cache mode 'warm'"):
        F.mode_cache_root("warm", VLLM_DOCKER, "/x")
