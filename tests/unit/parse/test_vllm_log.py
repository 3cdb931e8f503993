"""Tests for runner.parse.vllm_log against real vLLM 0.24.0 logs and one fixture per format variant."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from runner.errors import ParseError
from runner.parse.vllm_log import ERROR_LABELS, parse_log_file, parse_log_text

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_logs"
REAL = LOGS / "real"
FIRST_START = REAL / "vllm-0.24.0-h200-first_start.log"
DISK_COLD = REAL / "vllm-0.24.0-h200-disk_cold_cache_warm.log"
EAGER = REAL / "vllm-0.24.0-h200-enforce_eager.log"
SLEEP_WAKE = REAL / "vllm-0.24.0-h200-first-start-sleep-wake.log"
OFFLOAD = REAL / "vllm-0.24.0-h200-offload_native.log"

MEASUREMENT_KEYS = (
    "weights_load_s", "model_load_s", "model_load_gib", "compile_s", "compile_cache_hit",
    "compile_cache_dir", "graph_capture_s", "graph_capture_gib", "init_engine_s", "kv_cache_tokens",
    "max_concurrency", "sleep_s", "wake_s", "sleep_freed_gib", "sleep_still_in_use_gib",
    "last_prefix_cache_hit_pct", "last_external_prefix_cache_hit_pct", "api_server_ready",
)  # fmt: skip


def _parse(path: Path) -> dict[str, Any]:
    return parse_log_file(path)


def _line(msg: str, prefix: str = "(EngineCore_DP0 pid=7) INFO 10-10 02:28:10 [x.py:1] ") -> str:
    return prefix + msg + "\n"


# ------------------------------------------------------------------------------------------------
# Real vLLM 0.24.0 logs (H200, TP1)

REAL_EXPECTED: dict[Path, dict[str, Any]] = {
    FIRST_START: {
        "vllm_version": "0.24.0",
        "weights_load_s": 0.29,
        "model_load_s": 2.985794,
        "model_load_gib": 1.57,
        "dynamo_transform_s": 5.27,
        "inductor_compile_s": 16.17,
        "compile_s": 23.58,
        "compile_cache_hit": False,
        "compile_cache_dir": "/root/.cache/vllm/torch_compile_cache/2c6261dd3a/rank_0_0/backbone",
        "profile_warmup_s": 0.28,
        "available_kv_cache_gib": 67.64,
        "kv_cache_tokens": 1108208,
        "max_concurrency": 135.28,
        "max_concurrency_req_tokens": 8192,
        "graph_capture_s": 4.0,
        "graph_capture_gib": 0.42,
        "init_engine_s": 128.2,
        "init_engine_compilation_s": 23.58,
        "api_server_ready": True,
        "enforce_eager": False,
        "first_ts": "11-29 14:43:27.000",
        "last_ts": "11-29 14:46:28.000",
        "errors": [],
        "missing": [],
    },
    DISK_COLD: {
        "weights_load_s": 1.16,
        "model_load_s": 4.275311,
        "compile_s": 24.87,
        "compile_cache_hit": False,
        "compile_cache_dir": "/root/.cache/vllm/torch_compile_cache/ba51228614/rank_0_0/backbone",
        "kv_cache_tokens": 1108528,
        "max_concurrency": 135.32,
        "graph_capture_s": 3.0,
        "init_engine_s": 40.14,
        "sleep_s": 1.128855,
        "wake_s": 0.132006,
        "sleep_freed_gib": 69.51,
        "sleep_still_in_use_gib": 1.25,
        "stats_count": 1,
        "errors": [],
        "missing": [],
    },
    EAGER: {
        "enforce_eager": True,
        "weights_load_s": 0.23,
        "model_load_s": 2.179332,
        "available_kv_cache_gib": 67.67,
        "kv_cache_tokens": 1108656,
        "max_concurrency": 135.33,
        "init_engine_s": 10.89,
        "api_server_ready": True,
        "errors": [],
        "missing": [],
    },
    SLEEP_WAKE: {
        "weights_load_s": 0.48,
        "model_load_s": 3.107895,
        "dynamo_transform_s": 6.43,
        "compile_s": 26.79,
        "compile_cache_hit": False,
        "graph_capture_s": 4.0,
        "init_engine_s": 168.71,
        "sleep_s": 1.551646,
        "wake_s": 0.112183,
        "wake_tags": ["kv_cache", "weights"],
        "sleep_freed_gib": 69.51,
        "sleep_still_in_use_gib": 1.25,
        "stats_count": 3,
        "last_prefix_cache_hit_pct": 0.0,
        "errors": [],
        "missing": [],
    },
    OFFLOAD: {
        "weights_load_s": 0.34,
        "model_load_s": 3.526946,
        "compile_s": 22.47,
        "compile_cache_hit": False,
        "available_kv_cache_gib": 67.64,
        "kv_cache_tokens": 1108208,
        "max_concurrency": 135.28,
        "graph_capture_s": 4.0,
        "init_engine_s": 42.65,
        "errors": [],
        "missing": [],
    },
}


@pytest.mark.parametrize("path", list(REAL_EXPECTED), ids=lambda p: p.stem)
def test_real_log_values(path: Path) -> None:
    result = _parse(path)
    for key, expected in REAL_EXPECTED[path].items():
        assert result.get(key) == expected, key


def test_real_enforce_eager_has_no_compile_or_graph_keys() -> None:
    result = _parse(EAGER)
    for key in (
        "compile_s",
        "compile_cache_hit",
        "compile_cache_dir",
        "graph_capture_s",
        "graph_capture_gib",
    ):
        assert key not in result


def test_real_logs_show_compile_cache_misses_only() -> None:
    """No real log shows a compile-cache hit: every start logs ``Compiling a graph ... takes``.

    ``--enable-sleep-mode`` changes the compile hash, so the "cache warm" start after the first
    start missed (gpu-vllm.md); the parser must report what the log says, not the mode's intent.
    """
    first, cold, sleep_wake = _parse(FIRST_START), _parse(DISK_COLD), _parse(SLEEP_WAKE)
    assert first["compile_cache_hit"] is False
    assert cold["compile_cache_hit"] is False
    assert first["compile_cache_dir"] != cold["compile_cache_dir"]
    assert cold["compile_cache_dir"] == sleep_wake["compile_cache_dir"]


def test_real_shutdown_errors_are_kept_apart() -> None:
    result = _parse(DISK_COLD)
    assert result["shutdown_seen"] is True
    assert result["errors"] == []
    assert result["errors_after_shutdown"] == ["engine_dead"]
    assert result["phase_ts"]["shutdown"] == "11-29 14:48:12.000"


def test_real_phase_timestamps_expose_the_jit_gap() -> None:
    phase_ts = _parse(FIRST_START)["phase_ts"]
    assert phase_ts["weights_load"] == "11-29 14:44:17.000"
    assert phase_ts["graph_capture"] == "11-29 14:44:48.000"
    assert phase_ts["jit_monitor"] == "11-29 14:46:26.000"
    assert phase_ts["init_engine"] == "11-29 14:46:26.000"
    assert phase_ts["api_server_ready"] == "11-29 14:46:27.000"


def test_real_stats_lines() -> None:
    result = _parse(SLEEP_WAKE)
    assert result["stats"][0] == {
        "engine": "000",
        "ts": "11-29 14:39:43.000",
        "prompt_tput_tok_s": 0.9,
        "gen_tput_tok_s": 0.3,
        "running_reqs": 0,
        "waiting_reqs": 0,
        "kv_usage_pct": 0.0,
        "prefix_hit_pct_rolling1000": 0.0,
    }
    assert [s["prompt_tput_tok_s"] for s in result["stats"]] == [0.9, 1.5, 1.5]
    assert "last_external_prefix_cache_hit_pct" not in result


def test_real_sleep_events() -> None:
    result = _parse(SLEEP_WAKE)
    assert result["sleep_events"] == [
        {"event": "sleep", "s": 1.551646, "ts": "11-29 14:39:42.000"},
        {"event": "wake", "s": 0.112183, "tags": ["kv_cache", "weights"], "ts": "11-29 14:39:43.000"},
    ]


def test_text_and_file_agree_and_result_is_json() -> None:
    text = FIRST_START.read_text(encoding="utf-8")
    from_text = parse_log_text(text, source=str(FIRST_START))
    assert from_text == _parse(FIRST_START)
    json.dumps(from_text)


def test_gzip_log(tmp_path: Path) -> None:
    gz = tmp_path / "vllm.log.gz"
    gz.write_bytes(gzip.compress(FIRST_START.read_bytes()))
    assert parse_log_file(gz) == _parse(FIRST_START)


# ------------------------------------------------------------------------------------------------
# Format variants


def test_tp2_takes_max_durations_and_min_capacities() -> None:
    result = _parse(LOGS / "v1_tp2_separate_kv_lines.log")
    assert result["tensor_parallel_size"] == 2
    assert result["weights_load_s"] == 12.25
    assert result["model_load_s"] == 14.5
    assert result["model_load_gib"] == 30.6001
    assert result["dynamo_transform_s"] == 6.3
    assert result["inductor_compile_s"] == 21.4
    assert result["compile_s"] == 28.0  # "torch.compile takes ... in total"
    assert result["compile_cache_hit"] is False
    assert result["compile_cache_dir"].endswith("/rank_0_0/backbone")
    assert result["available_kv_cache_gib"] == 49.9
    assert result["kv_cache_tokens"] == 451744  # "451,744"
    assert result["max_concurrency"] == 55.14
    assert result["max_concurrency_req_tokens"] == 8192
    assert result["graph_capture_s"] == 13.0
    assert result["graph_capture_gib"] == 0.55
    assert result["init_engine_s"] == 61.23
    assert result["api_server_ready"] is True
    assert result["missing"] == []


def test_tp2_millisecond_timestamps() -> None:
    result = _parse(LOGS / "v1_tp2_separate_kv_lines.log")
    assert result["ts_has_ms"] is True
    assert result["first_ts"] == "09-23 18:11:02.101"
    assert result["last_ts"] == "09-23 18:13:17.010"
    assert result["phase_ts"]["weights_load"] == "09-23 18:11:45.270"
    assert result["phase_ts"]["graph_capture"] == "09-23 18:12:44.900"


def test_stats_with_external_rate_and_idle_debug_line() -> None:
    result = _parse(LOGS / "v1_tp2_separate_kv_lines.log")
    stats = result["stats"]
    assert result["stats_count"] == 3
    assert "external_prefix_hit_pct_rolling1000" not in stats[0]
    assert stats[1]["external_prefix_hit_pct_rolling1000"] == 22.0
    assert stats[2] == {  # logged at DEBUG when idle
        "engine": "000",
        "ts": "09-23 18:13:17.010",
        "prompt_tput_tok_s": 0.0,
        "gen_tput_tok_s": 0.0,
        "running_reqs": 0,
        "waiting_reqs": 0,
        "kv_usage_pct": 0.0,
        "prefix_hit_pct_rolling1000": 51.0,
        "external_prefix_hit_pct_rolling1000": 25.5,
    }
    assert result["last_prefix_cache_hit_pct"] == 51.0
    assert result["last_external_prefix_cache_hit_pct"] == 25.5


def test_merged_kv_line_and_aot_cache_hit() -> None:
    result = _parse(LOGS / "v1_merged_kv_aot_hit.log")
    assert result["kv_cache_tokens"] == 1108528
    assert result["max_concurrency"] == 135.32
    assert result["model_load_gib"] == 1.57  # "GiB memory and"
    assert result["model_load_s"] == 2.91
    assert result["compile_cache_hit"] is True
    assert result["compile_s"] == 2.1
    assert "compile_cache_load_s" not in result  # the AOT line has no duration
    assert result["missing"] == []


def test_compile_range_cache_hit() -> None:
    result = _parse(LOGS / "v1_compile_range_hit.log")
    assert result["compile_cache_hit"] is True
    assert result["compile_cache_load_s"] == 1.234
    assert result["compile_s"] == 6.81
    assert result["init_engine_s"] == 14.52
    assert result["init_engine_compilation_s"] == 6.81
    assert "inductor_compile_s" not in result


def test_unbracketed_prefix_and_dynamic_shape_hit() -> None:
    result = _parse(LOGS / "v1_no_brackets_dynamic_shape_hit.log")
    assert result["vllm_version"] == "0.8.5"
    assert result["weights_load_s"] == 0.12
    assert result["compile_cache_hit"] is True
    assert result["compile_cache_load_s"] == 0.777  # two graphs of one process: 0.456 + 0.321
    assert result["compile_s"] == 3.3
    assert result["kv_cache_tokens"] == 1932960
    assert result["graph_capture_s"] == 9.0
    assert result["stats"] == [
        {
            "ts": "05-10 02:27:51.000",
            "prompt_tput_tok_s": 35.2,
            "gen_tput_tok_s": 120.4,
            "running_reqs": 3,
            "waiting_reqs": 0,
            "kv_usage_pct": 0.4,
            "prefix_hit_pct_rolling1000": 33.3,
        }
    ]
    assert result["missing"] == []


def test_v0_legacy_log() -> None:
    result = _parse(LOGS / "v0_legacy.log")
    assert result["vllm_version"] == "0.6.3.post1"
    assert result["model_load_gib"] == 14.9888  # "Loading model weights took 14.9888 GB"
    assert "model_load_s" not in result
    assert "weights_load_s" not in result
    assert result["memory_profiling_s"] == 4.21
    assert result["gpu_blocks"] == 27904
    assert result["cpu_blocks"] == 2048
    assert result["max_concurrency"] == 13.62
    assert result["max_concurrency_req_tokens"] == 32768
    assert result["graph_capture_s"] == 23.0
    assert "graph_capture_gib" not in result
    assert result["init_engine_s"] == 29.91
    # The "set 'enforce_eager=True'" hint in a cudagraph line is not eager evidence.
    assert result["enforce_eager"] is False
    # No torch.compile in V0, and "# GPU blocks" stands for the KV capacity.
    assert result["missing"] == ["weights_load_s", "model_load_s"]


def test_v0_stats_lines() -> None:
    result = _parse(LOGS / "v0_legacy.log")
    assert result["stats"][0] == {
        "ts": "10-10 02:28:10.000",
        "prompt_tput_tok_s": 2082.8,
        "gen_tput_tok_s": 194.4,
        "running_reqs": 3,
        "swapped_reqs": 0,
        "waiting_reqs": 1,  # "Pending: 1 reqs"
        "kv_usage_pct": 4.8,
        "cpu_kv_usage_pct": 0.0,
        "gpu_prefix_hit_pct_v0": 52.36,  # from the separate "Prefix cache hit rate: GPU:" line
        "cpu_prefix_hit_pct_v0": 0.0,
    }
    assert result["stats_count"] == 2
    assert result["last_prefix_cache_hit_pct"] == 79.73


def test_docker_compose_ansi_crlf_nested_prefixes() -> None:
    path = LOGS / "docker_compose_ansi_crlf.log"
    assert b"\x1b[" in path.read_bytes()
    assert b"\r\n" in path.read_bytes()
    result = _parse(path)
    assert "\x1b" not in json.dumps(result)
    assert result["weights_load_s"] == 0.48
    assert result["model_load_s"] == 3.107895
    assert result["kv_cache_tokens"] == 1108656
    assert result["init_engine_s"] == 10.89
    assert result["enforce_eager"] is True
    assert result["api_server_ready"] is True
    assert result["first_ts"] == "10-10 02:28:10.123"
    assert result["last_ts"] == "10-10 02:29:07.000"  # a line without a [file:line] tag
    assert [s["prompt_tput_tok_s"] for s in result["stats"]] == [0.0, 1234.5]
    assert result["stats"][1]["ts"] == "10-10 02:29:06.512"
    assert result["missing"] == []  # eager: neither compile nor graph capture expected


def test_dp_engines_and_aggregated_stats() -> None:
    result = _parse(LOGS / "dp2_engines.log")
    assert [s["engine"] for s in result["stats"]] == ["000", "001", "aggregated"]
    assert result["stats"][2]["running_reqs"] == 9
    assert result["last_prefix_cache_hit_pct"] == 45.5
    assert result["last_external_prefix_cache_hit_pct"] == 5.0


def test_sleep_wake_cycles() -> None:
    result = _parse(LOGS / "sleep_wake_cycles.log")
    assert result["sleep_s"] == 0.61
    assert result["wake_s"] == 0.25
    assert "wake_tags" not in result  # the last wake has no tags
    assert result["sleep_freed_gib"] == 12.4
    assert result["sleep_still_in_use_gib"] == 1.2
    events = result["sleep_events"]
    assert [(e["event"], e["s"]) for e in events] == [
        ("sleep", 0.51),
        ("wake", 0.2),
        ("wake", 0.3),
        ("sleep", 0.61),
        ("wake", 0.25),
    ]
    assert events[1]["tags"] == ["weights"]
    assert events[2]["tags"] == ["kv_cache"]


def test_fragment_without_startup_omits_keys_and_expects_nothing() -> None:
    result = _parse(LOGS / "sleep_wake_cycles.log")
    for key in ("weights_load_s", "model_load_s", "compile_s", "compile_cache_hit", "kv_cache_tokens"):
        assert key not in result
    assert result["missing"] == []
    assert result["stats"] == []
    assert result["stats_count"] == 0
    assert "last_prefix_cache_hit_pct" not in result


SLEEP_FREED = "Sleep mode freed 12.34 GiB memory, 1.23 GiB memory is still in use."

PREFIXES = [
    "INFO 10-10 02:28:10 [core.py:123] ",
    "INFO 10-10 02:28:10 core.py:123] ",
    "INFO 10-10 02:28:10 ",
    "DEBUG 10-10 02:28:10 [core.py:123] ",
    "(EngineCore_DP0 pid=123) INFO 10-10 02:28:10 [core.py:123] ",
    "(EngineCore pid=6113) INFO 10-10 02:28:10 [core.py:123] ",
    "(APIServer pid=1) (EngineCore pid=7) INFO 10-10 02:28:10 [core.py:123] ",
    "(Worker_TP0 pid=57) INFO 10-10 02:28:10 [core.py:123] ",
    "(VllmWorker rank=0 pid=57) INFO 10-10 02:28:10 [core.py:123] ",
    "vllm-1  | INFO 10-10 02:28:10 [core.py:123] ",
    "vllm-1  | (APIServer pid=1) INFO 10-10 02:28:10 [core.py:123] ",
    "2025-10-10T02:28:10.123456789Z INFO 10-10 02:28:10 [core.py:123] ",
    "Oct 10 02:28:10 gpu01 vllm[123]: INFO 10-10 02:28:10 [core.py:123] ",
    "\x1b[32mINFO\x1b[0m 10-10 02:28:10 [core.py:123] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_line_prefixes_of_every_era(prefix: str) -> None:
    result = parse_log_text(_line("Loading weights took 1.50 seconds", prefix))
    assert result["weights_load_s"] == 1.5
    assert result["first_ts"] == "10-10 02:28:10.000"
    assert result["phase_ts"]["weights_load"] == "10-10 02:28:10.000"


def test_first_and_last_ts_far_from_the_ends() -> None:
    junk = "Traceback line without any vLLM prefix at all\n" * 20000  # ~1 MB
    text = (
        junk
        + _line("Loading weights took 1.00 seconds", "\x1b[32mINFO\x1b[0m 10-10 02:28:10 [x.py:1] ")
        + _line("Model loading took 1.00 GiB and 2.00 seconds", "INFO 10-10 02:28:12.250 [x.py:1] ")
        + junk
    )
    result = parse_log_text(text)
    assert result["first_ts"] == "10-10 02:28:10.000"
    assert result["last_ts"] == "10-10 02:28:12.250"
    assert result["ts_has_ms"] is False  # decided by the first line


@pytest.mark.parametrize(
    ("raw", "normalised", "has_ms"),
    [
        ("02:28:10", "10-10 02:28:10.000", False),
        ("02:28:10.123", "10-10 02:28:10.123", True),
        ("02:28:10.123456", "10-10 02:28:10.123", True),
        ("02:28:10,5", "10-10 02:28:10.500", True),
    ],
)
def test_timestamp_forms(raw: str, normalised: str, has_ms: bool) -> None:
    text = _line("Loading weights took 1.00 seconds", f"INFO 10-10 {raw} [x.py:1] ")
    result = parse_log_text(text)
    assert result["first_ts"] == normalised
    assert result["phase_ts"]["weights_load"] == normalised
    assert result["ts_has_ms"] is has_ms


@pytest.mark.parametrize(
    ("msg", "key", "value"),
    [
        ("torch.compile took 3.50 s in total", "compile_s", 3.5),
        ("torch.compile takes 3.50 s in total", "compile_s", 3.5),
        ("Model loading took 7.1 GiB memory and 13.0 seconds", "model_load_s", 13.0),
        ("Model loading took 7.1 GiB and 13.0 seconds", "model_load_gib", 7.1),
        ("Loading model weights took 14.9595 GB", "model_load_gib", 14.9595),
        ("GPU KV cache size: 451,744 tokens", "kv_cache_tokens", 451744),
        ("Maximum concurrency for 8,192 tokens per request: 55.14x", "max_concurrency", 55.14),
        ("GPU KV cache size: 451,744 tokens, Maximum concurrency for 8,192 tokens per request: 55.14x",
         "max_concurrency", 55.14),
        ("Graph capturing finished in 12 secs, took 0.51 GiB", "graph_capture_s", 12.0),
        ("Graph capturing finished in 1 sec, took 0.51 GiB", "graph_capture_gib", 0.51),
        ("init engine (profile, create kv cache, warmup model) took 85.31 seconds", "init_engine_s", 85.31),
        ("init engine (profile, create kv cache, warmup model) took 85.31 s (compilation: 20.00 s)",
         "init_engine_compilation_s", 20.0),
        ("Dynamo bytecode transform time: 6.10 s", "dynamo_transform_s", 6.1),
        ("Available KV cache memory: 50.10 GiB", "available_kv_cache_gib", 50.1),
        ("Memory profiling takes 4.21 seconds", "memory_profiling_s", 4.21),
        ("Initial profiling/warmup run took 0.43 s", "profile_warmup_s", 0.43),
        ("It took 0.51 seconds to fall asleep.", "sleep_s", 0.51),
        ("It took 0.112183 seconds to wake up tags {'weights', 'kv_cache'}.", "wake_s", 0.112183),
        ("It took 0.2 seconds to wake up tags ['weights'].", "wake_tags", ["weights"]),
        ("It took 0.2 seconds to wake up.", "wake_s", 0.2),
        (SLEEP_FREED, "sleep_freed_gib", 12.34),
        (SLEEP_FREED, "sleep_still_in_use_gib", 1.23),
        ("Using cache directory: /c/torch_compile_cache/ab/rank_0_0 for vLLM's torch.compile",
         "compile_cache_dir", "/c/torch_compile_cache/ab/rank_0_0"),
        ("vLLM's torch.compile cache is disabled.", "compile_cache_disabled", True),
        ("Compiling a graph for dynamic shape takes 20.10 s", "compile_cache_hit", False),
        ("Compiling a graph for shape 8 takes 2.50 s", "inductor_compile_s", 2.5),
        ("Compiling a graph for compile range (1, 8192) takes 16.98 s", "inductor_compile_s", 16.98),
        ("Directly load the compiled graph(s) for dynamic shape from the cache, took 3.456 s",
         "compile_cache_hit", True),
        ("Directly load the compiled graph for shape 8 from the cache", "compile_cache_hit", True),
        ("Directly load AOT compilation from path /root/.cache/vllm/x/model", "compile_cache_hit", True),
        ("Starting vLLM API server on http://0.0.0.0:8000", "api_server_ready", True),
        ("Starting vLLM server on http://0.0.0.0:8000", "api_server_ready", True),
        ("Available routes are:", "api_server_ready", True),
        ("vLLM API server version 0.9.2", "vllm_version", "0.9.2"),
    ],
)  # fmt: skip
def test_message_variants(msg: str, key: str, value: object) -> None:
    result = parse_log_text(_line(msg))
    assert result[key] == value


def test_compile_miss_then_hit_is_a_hit() -> None:
    text = _line("Compiling a graph for shape 8 takes 2.50 s") + _line(
        "Directly load the compiled graph(s) for shape 16 from the cache, took 0.100 s"
    )
    assert parse_log_text(text)["compile_cache_hit"] is True


def test_inductor_compile_sums_per_process_then_max() -> None:
    tp0 = "(Worker_TP0 pid=1) INFO 10-10 02:28:10 [b.py:1] "
    tp1 = "(Worker_TP1 pid=2) INFO 10-10 02:28:12 [b.py:1] "
    text = (
        _line("Compiling a graph for shape 1 takes 2.00 s", tp0)
        + _line("Compiling a graph for shape 2 takes 3.00 s", tp0)
        + _line("Compiling a graph for shape 1 takes 4.00 s", tp1)
    )
    assert parse_log_text(text)["inductor_compile_s"] == 5.0


def test_uvicorn_startup_line_sets_api_ready() -> None:
    uvicorn = "(APIServer pid=1) INFO:     Application startup complete.\n"
    text = _line("Loading weights took 1.00 seconds") + uvicorn
    result = parse_log_text(text)
    assert result["api_server_ready"] is True
    assert "api_server_ready" not in result["missing"]


# ------------------------------------------------------------------------------------------------
# missing


def test_missing_lists_phases_of_a_truncated_start() -> None:
    lines = FIRST_START.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "Model loading took" in line)
    result = parse_log_text("".join(lines[: cut + 1]))
    assert result["weights_load_s"] == 0.29
    assert result["missing"] == [
        "compile",
        "graph_capture_s",
        "init_engine_s",
        "kv_cache_tokens",
        "api_server_ready",
    ]
    assert "compile_cache_hit" not in result


def test_eager_from_non_default_args_skips_compile_and_graph() -> None:
    api = "(APIServer pid=1) INFO 10-10 02:28:00 [a.py:1] "
    text = (
        _line("non-default args: {'model': '/m', 'enforce_eager': True}", api)
        + _line("Loading weights took 1.00 seconds")
        + _line("Model loading took 1.00 GiB and 2.00 seconds")
        + _line("GPU KV cache size: 1,000 tokens")
        + _line("init engine (profile, create kv cache, warmup model) took 5.00 seconds")
        + _line("Starting vLLM server on http://0.0.0.0:8000", api)
    )
    result = parse_log_text(text)
    assert result["enforce_eager"] is True
    assert result["missing"] == []


def test_without_eager_evidence_compile_and_graph_are_missing() -> None:
    text = _line("non-default args: {'model': '/m'}") + _line("Loading weights took 1.00 seconds")
    missing = parse_log_text(text)["missing"]
    assert "compile" in missing
    assert "graph_capture_s" in missing


# ------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("worker_died.log", ["engine_core_died", "worker_died"]),
        ("cuda_oom_startup.log", ["cuda_oom", "engine_core_failed"]),
        ("kv_spec_unify.log", ["engine_core_failed", "kv_spec_unify"]),
        ("kv_spec_unify_old.log", ["engine_core_failed", "kv_spec_unify"]),
        ("engine_core_fatal.log", ["cuda_error", "engine_core_fatal", "engine_dead"]),
        ("oom_killer.log", ["oom_killer"]),
    ],
)
def test_error_fixtures(name: str, labels: list[str]) -> None:
    result = _parse(LOGS / "errors" / name)
    assert result["errors"] == labels
    assert "errors_after_shutdown" not in result


def test_runtime_fatal_error_is_not_a_failed_start() -> None:
    result = _parse(LOGS / "errors" / "engine_core_fatal.log")
    assert "engine_core_failed" not in result["errors"]
    assert result["shutdown_seen"] is True  # uvicorn "Shutting down" after the crash


def test_failed_start_lists_later_phases_as_missing() -> None:
    result = _parse(LOGS / "errors" / "cuda_oom_startup.log")
    assert result["weights_load_s"] == 18.2
    assert result["missing"] == [
        "model_load_s", "compile", "graph_capture_s", "init_engine_s", "kv_cache_tokens", "api_server_ready",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "label"),
    [
        ("Worker proc VllmWorker-0 died unexpectedly, shutting down executor.", "worker_died"),
        ("WorkerProc VllmWorker-3 died unexpectedly", "worker_died"),
        ("Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.", "engine_core_died"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom"),
        ("torch.cuda.OutOfMemoryError: out of memory", "cuda_oom"),
        ("ValueError: Failed to promote local KV cache specs to one unified type.", "kv_spec_unify"),
        ("ValueError: Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one "
         "unified type.", "kv_spec_unify"),
        ("RuntimeError: Engine core initialization failed. See root cause above.", "engine_core_failed"),
        ("EngineCore failed to start.", "engine_core_failed"),
        ("EngineCore encountered a fatal error.", "engine_core_fatal"),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "engine_dead"),
        ("MQLLMEngine is already dead, terminating server process", "engine_dead"),
        ("[4567.123456] Out of memory: Killed process 1234 (python3) total-vm:1kB", "oom_killer"),
        ("[4567.123000] python3 invoked oom-killer: gfp_mask=0x0, order=0", "oom_killer"),
        ("[4567.123100] oom-kill:constraint=CONSTRAINT_NONE,task=python3,pid=1234", "oom_killer"),
        ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
         "kv_cache_insufficient"),
        ("ValueError: To serve at least one request (2.0 GiB KV cache is needed, which is larger than the "
         "available KV cache memory (1.0 GiB).", "kv_cache_insufficient"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", "nccl_error"),
        ("OSError: [Errno 98] Address already in use", "port_in_use"),
    ],
)  # fmt: skip
def test_error_labels(line: str, label: str) -> None:
    assert label in ERROR_LABELS
    text = _line("Loading weights took 1.00 seconds") + f"(EngineCore_DP0 pid=7) {line}\n"
    assert parse_log_text(text)["errors"] == [label]
    prefixed = _line("Loading weights took 1.00 seconds") + _line(line, "ERROR 10-10 02:28:11 [core.py:1] ")
    assert parse_log_text(prefixed)["errors"] == [label]


def test_request_log_lines_are_not_parsed() -> None:
    text = _line("Starting vLLM server on http://0.0.0.0:8000") + _line(
        "Received request cmpl-1: prompt: 'Loading weights took 99 seconds; CUDA out of memory; "
        "Worker proc X died; Engine 000: Avg prompt throughput: 1.0 tokens/s', params: SamplingParams(n=1)"
    )
    result = parse_log_text(text)
    assert "weights_load_s" not in result
    assert result["errors"] == []
    assert result["stats"] == []


def test_request_log_without_vllm_prefix_is_not_parsed() -> None:
    text = _line("Starting vLLM server on http://0.0.0.0:8000") + (
        "custom | Received request cmpl-2: prompt: 'Loading weights took 99 seconds'\n"
    )
    assert "weights_load_s" not in parse_log_text(text)


def test_shutdown_marker_inside_another_message() -> None:
    text = (
        _line("Starting vLLM server on http://0.0.0.0:8000")
        + "(APIServer pid=1) Terminated [shutdown] by the runner\n"
        + "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    )
    result = parse_log_text(text)
    assert result["shutdown_seen"] is True
    assert result["errors"] == []
    assert result["errors_after_shutdown"] == ["engine_dead"]


def test_benign_warnings_give_no_error_label() -> None:
    result = _parse(FIRST_START)
    assert result["errors"] == []
    assert "errors_after_shutdown" not in result


# ------------------------------------------------------------------------------------------------
# Not a vLLM log


@pytest.mark.parametrize("name", ["services.txt", "other_app.log"])
def test_text_that_is_not_a_vllm_log(name: str) -> None:
    path = LOGS / "not_vllm" / name
    with pytest.raises(ParseError, match="no vLLM log lines found") as info:
        parse_log_file(path)
    assert info.value.path == str(path)


def test_etc_services_is_not_a_vllm_log() -> None:
    path = Path("/etc/services")
    if not path.is_file():
        pytest.skip("no /etc/services here")
    with pytest.raises(ParseError, match="no vLLM log lines found"):
        parse_log_file(path)


def test_empty_file() -> None:
    with pytest.raises(ParseError, match="empty file"):
        parse_log_file(LOGS / "not_vllm" / "empty.log")


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(ParseError, match="binary file"):
        parse_log_file(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="cannot read file") as info:
        parse_log_file(tmp_path / "nope.log")
    assert info.value.path.endswith("nope.log")
    with pytest.raises(ParseError, match="cannot read file"):
        parse_log_file(tmp_path)


def test_parse_log_text_names_its_source() -> None:
    with pytest.raises(ParseError) as info:
        parse_log_text("hello\nworld\n", source="node1:/var/log/vllm.log")
    assert info.value.path == "node1:/var/log/vllm.log"
    assert "no vLLM log lines found" in str(info.value)


def test_known_message_without_prefix_counts_as_vllm() -> None:
    result = parse_log_text("vllm | Loading weights took 2.00 seconds\n")
    assert result["weights_load_s"] == 2.0
    assert "first_ts" not in result
    assert "weights_load" not in result.get("phase_ts", {})


def test_uvicorn_lines_alone_are_not_a_vllm_log() -> None:
    with pytest.raises(ParseError):
        parse_log_text("INFO:     Application startup complete.\nINFO:     Shutting down\n")


def test_only_documented_measurement_keys_for_real_log() -> None:
    result = _parse(FIRST_START)
    for key in MEASUREMENT_KEYS:
        if key not in result:
            assert key in {
                "sleep_s", "wake_s", "sleep_freed_gib", "sleep_still_in_use_gib",
                "last_prefix_cache_hit_pct", "last_external_prefix_cache_hit_pct",
            }, key  # fmt: skip
    assert all(value is not None for value in result.values())
