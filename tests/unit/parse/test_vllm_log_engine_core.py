"""Where the EngineCore process begins in a vLLM log: ``phase_ts`` ``api_config`` and ``engine_core_start``."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from runner.parse.vllm_log import parse_log_file, parse_log_text

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_logs" / "real"


@pytest.mark.parametrize(("name", "config", "engine"), [
    ("vllm-0.24.0-h200-first_start.log", "11-29 14:43:54.000", "11-29 14:44:12.000"),
    ("vllm-0.24.0-h200-disk_cold_cache_warm.log", "11-29 14:46:57.000", "11-29 14:47:21.000"),
    ("vllm-0.24.0-h200-enforce_eager.log", "11-29 14:48:47.000", "11-29 14:49:04.000"),
])
def test_real_logs_mark_the_api_server_s_last_config_line_and_the_engine_s_first(name: str, config: str,
                                                                                 engine: str) -> None:
    stamps = parse_log_file(REAL / name)["phase_ts"]
    assert (stamps["api_config"], stamps["engine_core_start"]) == (config, engine)


def api(ts: str, msg: str) -> str:
    return f"(APIServer pid=1) INFO 11-29 10:00:{ts} [x.py:1] {msg}\n"


def test_the_engine_s_first_output_without_a_stamp_still_ends_the_config() -> None:
    text = (api("01", "non-default args: {}") + api("04", "Resolved architecture: Qwen3ForCausalLM")
            + "(EngineCore pid=7) /site/torch/cuda/__init__.py:63: FutureWarning: pynvml is deprecated\n"
            + api("06", "Supported tasks: ['generate']")
            + "(EngineCore pid=7) INFO 11-29 10:00:09 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with "
              "config: model='/m'\n")
    stamps = parse_log_text(text)["phase_ts"]
    assert stamps["api_config"] == "11-29 10:00:04.000"  # the last line before the engine's first output
    assert stamps["engine_core_start"] == "11-29 10:00:09.000"  # its first stamped line


def test_engine_core_in_a_message_is_not_the_engine_process() -> None:
    text = (api("01", "non-default args: {'note': '(EngineCore pid=3) is a prefix'}")
            + "(EngineCore_DP0 pid=8) INFO 11-29 10:00:05 [core.py:1] Initializing an LLM engine (v0.9.0) with "
              "config: x\n")
    stamps = parse_log_text(text)["phase_ts"]
    assert (stamps["api_config"], stamps["engine_core_start"]) == ("11-29 10:00:01.000", "11-29 10:00:05.000")


def test_the_engine_s_first_line_in_a_later_chunk_finds_the_config_line_in_an_earlier_one(tmp_path: Path) -> None:
    filler = api("02", "Chunked prefill is enabled with max_num_batched_tokens=8192." + "x" * 200) * 6000  # > 1 MiB
    text = (api("01", "non-default args: {}") + filler
            + "(EngineCore pid=7) INFO 11-29 10:00:20 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with "
              "config: model='/m'\n")
    path = tmp_path / "server.log.gz"
    path.write_bytes(gzip.compress(text.encode()))
    stamps = parse_log_file(path)["phase_ts"]
    assert (stamps["api_config"], stamps["engine_core_start"]) == ("11-29 10:00:02.000", "11-29 10:00:20.000")


def test_a_wrapped_log_gives_the_same_marks() -> None:
    text = (api("01", "non-default args: {}")
            + "(EngineCore pid=7) INFO 11-29 10:00:09 [core.py:114] Initializing a V1 LLM engine (v0.24.0) with "
              "config: model='/m'\n")
    wrapped = "".join(f"2026-11-29T09:00:{i:02d}.000000000Z stdout F {line}\n"
                      for i, line in enumerate(text.splitlines()))
    bare, cri = parse_log_text(text), parse_log_text(wrapped)
    assert cri["wrapper"] == "kubernetes-cri"
    assert {k: cri["phase_ts"][k] for k in ("api_config", "engine_core_start")} == {
        k: bare["phase_ts"][k] for k in ("api_config", "engine_core_start")}


def test_a_log_without_process_prefixes_has_neither_mark() -> None:
    text = ("INFO 11-29 10:00:01 [x.py:1] non-default args: {}\n"
            "INFO 11-29 10:00:05 [core.py:1] Initializing a V1 LLM engine (v0.8.0) with config: model='/m'\n")
    stamps = parse_log_text(text)["phase_ts"]
    assert "api_config" not in stamps and "engine_core_start" not in stamps
    assert stamps["engine_init_start"] == "11-29 10:00:05.000"
