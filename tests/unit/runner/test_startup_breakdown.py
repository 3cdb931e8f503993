"""The startup phase breakdown from a parsed log (real vLLM 0.24.0 log included)."""

from __future__ import annotations

from pathlib import Path

from runner.experiments.startup import breakdown
from runner.parse.vllm_log import parse_log_file

REAL = Path(__file__).resolve().parents[2] / "fixtures/vllm_logs/real"


def test_real_first_start_shows_the_kernel_jit_gap() -> None:
    log = parse_log_file(REAL / "vllm-0.24.0-h200-first_start.log")
    parts = breakdown(204.7, log)
    assert parts["compile_s"] == 23.58 and parts["graph_capture_s"] == 4.0
    assert parts["kernel_jit_s"] == 98.0  # 14:44:48 graph capture -> 14:46:26 init engine done
    assert parts["engine_other_s"] == round(128.2 - 23.58 - 4.0 - 98.0, 3)
    assert parts["other_s"] == round(204.7 - sum(v for k, v in parts.items() if k != "other_s"), 3)


def test_eager_log_has_no_compile_or_graph_phase() -> None:
    log = parse_log_file(REAL / "vllm-0.24.0-h200-enforce_eager.log")
    parts = breakdown(56.3, log)
    assert "compile_s" not in parts and "graph_capture_s" not in parts
    assert parts["other_s"] > 40  # process start, imports and the API server dominate an eager start


def test_absent_lines_are_absent_keys() -> None:
    assert breakdown(5.0, {}) == {"other_s": 5.0}
