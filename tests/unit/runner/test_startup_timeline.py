"""The startup timeline: real vLLM 0.24.0 logs from an H200 with the timer's events around them.

The logs are real; the timings are made for each test (the H200 runs that wrote these logs kept no
timings.json), placed the way the borrowed machine showed them: 26 s from the start command to
the first log line, the EngineCore process 17 s before its first line."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from runner.parse.startup_timeline import PHASE_NAMES, PHASES, timeline
from runner.parse.vllm_log import parse_log_file, parse_log_text

REAL = Path(__file__).resolve().parents[2] / "fixtures/vllm_logs/real"
FIRST_START = REAL / "vllm-0.24.0-h200-first_start.log"
EAGER = REAL / "vllm-0.24.0-h200-enforce_eager.log"
DISK_COLD = REAL / "vllm-0.24.0-h200-disk_cold_cache_warm.log"
ZONE = 3600  # the node's local time is UTC+1 in these tests
PHASE_COLUMNS = {name for name, _, _ in PHASES}


def wall(stamp: str, zone_s: int = ZONE) -> float:
    """Epoch seconds of a log stamp written in local time ``zone_s`` east of UTC."""
    return datetime.strptime(f"2026-{stamp}", "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp() - zone_s


def timings_for(log: dict[str, Any], *, imports_s: float = 26.0, first_byte_s: float | None = 26.3,
                engine_early_s: float | None = 17.0, zone_s: int = ZONE, clock_zone_s: int | None = ZONE,
                after_ready_s: float = 0.7, request_s: float = 0.9) -> tuple[float, dict[str, Any]]:
    """(first_token_s, timings.json) for a start whose log is ``log``."""
    t0 = wall(log["first_ts"], zone_s) - imports_s
    ready = wall(log["phase_ts"]["api_server_ready"], zone_s) + after_ready_s - t0
    first_token = ready + request_s
    events: dict[str, float] = {"port_open": ready, "first_token": first_token}
    if first_byte_s is not None:
        events["log_first_byte"] = first_byte_s
    timings: dict[str, Any] = {"started_at": t0, "poll_s": 0.05, "events": events, "first_token_s": first_token}
    if clock_zone_s is not None:
        timings["clock"] = {"wall": t0, "utc_offset_s": clock_zone_s}
    if engine_early_s is not None:
        engine = wall(log["phase_ts"]["engine_core_start"], zone_s) - engine_early_s - t0
        timings["processes"] = [{"pid": 10, "role": "api_server", "start_s": 0.0},
                                {"pid": 11, "role": "resource_tracker", "start_s": engine - 3},
                                {"pid": 12, "role": "engine_core", "start_s": engine}]
    return first_token, timings


def test_the_shown_phases_are_the_timeline_s_phases() -> None:
    assert sorted(PHASE_NAMES) == sorted(PHASE_COLUMNS) and len(PHASE_NAMES) == len(PHASE_COLUMNS)


def named(parts: dict[str, Any]) -> float:
    return sum(v for k, v in parts.items() if k in PHASE_COLUMNS)


@pytest.mark.parametrize("path", sorted(REAL.glob("*.log")), ids=lambda p: p.name)
def test_every_real_log_is_explained_to_within_five_percent(path: Path) -> None:
    log = parse_log_file(path)
    first_token, timings = timings_for(log)
    parts = timeline(first_token, log, timings)
    assert parts["other_s"] <= 0.05 * first_token, parts
    assert named(parts) + parts["other_s"] == pytest.approx(first_token, abs=0.01)
    assert parts["timeline_resolution_s"] == 1.0  # vLLM 0.24 stamps whole seconds
    assert parts["timeline_sources"] == "timer+log+proc"
    assert all(parts[k] >= 0 for k in PHASE_COLUMNS if k in parts)


def test_first_start_phases_from_the_log_the_processes_and_the_timer() -> None:
    log = parse_log_file(FIRST_START)
    first_token, timings = timings_for(log)
    parts = timeline(first_token, log, timings)
    assert parts["api_imports_s"] == 26.3  # the timer saw the first byte inside the first line's second
    assert parts["config_s"] == round(26.0 + 27.5 - 26.3, 3)  # 14:43:27 -> 14:43:54, both mid-second
    assert parts["engine_imports_s"] == 17.5  # the EngineCore process -> its first line (mid-second)
    assert parts["engine_spawn_s"] == 0.5  # the last config line (14:43:54, mid-second) -> the process
    assert parts["weights_s"] == 2.986 and parts["compile_s"] == 23.58  # stated durations stay whole
    assert parts["kernel_jit_s"] == pytest.approx(97.5)  # graph capture (14:44:48) -> init engine (14:46:26)
    assert parts["api_ready_s"] == pytest.approx(1.2)  # init engine -> the port opened
    assert parts["first_request_s"] == pytest.approx(0.9)
    assert parts["named_fraction"] >= 0.95


def test_enforce_eager_files_the_jit_after_the_kv_allocation_under_kernel_jit() -> None:
    log = parse_log_file(EAGER)
    first_token, timings = timings_for(log)
    parts = timeline(first_token, log, timings)
    assert "compile_s" not in parts and "graph_capture_s" not in parts
    # KV cache size at 14:49:11, JIT monitor and init engine at 14:49:19: the 8 s are kernel JIT and
    # warm-up, not profiling (the old split put them under "profile, KV allocation").
    assert parts["kernel_jit_s"] == 8.0
    assert parts["kv_profile_s"] == pytest.approx(11.5 - 9.5)  # model loaded 14:49:09 -> KV 14:49:11


def test_without_process_events_the_engine_imports_span_from_the_last_config_line() -> None:
    log = parse_log_file(DISK_COLD)
    first_token, timings = timings_for(log, engine_early_s=None)
    parts = timeline(first_token, log, timings)
    assert "engine_spawn_s" not in parts
    assert parts["engine_imports_s"] == 24.0  # 14:46:57 -> 14:47:21
    assert parts["timeline_sources"] == "timer+log"
    assert parts["other_s"] <= 0.05 * first_token


def test_a_log_in_another_time_zone_is_shifted_by_the_timer_s_first_byte() -> None:
    log = parse_log_file(FIRST_START)
    first_token, timings = timings_for(log)
    expected = timeline(first_token, log, timings)
    # The engine's container logs in UTC+1, the timer's clock says UTC: the first byte disagrees by 1 h.
    timings["clock"]["utc_offset_s"] = 0
    shifted = timeline(first_token, log, timings)
    assert shifted["timeline_note"].startswith("log clock +1 h from the timer's")
    assert {k: v for k, v in shifted.items() if k != "timeline_note"} == expected


def test_a_log_clock_that_disagrees_is_not_placed_in_time() -> None:
    log = parse_log_file(FIRST_START)
    first_token, timings = timings_for(log)
    timings["clock"]["utc_offset_s"] = ZONE + 420  # 7 minutes: no time zone explains it
    parts = timeline(first_token, log, timings)
    assert parts["timeline_note"].startswith("the log's clock disagrees with the timer's by -420 s")
    assert "api_imports_s" not in parts and "kernel_jit_s" not in parts
    assert parts["first_request_s"] == pytest.approx(0.9)  # the timer's own events still count
    assert parts["other_s"] == pytest.approx(first_token - 0.9, abs=0.01)


def test_without_the_first_byte_a_log_outside_the_start_is_not_placed() -> None:
    log = parse_log_file(FIRST_START)
    first_token, timings = timings_for(log, first_byte_s=None)
    assert timeline(first_token, log, timings)["api_imports_s"] == 26.5  # the first line, mid-second
    timings["clock"]["utc_offset_s"] = 0  # a container in UTC+1: nothing tells by how much
    parts = timeline(first_token, log, timings)
    assert parts["timeline_note"].startswith("the log's first line is +3626 s from the start command")
    assert "api_imports_s" not in parts


def test_an_older_timings_file_without_a_clock_leaves_the_log_unplaced() -> None:
    log = parse_log_file(FIRST_START)
    first_token, timings = timings_for(log, clock_zone_s=None)
    parts = timeline(first_token, log, timings)
    assert parts["timeline_note"].startswith("no clock mapping in timings.json")
    assert parts["timeline_sources"] == "timer+proc"
    assert parts["other_s"] > 0.5 * first_token  # said, not hidden in a named phase


def test_milliseconds_in_the_log_give_millisecond_boundaries() -> None:
    text = "".join(f"({proc} pid={pid}) INFO 11-29 10:00:{ts} [x.py:1] {msg}\n" for proc, pid, ts, msg in (
        ("APIServer", 1, "05.250", "non-default args: {'model': '/m'}"),
        ("APIServer", 1, "05.900", "Resolved architecture: Qwen3ForCausalLM"),
        ("EngineCore", 2, "09.400", "Initializing a V1 LLM engine (v0.24.0) with config: model='/m'"),
        ("EngineCore", 2, "12.600", "Model loading took 1.57 GiB and 2.000000 seconds"),
        ("EngineCore", 2, "20.600", "torch.compile took 7.00 s in total"),
        ("EngineCore", 2, "21.100", "GPU KV cache size: 1,000 tokens"),
        ("EngineCore", 2, "23.100", "Graph capturing finished in 2 secs, took 0.42 GiB"),
        ("EngineCore", 2, "30.100", "init engine (profile, create kv cache, warmup model) took 17.50 s"),
        ("APIServer", 1, "30.300", "Starting vLLM server on http://0.0.0.0:8000"),
    ))
    log = parse_log_text(text)
    assert log["ts_has_ms"] is True
    t0 = wall("11-29 10:00:00.000")
    timings = {"started_at": t0, "clock": {"utc_offset_s": ZONE}, "poll_s": 0.05,
               "events": {"port_open": 30.5, "first_token": 30.6}}
    parts = timeline(30.6, log, timings)
    assert parts["timeline_resolution_s"] == 0.001
    assert (parts["api_imports_s"], parts["config_s"], parts["engine_imports_s"]) == (5.25, 0.65, 3.5)
    assert (parts["device_init_s"], parts["weights_s"], parts["kv_profile_s"]) == (1.2, 2.0, 1.5)
    assert (parts["compile_s"], parts["graph_capture_s"], parts["kernel_jit_s"]) == (7.0, 2.0, 7.0)
    assert (parts["api_ready_s"], parts["first_request_s"], parts["other_s"]) == (0.4, 0.1, 0.0)


def test_a_timer_event_pulls_an_earlier_boundary_back_within_its_second() -> None:
    text = "".join(f"({proc} pid=1) INFO 11-29 10:00:{ts} [x.py:1] {msg}\n" for proc, ts, msg in (
        ("APIServer", "01", "non-default args: {'model': '/m'}"),
        ("EngineCore", "02", "Initializing a V1 LLM engine (v0.24.0) with config: model='/m'"),
        ("EngineCore", "03", "GPU KV cache size: 1,000 tokens"),
        ("EngineCore", "05", "init engine (profile, create kv cache, warmup model) took 3.00 s"),
    ))
    log = parse_log_text(text)
    timings = {"started_at": wall("11-29 10:00:00.000"), "clock": {"utc_offset_s": ZONE}, "poll_s": 0.05,
               "events": {"log_first_byte": 1.1, "port_open": 5.2, "first_token": 5.3}}
    parts = timeline(5.3, log, timings)
    # "init engine" was logged in second 5 and the port opened at 5.2 s: the line came before 5.2 s,
    # not at the middle of its second; the first request keeps its 0.1 s.
    assert parts["kernel_jit_s"] == pytest.approx(5.2 - 3.5)
    assert (parts["api_ready_s"], parts["first_request_s"]) == (0.0, 0.1)


def test_boundaries_after_the_first_token_are_held_at_it() -> None:
    log = parse_log_file(FIRST_START)
    _, timings = timings_for(log)
    parts = timeline(100.0, log, timings)  # a timer that saw a token long before the log says it could
    assert named(parts) + parts["other_s"] == pytest.approx(100.0, abs=0.01)
    assert all(parts[k] >= 0 for k in PHASE_COLUMNS if k in parts)


def test_no_log_leaves_the_timer_s_phases_and_the_rest_as_other() -> None:
    parts = timeline(5.0, {}, {"poll_s": 0.05, "events": {"port_open": 4.0, "first_token": 5.0}})
    assert parts == {"first_request_s": 1.0, "other_s": 4.0, "named_fraction": 0.2, "timeline_resolution_s": 0.05,
                     "timeline_sources": "timer"}
