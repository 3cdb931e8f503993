"""Hostile and awkward input for ``parse_log_file`` and ``python -m runner parse-log``.

The file is checked before any read (a FIFO or device must neither hang nor eat memory), read as
a stream of bounded chunks, and every bound that drops data says so in ``truncated``.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.errors import LogInputError, ParseError, RunnerError
from runner.parse import vllm_log
from runner.parse.vllm_log import parse_log_file, parse_log_text

REPO = Path(__file__).resolve().parents[3]
LOGS = REPO / "tests" / "fixtures" / "vllm_logs"
FIRST_START = LOGS / "real" / "vllm-0.24.0-h200-first_start.log"
SLEEP_WAKE = LOGS / "real" / "vllm-0.24.0-h200-first-start-sleep-wake.log"
PREFIX = "(APIServer pid=1) INFO 11-29 14:43:27 [loggers.py:273] "


def _cli(path: Path | str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner", "parse-log", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO or /dev/zero that is read would hang or run past this
        env={**os.environ, **(env or {})},
        check=False,
    )


def _assert_one_line_error(done: subprocess.CompletedProcess[str], path: Path | str, what: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith(f"error: {path}: ")
    assert what in lines[0]


# ------------------------------------------------------------------------------------------------
# The command line: exit 2 and one line for input that is not a log


def test_cli_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "server.log"
    os.mkfifo(fifo)
    _assert_one_line_error(_cli(fifo), fifo, "a named pipe (FIFO), not a regular file")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_cli_refuses_dev_zero() -> None:
    _assert_one_line_error(_cli("/dev/zero"), "/dev/zero", "a character device, not a regular file")


def test_cli_refuses_a_directory(tmp_path: Path) -> None:
    _assert_one_line_error(_cli(tmp_path), tmp_path, "a directory, not a regular file")


def test_cli_refuses_a_missing_file(tmp_path: Path) -> None:
    _assert_one_line_error(_cli(tmp_path / "nope.log"), tmp_path / "nope.log", "cannot read file: No such file")


def test_cli_stops_a_gzip_bomb_at_the_limit(tmp_path: Path) -> None:
    """200 MB of text lines in ~200 KB of gzip; the limit is lowered to 1 MiB to keep the test fast."""
    bomb = tmp_path / "server.log.gz"
    line = b"(APIServer pid=1) INFO 11-29 14:43:27 [x.py:1] nothing to see here\n"
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        block = line * (1 << 14)
        for _ in range(200_000_000 // len(block)):
            fh.write(block)
    assert bomb.stat().st_size < 2_000_000
    done = _cli(bomb, env={vllm_log.GUNZIP_LIMIT_ENV: str(1 << 20)})
    _assert_one_line_error(done, bomb, "gzip data inflates past 1 MiB")
    assert vllm_log.GUNZIP_LIMIT_ENV in done.stderr


def _gzip_of_repeats(path: Path, line: bytes, inflated: int, block: int = 4 << 20) -> Path:
    """A gzip of ``line`` repeated to ``inflated`` bytes, built fast: one compressed member, written again and again
    (a file of several members is one gzip stream to every reader)."""
    member = gzip.compress(line * (block // len(line)), compresslevel=9)
    with path.open("wb") as fh:
        for _ in range(inflated // block):
            fh.write(member)
    return path


def test_cli_refuses_a_gzip_bomb_of_log_lines_within_seconds(tmp_path: Path) -> None:
    """17 MB on disk, 4.5 GiB of log lines inflated: refused on its ratio after 16 MiB, not parsed for minutes."""
    line = b"(APIServer pid=1) INFO 11-29 14:43:27 [loggers.py:273] Engine 000: Avg prompt throughput: 0.0 tokens/s\n"
    bomb = _gzip_of_repeats(tmp_path / "server.log.gz", line, 9 << 29)
    assert bomb.stat().st_size < 20_000_000
    t0 = time.monotonic()
    done = _cli(bomb)
    assert time.monotonic() - t0 < 30  # the whole stream takes minutes to parse
    _assert_one_line_error(done, bomb, "gzip data inflates more than 200 times (17 MiB from ")
    assert vllm_log.GUNZIP_RATIO_ENV in done.stderr


def test_gzip_ratio_bound_lets_real_logs_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle server's DEBUG stats every 10 s deflate ~85 times: read whole; repeated lines (~290 times) are not."""
    monkeypatch.setattr(vllm_log, "GUNZIP_RATIO_FLOOR", 1 << 20)  # the ratio checked after 1 MiB, not 64
    idle = "".join(
        f"(APIServer pid=1) DEBUG 11-29 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d} [loggers.py:273] Engine "
        "000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n"
        for s in range(0, 300_000, 10)
    ).encode()
    path = tmp_path / "idle.log.gz"
    path.write_bytes(gzip.compress(idle, compresslevel=9))
    assert 60 < len(idle) / path.stat().st_size < 120
    assert parse_log_file(path)["stats_count"] == 30_000
    repeats = _gzip_of_repeats(tmp_path / "repeats.log.gz", idle[: idle.index(b"\n") + 1], 8 << 20, 1 << 20)
    with pytest.raises(LogInputError, match=r"inflates more than 200 times \([\d.]+ MiB from [\d.]+ KiB"):
        parse_log_file(repeats)
    monkeypatch.setenv(vllm_log.GUNZIP_RATIO_ENV, "1000")
    assert parse_log_file(repeats)["stats_count"] == (8 << 20) // (idle.index(b"\n") + 1)


def test_cli_refuses_a_gzip_of_zeros(tmp_path: Path) -> None:
    bomb = tmp_path / "zeros.gz"
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    zeros = bytes(1 << 20)
    data = b"".join(compressor.compress(zeros) for _ in range(200)) + compressor.flush()
    bomb.write_bytes(data)
    assert len(data) < 1_000_000  # 200 MiB of zeros
    _assert_one_line_error(_cli(bomb), bomb, "binary file")


def test_cli_refuses_a_binary_file(tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 64)
    _assert_one_line_error(_cli(blob), blob, "binary file")


def test_cli_reads_a_non_utf8_log_leniently(tmp_path: Path) -> None:
    path = tmp_path / "latin1.log"
    text = FIRST_START.read_text(encoding="utf-8").replace("/tmp/model", "/tmp/modèle")
    path.write_bytes(text.encode("latin-1", errors="replace") + b"\xff\xfe garbage \x80\n")
    done = _cli(path)
    assert done.returncode == 0, done.stderr
    assert "weights_load_s: 0.29" in done.stdout.splitlines()
    assert "model: /tmp/mod\ufffdle" in done.stdout.splitlines()


# ------------------------------------------------------------------------------------------------
# The library: error types and messages


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda p: p.mkdir(), "cannot read file: a directory, not a regular file"),
        (os.mkfifo, "cannot read file: a named pipe (FIFO), not a regular file"),
        (lambda p: p.write_bytes(b""), "empty file: no vLLM log lines found"),
        (lambda p: p.write_bytes(b" \n\t\n" * 1000), "empty file: no vLLM log lines found"),
        (lambda p: p.write_bytes(b"\x00" * 300_000), "binary file"),
        (lambda p: p.write_bytes(b"\x1f\x8b\x08\x00garbage"), "corrupt gzip file"),
        (lambda p: p.write_bytes(gzip.compress(FIRST_START.read_bytes())[:3000]), "corrupt gzip file"),
    ],
    ids=["directory", "fifo", "empty", "blank", "zeros", "bad-gzip", "truncated-gzip"],
)
def test_input_errors(tmp_path: Path, make: Callable[[Path], object], what: str) -> None:
    path = tmp_path / "server.log"
    make(path)
    with pytest.raises(LogInputError) as info:
        parse_log_file(path)
    assert isinstance(info.value, ParseError) and isinstance(info.value, RunnerError)  # callers catch ParseError
    assert str(info.value) == f"{path}: {info.value.reason}"
    assert what in str(info.value)
    assert "\n" not in str(info.value)


def test_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null here")
    link = tmp_path / "server.log"
    link.symlink_to("/dev/null")
    with pytest.raises(LogInputError, match="a character device, not a regular file"):
        parse_log_file(link)


def test_binary_data_after_the_start_is_refused_not_read_to_the_end(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    text = FIRST_START.read_bytes() * 5  # past the first 64 KiB, where NUL bytes mean "binary file"
    with path.open("wb") as fh:
        fh.write(text)
        fh.truncate(len(text) + (1 << 40))  # then a sparse terabyte of zeros
    with pytest.raises(LogInputError, match="binary data after byte"):
        parse_log_file(path)


# ------------------------------------------------------------------------------------------------
# Bounds


def test_long_lines_are_cut_and_counted(tmp_path: Path) -> None:
    long_tail = "x" * (vllm_log.LINE_MAX * 3)
    text = (
        f"{PREFIX}Loading weights took 1.50 seconds {long_tail} CUDA error: late\n"  # a long line with a keyword
        + "y" * (5 << 20)  # 5 MiB with no newline: cut while reading, the rest skipped
        + " Loading weights took 99 seconds\n"
        + f"{PREFIX}Model loading took 2.00 GiB and 3.00 seconds\n"
    )
    path = tmp_path / "server.log"
    path.write_text(text, encoding="utf-8")
    result = parse_log_file(path)
    assert result["weights_load_s"] == 1.5
    assert result["model_load_s"] == 3.0
    assert result["errors"] == []  # the error was past the cut
    assert result["truncated"] == {"long_lines": 2}
    assert parse_log_text(text) == result


def test_stats_and_sleep_events_keep_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_log, "MAX_ITEMS", 3)
    lines = []
    for i in range(10):
        hit = f", Prefix cache hit rate: {i}.0%" if i < 7 else ""
        lines.append(f"{PREFIX}Engine 000: Avg prompt throughput: {i}.0 tokens/s, Running: {i} reqs{hit}\n")
        lines.append(f"{PREFIX}It took 0.{i} seconds to fall asleep.\n")
    result = parse_log_text("".join(lines))
    assert result["stats_count"] == 10
    assert [s["running_reqs"] for s in result["stats"]] == [7, 8, 9]
    assert result["last_prefix_cache_hit_pct"] == 6.0  # from a line no longer in ``stats``
    assert [e["s"] for e in result["sleep_events"]] == [0.7, 0.8, 0.9]
    assert result["sleep_s"] == 0.9
    assert result["truncated"] == {"stats": 7, "sleep_events": 7}


def test_process_sums_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_log, "MAX_PROCESSES", 2)
    text = "".join(
        f"(Worker_TP{i} pid={100 + i}) INFO 11-29 14:43:27 [b.py:1] Compiling a graph for shape 1 takes {i + 1}.00 s\n"
        for i in range(4)
    )
    result = parse_log_text(text)
    assert result["inductor_compile_s"] == 7.0  # pids 102 and 103 share the overflow sum: 3 + 4
    assert result["truncated"] == {"processes": 2}


def test_memory_stays_flat(tmp_path: Path) -> None:
    """A 16 MB log is parsed with a few MiB of Python allocations (the whole file is never held)."""
    block = FIRST_START.read_bytes() + SLEEP_WAKE.read_bytes()
    path = tmp_path / "big.log"
    with path.open("wb") as fh:
        for _ in range(16_000_000 // len(block)):
            fh.write(block)
    tracemalloc.start()
    try:
        result = parse_log_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result["stats_count"] == 3 * (16_000_000 // len(block))
    assert peak < 8 << 20, peak


def test_text_and_file_agree_on_every_fixture() -> None:
    for path in sorted(LOGS.rglob("*.log")):
        if "not_vllm" in path.parts:
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        assert parse_log_text(text, source=str(path)) == parse_log_file(path), path


def test_small_reads_give_the_same_record(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = {path: parse_log_file(path) for path in sorted(LOGS.rglob("*.log")) if "not_vllm" not in path.parts}
    monkeypatch.setattr(vllm_log, "_CHUNK", 501)
    for path, record in expected.items():
        assert parse_log_file(path) == record, path


def test_keyword_filter_drops_nothing_a_handler_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every line of every fixture, fed without the keyword filter, gives the same record."""
    expected = {path: parse_log_file(path) for path in sorted(LOGS.rglob("*.log")) if "not_vllm" not in path.parts}

    def every_line(chunk: bytes, _keywords: object = None) -> list[tuple[int, int]]:
        spans, start = [], 0
        for line in chunk.split(b"\n"):
            spans.append((start, start + len(line)))
            start += len(line) + 1
        return spans

    monkeypatch.setattr(vllm_log, "_keyword_lines", every_line)
    monkeypatch.setattr(vllm_log, "_has_keyword", lambda text: True)
    for path, record in expected.items():
        assert parse_log_file(path) == record, path


@pytest.mark.parametrize(
    "line",
    [
        "Loading weights took 1.50 seconds", "Loading model weights took 14.9 GB", "Model loading took 1 GiB and 2 s",
        "torch.compile takes 3.50 s in total", "vLLM's torch.compile cache is disabled.",
        "Dynamo bytecode transform time: 6.10 s", "Directly load AOT compilation from path /x",
        "Compiling a graph for shape 8 takes 2.50 s", "Using cache directory: /c for vLLM's torch.compile",
        "init engine (profile) took 85.31 seconds", "Initial profiling/warmup run took 0.43 s",
        "Memory profiling results: total=1 duration=4.2 s", "Available KV cache memory: 50.10 GiB",
        "GPU KV cache size: 451,744 tokens", "Maximum concurrency for 8,192 tokens per request: 55.14x",
        "# cuda blocks: 1, # CPU blocks: 2", "Graph capturing finished in 12 secs", "It took 0.2 seconds to wake up.",
        "Sleep mode freed 1 GiB memory, 1 GiB memory is still in use.", "Avg prompt throughput: 1.0",
        "Prefix cache hit rate: GPU: 1%, CPU: 0%", "Starting vLLM API server on http://x", "Available routes are:",
        "Application startup complete.", "Shutting down", "[shutdown] x", "non-default args: {}",
        "Initializing an LLM engine (v0.6.3) with config: model='m'", "vLLM API server version 0.9.2",
        "Cudagraph is disabled under eager mode", "Enforce eager set", "Kernel JIT monitor activated",
        "torch.OutOfMemoryError: x", "CUDA out of memory.", "Out of memory: Killed process 1", "invoked oom-killer",
        "oom_reaper: reaped process 1", "WorkerProc VllmWorker-3 died", "Workerproc x died",
        "Engine Core proc X died", "Enginecore proc X died", "KV cache spec to one unified type",
        "Engine core initialization failed", "EngineCore failed to start.", "EngineCore encountered a fatal error",
        "EngineDeadError", "MQLLMEngine is already dead", "No available memory for the cache blocks",
        "larger than the available KV cache memory", "CUDA error: x", "NCCL error in: x", "address already in use",
    ],
)  # fmt: skip
def test_every_handled_message_holds_a_keyword(line: str) -> None:
    assert vllm_log._has_keyword(line)
    assert vllm_log._keyword_lines(line.encode() + b"\n") == [(0, len(line.encode()))]


def test_keyword_lines_are_the_lines_that_hold_a_keyword() -> None:
    """The one-pass scan (pivot bytes translated to one) picks the same lines as a plain ``in`` per keyword,
    in every fixture, with each keyword also planted at a line's start, middle and end."""
    planted = "".join(f"{word}\nx {word} y\n- {word}" + "\n" for word in vllm_log._KEYWORDS)
    texts = [path.read_bytes() for path in sorted(LOGS.rglob("*.log"))] + [planted.encode()]
    keywords = [word.encode() for word in vllm_log._KEYWORDS]
    for text in texts:
        starts = [0, *(i + 1 for i, byte in enumerate(text) if byte == 0x0A)]
        expected = [
            (start, end)
            for start, end in zip(starts, [*(s - 1 for s in starts[1:]), len(text)], strict=True)
            if any(word in text[start:end] for word in keywords)
        ]
        assert vllm_log._keyword_lines(text) == expected
    assert vllm_log._keyword_lines(b"took\nKV cache\nshutdown\nEngine Core\n\x01\x02 " * 100) == []


def test_a_keyword_without_a_pivot_byte_is_refused_when_the_parser_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_log, "_KEYWORDS", ("Kernel panic",))
    with pytest.raises(ValueError, match="'Kernel panic' holds none of the pivot bytes"):
        vllm_log._keyword_regex()


@pytest.mark.parametrize(
    "line",
    [
        "Engine 000: Avg prompt throughput: 1.0 tokens/s, " + "A" * 60_000,  # stats fields
        "Worker proc " * 5_000,  # worker_died without "died"
        "Engine core proc " + "x" * 60_000,  # engine_core_died without "died"
        "(" * 30_000 + "Loading weights took",  # process prefixes
        "\t" * 60_000 + "Loading weights took 1.0 seconds",
        "Using cache directory: " + "/a" * 30_000,
    ],
    ids=["stats", "worker", "engine-core", "parens", "tabs", "cache-dir"],
)
def test_hostile_long_lines_parse_in_linear_time(line: str) -> None:
    text = f"{PREFIX}Loading weights took 1.00 seconds\n" + (f"{PREFIX}{line}\n" + line + "\n") * 4
    t0 = time.perf_counter()
    result = parse_log_text(text)
    assert time.perf_counter() - t0 < 5.0
    assert result["weights_load_s"] == 1.0


def test_edge_timestamps_skip_lines_that_only_look_like_them() -> None:
    noise = "".join(f"user text mentions 11-29 23:59:{i % 60:02d} but has no prefix\n" for i in range(40))
    text = (
        noise
        + "(APIServer pid=1) INFO 11-29 10:00:01 [a.py:1] first prefixed line\n"
        + "INFO:     127.0.0.1:40000 - \"POST /v1/completions HTTP/1.1\" 200 OK\n" * 50
        + "(APIServer pid=1) WARNING 11-29 10:00:02.250 [a.py:1] Loading weights took 1.00 seconds\n"
        + noise
    )
    result = parse_log_text(text)
    assert (result["first_ts"], result["last_ts"]) == ("11-29 10:00:01.000", "11-29 10:00:02.250")


@pytest.mark.parametrize("noise_lines", [20, 300, 301, 2_000, 9_000])
def test_last_timestamp_is_found_back_through_any_number_of_scan_windows(noise_lines: int) -> None:
    """Lines that have the timestamp's shape but no prefix (a line shipper's stamp before text that is not
    vLLM's) fill the end of the chunk: the last prefixed line is found however far back it is."""
    noise = "".join(f"2026-11-29 23:59:{i % 60:02d},{i % 1000:03d} Route: /v1/x{i}\n" for i in range(noise_lines))
    text = (
        f"{PREFIX}Loading weights took 1.00 seconds\n"
        + "(APIServer pid=1) INFO 11-29 10:00:02.250 [a.py:1] last prefixed line\n"
        + noise
    )
    result = parse_log_text(text)
    assert (result["first_ts"], result["last_ts"]) == ("11-29 14:43:27.000", "11-29 10:00:02.250")


def test_dropping_shutdown_keywords_after_the_first_shutdown_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "appended.log"
    path.write_bytes(b"".join(p.read_bytes() for p in sorted((LOGS / "real").glob("*.log"))) * 3)
    monkeypatch.setattr(vllm_log, "_CHUNK", 4096)
    fast = parse_log_file(path)
    monkeypatch.setattr(vllm_log, "_KW_FIND_AFTER_SHUTDOWN", vllm_log._KW_FIND)
    assert parse_log_file(path) == fast
    assert fast["shutdown_seen"] is True


def test_cli_refuses_a_kernel_file() -> None:
    # /proc/kmsg waited for the kernel's next message: parse-log hung (and took messages from syslog).
    _assert_one_line_error(_cli("/proc/self/status"), "/proc/self/status",
                           "cannot read file: a kernel file (/proc, /sys), not a regular file")


def test_cli_never_sends_a_logs_terminal_escape_to_the_terminal(tmp_path: Path) -> None:
    # A version string holding "ESC ]0;...BEL" set the terminal's title: the text output printed it raw.
    path = tmp_path / "server.log"
    path.write_bytes(b"(APIServer pid=1) INFO 11-29 14:43:27 [api_server.py:1] vLLM API server version "
                     b"\x1b]0;pwn\x07 0.24.0\n")
    done = _cli(path)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert "vllm_version: \\x1b]0;pwn\\x07" in done.stdout
