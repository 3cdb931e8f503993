"""vLLM's line found wherever it sits: prefixes no wrapper names, kernel logs, a mix of formats in one file.

Fixtures under tests/fixtures/vllm_logs/wrapped/: ``cloud_export_cuda_oom.log`` is a logging
console's text export of lines cut from the real first start (vLLM 0.24.0, H200) that ends in a
CUDA OOM crash (the crash modelled on errors/cuda_oom_startup.log); ``ts_custom_timestamps.log``
is the real enforce-eager start behind a line shipper's own stamp; ``dmesg_oom_killer.log`` is a
node's kernel log with the OOM killer's report and no vLLM line.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner.errors import ParseError
from runner.parse import vllm_log
from runner.parse.log_wrappers import vllm_line_start
from runner.parse.vllm_log import parse_log_file, parse_log_text

REPO = Path(__file__).resolve().parents[3]
LOGS = REPO / "tests" / "fixtures" / "vllm_logs"
WRAPPED = LOGS / "wrapped"
REAL = LOGS / "real"
CLOUD_PREFIX = re.compile(r"^(?:INFO|ERROR) \S+Z \[resource\.labels\.containerName: vllm\] ", re.M)
SHIPPER_PREFIX = re.compile(r"^2026-11-29 \d\d:\d\d:\d\d\.\d{6} ", re.M)


def _text(path: Path) -> str:
    return path.read_bytes().decode()  # not read_text(): a "\r" inside a line stays there


def _without_wrapper(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key != "wrapper"}


def test_a_console_export_of_a_cuda_oom_start_gives_the_crash_and_the_phases() -> None:
    path = WRAPPED / "cloud_export_cuda_oom.log"
    record = parse_log_file(path)
    assert record["wrapper"] == "other-prefix"
    assert record["errors"] == ["cuda_oom", "engine_core_failed"]
    assert (record["weights_load_s"], record["compile_s"], record["vllm_version"]) == (0.29, 23.58, "0.24.0")
    assert record["phase_ts"]["weights_load"] == "11-29 14:44:17.000"
    assert (record["first_ts"], record["last_ts"]) == ("11-29 14:43:27.000", "11-29 14:44:43.000")
    assert record["missing"] == ["graph_capture_s", "init_engine_s", "kv_cache_tokens", "api_server_ready"]
    bare = parse_log_text(CLOUD_PREFIX.sub("", _text(path)))
    assert bare["wrapper"] == "none"
    assert _without_wrapper(record) == _without_wrapper(bare)


def test_a_console_export_of_the_errors_alone_is_still_a_vllm_log() -> None:
    """Filtered to ERROR, as a console user looking for the crash would: no startup line is left."""
    errors = "".join(line for line in _text(WRAPPED / "cloud_export_cuda_oom.log").splitlines(True)
                     if line.startswith("ERROR ") and " ERROR 11-29 " in line)  # fmt: skip
    record = parse_log_text(errors)
    assert record["errors"] == ["cuda_oom", "engine_core_failed"]
    assert record["first_ts"] == "11-29 14:44:43.000"


def test_a_line_shipper_s_own_timestamps_give_the_bare_record() -> None:
    path = WRAPPED / "ts_custom_timestamps.log"
    record = parse_log_file(path)
    assert record["wrapper"] == "other-prefix"
    assert record["init_engine_s"] == 10.89 and record["enforce_eager"] is True
    assert record["phase_ts"]["engine_core_start"] == "11-29 14:49:04.000"
    assert _without_wrapper(record) == _without_wrapper(parse_log_text(SHIPPER_PREFIX.sub("", _text(path))))


def test_a_kernel_log_with_the_oom_killer_gives_oom_killer() -> None:
    path = WRAPPED / "dmesg_oom_killer.log"
    record = parse_log_file(path)
    assert record["errors"] == ["oom_killer"]
    assert record["missing"] == [] and record["stats_count"] == 0 and "first_ts" not in record
    human = re.sub(r"^\[\s*\d+\.\d+\]", "[Sun Nov 29 14:50:12 2026]", _text(path), flags=re.M)  # dmesg -T
    assert parse_log_text(human)["errors"] == ["oom_killer"]
    done = subprocess.run([sys.executable, "-m", "runner", "parse-log", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "errors: ['oom_killer']" in done.stdout.splitlines()


def test_a_kernel_log_without_the_oom_killer_is_not_a_vllm_log() -> None:
    quiet = "".join(line for line in _text(WRAPPED / "dmesg_oom_killer.log").splitlines(True)
                    if "oom" not in line and "Out of memory" not in line)  # fmt: skip
    with pytest.raises(ParseError, match="no vLLM log lines found"):
        parse_log_text(quiet)


def test_vllm_lines_and_the_oom_killer_in_one_kernel_log() -> None:
    """vLLM's lines that reached the kernel log (a unit writing to kmsg), then the OOM killer."""
    lines = _text(REAL / "vllm-0.24.0-h200-first_start.log").split("\n")[:30]
    kernel = [line for line in _text(WRAPPED / "dmesg_oom_killer.log").split("\n") if line]
    text = "".join(f"[{12000 + i:5d}.{i:06d}] {line}\n" for i, line in enumerate(lines)) + "\n".join(kernel) + "\n"
    record = parse_log_text(text)
    assert record["wrapper"] == "other-prefix"
    assert record["errors"] == ["oom_killer"]
    assert record["weights_load_s"] == 0.29
    assert record["phase_ts"]["model_load"] == "11-29 14:44:18.000"


def test_one_file_that_mixes_formats_gives_the_bare_record() -> None:
    """Lines of one log as several collectors would hand them over, in turn: no wrapper fits a majority."""
    text = _text(REAL / "vllm-0.24.0-h200-first-start-sleep-wake.log")
    prefixes = ("", "vllm-1  | ", "2026-11-29T10:00:00.123456789Z ", "[ 1234.567890] ", "2026-11-29 10:00:00,123 ",
                "INFO 2026-11-29T10:00:00Z [resource.labels.containerName: vllm] ", "[pod/vllm-0/vllm] ")  # fmt: skip
    lines = text.removesuffix("\n").split("\n")
    mixed = "".join(f"{prefixes[i % len(prefixes)]}{line}\n" for i, line in enumerate(lines))
    record = parse_log_text(mixed)
    assert _without_wrapper(record) == _without_wrapper(parse_log_text(text))


@pytest.mark.parametrize(
    ("line", "start"),
    [
        ("(APIServer pid=1) INFO 11-29 14:43:27 [a.py:1] x", 0),
        ("[ 1234.567890] (EngineCore_DP0 pid=40) Loading safetensors checkpoint shards: 100%", 15),
        ("ERROR 2026-11-29T14:43:27Z [vllm] (VllmWorker rank=0 pid=7) INFO 11-29 14:43:27 x", 34),
        ("2026-11-29 14:43:27,123 WARNING 11-29 14:43:27 [a.py:1] a log without process prefixes", 24),
        ("INFO 2026-11-29 14:43:27 [x] nothing of vLLM's", -1),
        ("(APIServer pid=1) INFO 11-29 14:43:27 [a.py:1] quoted: (EngineCore pid=2) INFO 11-29 14:43:28", 0),
    ],
)
def test_vllm_line_start(line: str, start: int) -> None:
    assert vllm_line_start(line) == start


@pytest.mark.parametrize(
    "line",
    ["(a pid=1) " * 6_000, "(" + "a" * 60_000, "INFO " * 12_000, "(x" + " pid=1" * 10_000, "INFO 11-29 " * 5_000],
    ids=["process-prefixes", "open-paren", "levels", "pids", "half-stamps"],
)
def test_hostile_prefixes_parse_in_linear_time(line: str) -> None:
    text = "(APIServer pid=1) INFO 11-29 14:43:27 [a.py:1] Loading weights took 1.00 seconds\n"
    text += f"[1.0] {line} Loading weights took 2.00 seconds\n" * 4
    t0 = time.perf_counter()
    result = parse_log_text(text)
    assert time.perf_counter() - t0 < 5.0
    assert result["weights_load_s"] == 2.0


# What collectors put before vLLM's line: compose, journald, docker -t, a console's text export,
# dmesg, dmesg -T, a line shipper's stamps (one with a level and parentheses of its own).
COLLECTOR_PREFIXES = (
    "  ", "vllm-1  | ", "Nov 29 14:43:27 gpu-node-01 vllm[1234]: ", "2026-11-29T14:43:27.123456789Z ",
    "ERROR 2026-11-29T14:43:27.123456Z [resource.labels.containerName: vllm] ", "[123456.789012] ",
    "[Sat Nov 29 14:43:27 2026] ", "2026-11-29 14:43:27,123 ", "[2026-11-29 14:43:27.123] INFO (pid) ",
)  # fmt: skip


@pytest.mark.parametrize("before", COLLECTOR_PREFIXES)
def test_vllm_prefix_is_found_after_any_collector_prefix(before: str) -> None:
    """Every fixture line gives the same prefix (level, stamp, process, message) with text before it."""
    lines = [line for path in sorted(LOGS.rglob("*.log")) for line in path.read_text(errors="replace").splitlines()]
    lines += ["INFO 10-10 02:28:10 x", "WARNING 10-10 02:28:10,5 core.py:1] x",
              "(VllmWorker rank=0 pid=7) INFO 10-10 02:28:10 x"]  # fmt: skip
    found = 0
    for line in lines:
        bare, wrapped = vllm_log._vllm_prefix(line), vllm_log._vllm_prefix(before + line)
        if bare is None:
            assert wrapped is None, line
            continue
        found += 1
        assert wrapped is not None, line
        assert wrapped.groupdict() == bare.groupdict(), line
        assert wrapped.end() - len(before) == bare.end(), line
    assert found > 1000
