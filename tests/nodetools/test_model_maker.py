"""The rehearsal model maker: the files vLLM would load, read back with the libraries that read them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import safetensors
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors import safe_open
from tokenizers import Tokenizer

from nodetools import model_maker
from tests.nodetools.conftest import REPO, Start

TINY = ["--preset", "qwen3-tiny"]


def _make_cli(out: Path, *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "nodetools.model_maker", str(out), *TINY, *flags, "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return json.loads(done.stdout)


def _make(out: Path, *flags: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert model_maker.main([str(out), *TINY, *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("made") / "tiny"
    return out, _make_cli(out)


@pytest.fixture(scope="module")
def tiny_model(made: tuple[Path, dict[str, Any]]) -> Path:
    """Overrides the stand-in fixtures' model (conftest): ``standin`` then serves the made model."""
    return made[0]


def _expected_tensors(cfg: dict[str, Any]) -> dict[str, list[int]]:
    """Qwen3's tensor names and shapes as transformers' Qwen3ForCausalLM declares them, from config.json."""
    h, hd, inter, vocab = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = {"model.embed_tokens.weight": [vocab, h], "model.norm.weight": [h], "lm_head.weight": [vocab, h]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [q, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, q],
            p + "self_attn.q_norm.weight": [hd],
            p + "self_attn.k_norm.weight": [hd],
            p + "mlp.gate_proj.weight": [inter, h],
            p + "mlp.up_proj.weight": [inter, h],
            p + "mlp.down_proj.weight": [h, inter],
        }
    return out


def _read_weights(folder: Path) -> dict[str, tuple[str, list[int], np.ndarray, str]]:
    """name -> (dtype, shape, float32 values, file), parsed by the safetensors library.

    ``safetensors.numpy.load_file`` cannot return BF16 (numpy has no bfloat16), so the raw tensors
    come from ``safetensors.deserialize`` (which validates the header and the offsets) and are
    widened here: a bf16 value is the upper half of a float32.
    """
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, framework="numpy") as fh:
            assert fh.metadata() == {"format": "pt"}  # transformers refuses safetensors without it
        for name, view in safetensors.deserialize(path.read_bytes()):
            raw = np.frombuffer(bytes(view["data"]), dtype="<u2").astype(np.uint32) << 16
            out[name] = (view["dtype"], view["shape"], raw.view(np.float32).reshape(view["shape"]), path.name)
    return out


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_weights_are_every_qwen3_tensor_in_bf16_with_unit_norms(made: tuple[Path, dict[str, Any]]) -> None:
    folder, result = made
    cfg = json.loads((folder / "config.json").read_text())
    weights = _read_weights(folder)
    expected = _expected_tensors(cfg)
    assert {n: w[1] for n, w in weights.items()} == expected
    assert {w[0] for w in weights.values()} == {"BF16"}
    assert not (folder / "model.safetensors.index.json").exists()
    assert result["parameters"] == sum(int(np.prod(s)) for s in expected.values())
    assert result["bytes"] == (folder / "model.safetensors").stat().st_size > result["parameters"] * 2
    for name, (_, _, values, _) in weights.items():
        if name.endswith("norm.weight"):
            assert (values == 1.0).all(), name
        else:
            assert np.isfinite(values).all() and abs(values.mean()) < 0.002, name
            assert 0.018 < values.std() < 0.022, name
    q0, q1 = weights["model.layers.0.self_attn.q_proj.weight"][2], weights["model.layers.1.self_attn.q_proj.weight"][2]
    assert not np.array_equal(q0, q1)


def test_config_is_a_complete_untied_qwen3_bf16_config(made: tuple[Path, dict[str, Any]]) -> None:
    folder, _ = made
    cfg = json.loads((folder / "config.json").read_text())
    tiny = model_maker.PRESETS["qwen3-tiny"]
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (
        cfg["hidden_size"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    ) == (
        tiny.hidden_size,
        tiny.num_hidden_layers,
        tiny.num_attention_heads,
        tiny.num_key_value_heads,
        tiny.head_dim,
        tiny.intermediate_size,
        tiny.vocab_size,
    )
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16" and cfg["hidden_act"] == "silu"
    assert cfg["use_sliding_window"] is False and cfg["sliding_window"] is None and cfg["rope_scaling"] is None
    assert cfg["max_window_layers"] == cfg["num_hidden_layers"]
    for key in ("max_position_embeddings", "rms_norm_eps", "rope_theta", "bos_token_id", "eos_token_id"):
        assert cfg[key] is not None, key
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [cfg["eos_token_id"], cfg["bos_token_id"]]


def test_tokenizer_round_trips_and_its_chat_template_renders_chatml(made: tuple[Path, dict[str, Any]]) -> None:
    folder, result = made
    cfg = json.loads((folder / "config.json").read_text())
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert result["tokenizer_vocab_size"] == tokenizer.get_vocab_size() <= cfg["vocab_size"]
    assert tokenizer.token_to_id("<|endoftext|>") == cfg["bos_token_id"]
    assert tokenizer.token_to_id("<|im_end|>") == cfg["eos_token_id"]
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_cfg["eos_token"] == "<|im_end|>"
    assert tok_cfg["model_max_length"] == cfg["max_position_embeddings"]
    assert json.loads((folder / "special_tokens_map.json").read_text())["eos_token"] == "<|im_end|>"
    text = "The page cache, the compile cache: 42 tokens!\nÜnïcödé and 漢字 too."
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode())  # trained merges, not bytes
    assert max(ids) < cfg["vocab_size"]

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders it
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    template = env.from_string(tok_cfg["chat_template"])
    prompt = template.render(messages=messages, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render(messages=messages, add_generation_prompt=False) == prompt.removesuffix(
        "<|im_start|>assistant\n"
    )
    encoded = tokenizer.encode(prompt)
    assert encoded.tokens.count("<|im_start|>") == 3 and encoded.tokens.count("<|im_end|>") == 2
    assert tokenizer.decode(encoded.ids, skip_special_tokens=False) == prompt


def test_marker_records_random_weights(made: tuple[Path, dict[str, Any]]) -> None:
    folder, result = made
    marker = json.loads((folder / "rehearsal.json").read_text())
    assert marker["random_weights"] is True and marker["maker"] == "nodetools.model_maker"
    assert marker["architecture"] == "Qwen3ForCausalLM" and marker["preset"] == "qwen3-tiny"
    assert marker["seed"] == 0 and marker["make_s"] > 0 and marker["made_at"].endswith("+00:00")
    assert marker["parameters"] == result["parameters"] and marker["bytes"] == result["bytes"]
    assert result == {**marker, "path": str(folder), "changed": True}
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny"]  # no temporary folder left


def test_same_parameters_change_nothing_and_force_remakes_the_same_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    first = _make(out, capsys=capsys)
    before = _snapshot(out)
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    tokenizer = (out / "tokenizer.json").read_text()
    again = _make(out, capsys=capsys)
    assert again["changed"] is False and again["made_at"] == first["made_at"]
    assert _snapshot(out) == before
    assert model_maker.main([str(out), *TINY]) == 0
    assert capsys.readouterr().out.startswith("unchanged")

    forced = _make(out, "--force", capsys=capsys)
    assert forced["changed"] is True
    assert _snapshot(out)["model.safetensors"] != before["model.safetensors"]
    assert hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() == digest  # same seed, same bytes
    assert (out / "tokenizer.json").read_text() == tokenizer  # and the same trained tokenizer
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_other_parameters_replace_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    _make(out, capsys=capsys)
    old = (out / "model.safetensors").read_bytes()
    bigger = _make(out, "--layers", "3", "--seed", "7", capsys=capsys)
    assert bigger["changed"] is True and bigger["spec"]["num_hidden_layers"] == 3 and bigger["seed"] == 7
    assert "model.layers.2.mlp.down_proj.weight" in _read_weights(out)
    assert (out / "model.safetensors").read_bytes()[:4096] != old[:4096]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_big_models_are_sharded_with_an_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    result = _make(out, "--vocab-size", "4096", "--max-shard-mib", "1", capsys=capsys)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    weights = _read_weights(out)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) >= 3 and files == sorted(result["files"])
    assert all(f.endswith(f"-of-{len(files):05d}.safetensors") for f in files)
    assert index["weight_map"] == {name: w[3] for name, w in weights.items()}
    assert index["metadata"]["total_size"] == result["parameters"] * 2
    assert set(weights) == set(_expected_tensors(json.loads((out / "config.json").read_text())))
    assert all((out / f).stat().st_size <= (1 << 20) + 4096 or len(_in(index, f)) == 1 for f in files)


def _in(index: dict[str, Any], file: str) -> list[str]:
    return [n for n, f in index["weight_map"].items() if f == file]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--layers", "0"], "argument --layers: must be a positive integer, got '0'"),
        (["--hidden-size", "big"], "argument --hidden-size: must be a positive integer"),
        (["--heads", "3", "--kv-heads", "2"], "--heads (3) must be a multiple of --kv-heads (2)"),
        (["--head-dim", "63"], "--head-dim (63) must be even"),
        (["--vocab-size", "100"], "--vocab-size (100) must be at least 259"),
        (["--preset", "llama-70b"], "argument --preset: invalid choice: 'llama-70b'"),
        (["--seed", "-1"], "argument --seed: must be a non-negative integer"),
    ],
)
def test_a_bad_option_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        model_maker.main([str(tmp_path / "m"), *TINY, *flags])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_a_folder_it_did_not_make_is_refused_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "real-model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"precious")
    with pytest.raises(SystemExit) as exited:
        model_maker.main([str(out), *TINY])
    assert exited.value.code == 2 and "refusing to replace it (--force replaces it)" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == b"precious"
    assert _make(out, "--force", capsys=capsys)["changed"] is True


def test_an_interrupted_make_leaves_the_old_model_and_no_half_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "m"
    _make(out, capsys=capsys)
    before = _snapshot(out)

    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(model_maker, "train_tokenizer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model_maker.main([str(out), *TINY, "--layers", "3"])
    with pytest.raises(KeyboardInterrupt):
        model_maker.main([str(tmp_path / "new"), *TINY])
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_killed_makes_temporary_folder_is_removed_by_the_next_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".m.making-{dead.pid}"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    _make(tmp_path / "m", capsys=capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_write_tokenizer_alone_writes_the_made_models_tokenizer_files(
    made: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """The engine stand-in's make-model writes its tokenizer with this: the same files make_model writes."""
    folder, result = made
    cfg = json.loads((folder / "config.json").read_text())
    size = model_maker.write_tokenizer(tmp_path, cfg["vocab_size"], cfg["max_position_embeddings"], seed=0)
    assert size == result["tokenizer_vocab_size"]
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), name
    with pytest.raises(model_maker.MakeError, match="vocab_size"):
        model_maker.write_tokenizer(tmp_path / "small", 100, 4096)


def test_the_engine_standin_serves_the_made_model(made: tuple[Path, dict[str, Any]], standin: Start) -> None:
    server = standin()
    response = httpx.post(
        server.url + "/v1/completions",
        timeout=10,
        json={"model": "m", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
    log = server.log.read_text()
    assert f"weights read: {made[1]['bytes']} bytes from 1 files" in log
    assert "Using max model len 4096" in log  # from the made config.json


def test_the_reference_preset_is_the_pages_0_84_b_model() -> None:
    shape = model_maker.PRESETS["qwen3-0.8b"]
    cfg = {
        "hidden_size": shape.hidden_size,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "num_hidden_layers": shape.num_hidden_layers,
    }
    assert (
        shape.hidden_size,
        shape.num_hidden_layers,
        shape.num_attention_heads,
        shape.num_key_value_heads,
        shape.head_dim,
        shape.intermediate_size,
        shape.vocab_size,
    ) == (2048, 16, 16, 8, 128, 6144, 8192)
    parameters = sum(int(np.prod(s)) for s in _expected_tensors(cfg).values())
    assert parameters == 838_932_480  # 0.84 B, 1.68 GB in bf16


def test_config_only_writes_no_weights_and_says_how_to_serve_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m"
    result = _make(out, "--config-only", capsys=capsys)
    assert not list(out.glob("*.safetensors")) and not (out / "model.safetensors.index.json").exists()
    assert result["load_format"] == "dummy" and result["bytes"] == 0 and result["spec"]["config_only"] is True
    assert set(result["files"]) == {"config.json", "generation_config.json", "tokenizer.json",
                                    "tokenizer_config.json", "special_tokens_map.json"}
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    assert _make(out, "--config-only", capsys=capsys)["changed"] is False  # complete: its files are all there
    (out / "tokenizer.json").write_text("{}")
    assert _make(out, "--config-only", capsys=capsys)["changed"] is True  # a damaged one is remade
    weighted = _make(out, capsys=capsys)  # the same shape with weights is another model
    assert weighted["changed"] is True and (out / "model.safetensors").is_file()
    assert "config_only" not in weighted["spec"]
    assert model_maker.main([str(out), *TINY, "--config-only"]) == 0
    assert "no weights: config and tokenizer only, serve it with --load-format dummy" in capsys.readouterr().out


def test_the_32b_preset_is_qwen3_32b_shaped_and_written_without_weights(tmp_path: Path) -> None:
    shape = model_maker.PRESETS["qwen3-32b"]
    assert (shape.hidden_size, shape.num_hidden_layers, shape.num_attention_heads, shape.num_key_value_heads,
            shape.head_dim, shape.intermediate_size) == (5120, 64, 64, 8, 128, 25600)
    assert shape.kv_bytes_per_token() == 2 * 64 * 8 * 128 * 2  # 256 KiB a token
    assert shape.parameters() * 2 < 141e9 / 2  # bf16 weights fit one H200 with half of it left for the KV pool
    made = _make_cli_preset(tmp_path / "m32", "qwen3-32b")
    assert made["load_format"] == "dummy" and made["parameters"] == shape.parameters() == 31_290_184_704
    assert made["kv_bytes_per_token"] == 262_144
    assert sum(p.stat().st_size for p in (tmp_path / "m32").iterdir()) < 2_000_000  # no 62 GB of weights
    config = json.loads((tmp_path / "m32" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"]) == (64, 8, 128)


def _make_cli_preset(out: Path, preset: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "nodetools.model_maker", str(out), "--preset", preset, "--json"],
                          capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout)
