"""The host tier's size in tokens: from the model's config, never from a pool sized by override."""

from __future__ import annotations

import json
from pathlib import Path

from nodetools.model_shapes import engine_model_dir
from nodetools.model_shapes import read_kv_bytes_per_token as kv_bytes_per_token
from runner.execute import _envvars
from runner.experiments.offload.sizing import host_tier_tokens as _host_tier_tokens

QWEN3_08B = {"num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "hidden_size": 2048, "dtype": "bfloat16"}


def model(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_kv_bytes_per_token_from_the_config(tmp_path: Path) -> None:
    assert kv_bytes_per_token(model(tmp_path, QWEN3_08B), []) == 64 * 1024  # 2 x 16 x 8 x 128 x 2 bytes
    assert kv_bytes_per_token(tmp_path, ["--kv-cache-dtype", "fp8_e4m3"]) == 32 * 1024
    no_head_dim = {k: v for k, v in QWEN3_08B.items() if k != "head_dim"}
    assert kv_bytes_per_token(model(tmp_path, no_head_dim), []) == 64 * 1024  # hidden / heads
    assert kv_bytes_per_token(model(tmp_path, {**QWEN3_08B, "kv_lora_rank": 512}), []) is None  # MLA: not this
    assert kv_bytes_per_token(tmp_path / "absent", []) is None


def test_the_model_folder_comes_from_the_command_not_the_served_name() -> None:
    h200 = ["/opt/torch/.venv/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve",
            "/opt/gpu-campaign/models/qwen3-32b-config", "--host", "127.0.0.1", "--port", "8000",
            "--served-model-name", "rehearsal", "--load-format", "dummy"]
    assert engine_model_dir(h200) == Path("/opt/gpu-campaign/models/qwen3-32b-config")
    assert engine_model_dir(["python", "-m", "nodetools.standin", "serve", "/m", "--port", "1"]) == Path("/m")
    assert engine_model_dir(["vllm", "serve", "--model", "/m2", "--port", "1"]) == Path("/m2")
    assert engine_model_dir(["vllm", "serve", "--port", "1"]) is None


def test_the_bytes_come_from_the_served_folder_s_config(tmp_path: Path) -> None:
    folder = tmp_path / "qwen3-32b-config"
    folder.mkdir()
    model(folder, {**QWEN3_08B, "num_hidden_layers": 64})
    argv = ["python3", "-m", "vllm.entrypoints.cli.main", "serve", str(folder), "--served-model-name", "rehearsal"]
    assert kv_bytes_per_token(engine_model_dir(argv), argv) == 256 * 1024  # the 32B preset's 256 KiB a token


def test_host_tier_tokens_prefers_the_config_and_refuses_an_overridden_pool() -> None:
    # The H200 run: 5.5 GiB of host tier, 60,000-token pool forced by --num-gpu-blocks-override
    # while the log said 67.64 GiB were available for KV.
    assert _host_tier_tokens([], 5.5, 60_000, 67.64, 64 * 1024, True) == (
        90_112, "estimate from the model's KV bytes per token")
    assert _host_tier_tokens([], 5.5, 60_000, 67.64, None, True) == (0, "")
    assert _host_tier_tokens([], 5.5, 60_000, 67.64, None, False) == (4_878, "estimate from GPU bytes per token")


def test_node_programs_on_a_local_connection_import_this_checkout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", f"/tmp/site:{tmp_path}")
    assert _envvars(tmp_path)["PYTHONPATH"] == f"{tmp_path}:/tmp/site"
