"""Logs as users fetch them: the real vLLM logs wrapped by each log collector parse as the bare log.

The wrapped copies are made here from tests/fixtures/vllm_logs/real/ (nothing big is committed).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.errors import ParseError
from runner.parse import vllm_log
from runner.parse.log_wrappers import NONE, WRAPPERS, detect, rejoin_cri
from runner.parse.vllm_log import parse_log_file, parse_log_text

REPO = Path(__file__).resolve().parents[3]
LOGS = REPO / "tests" / "fixtures" / "vllm_logs"
REAL = sorted((LOGS / "real").glob("*.log"))


def _lines(text: str) -> list[str]:
    """The log's lines split on "\\n" only: a "\\r" (progress bar) stays inside its line, as collectors keep it."""
    return text.removesuffix("\n").split("\n")


def _ts(i: int) -> str:
    return f"2026-11-29T10:{i // 60 % 60:02d}:{i % 60:02d}.{i * 7919 % 10**9:09d}Z"


def _stream(line: str) -> str:
    return "stderr" if line.startswith("(EngineCore") else "stdout"


def cri(text: str, part: int = 700) -> str:
    """A kubelet/containerd container log file; lines longer than ``part`` become P records and an F."""
    out = []
    for i, line in enumerate(_lines(text)):
        stream = _stream(line)
        pieces = [line[at : at + part] for at in range(0, len(line), part)] or [""]
        out.extend(f"{_ts(i)} {stream} P {piece}\n" for piece in pieces[:-1])
        out.append(f"{_ts(i)} {stream} F {pieces[-1]}\n")
    return "".join(out)


def kubectl_timestamps(text: str) -> str:
    return "".join(f"{_ts(i)} {line}\n" for i, line in enumerate(_lines(text)))


def kubectl_prefix(text: str) -> str:
    return "".join(f"[pod/vllm-7d9f8b6c5-x2x4k/vllm] {line}\n" for line in _lines(text))


def kubectl_prefix_timestamps(text: str) -> str:
    return "".join(f"[pod/vllm-0/vllm] {_ts(i)} {line}\n" for i, line in enumerate(_lines(text)))


def docker_timestamps(text: str) -> str:
    return "".join(f"2026-11-29T10:00:{i % 60:02d}.{i:09d}Z {line}\n" for i, line in enumerate(_lines(text)))


def compose(text: str) -> str:
    return "".join(f"\x1b[36mvllm-1  | \x1b[0m{line}\n" for line in _lines(text))


def compose_timestamps(text: str) -> str:
    return "".join(f"vllm_server_1  | {_ts(i)} {line}\n" for i, line in enumerate(_lines(text)))


def journald_short_iso(text: str) -> str:
    return "".join(f"2026-11-29T10:00:{i % 60:02d}+0000 gpu-node-01 vllm[1234]: {line}\n"
                   for i, line in enumerate(_lines(text)))  # fmt: skip


def journald_short_iso_precise(text: str) -> str:
    head = "-- Journal begins at Mon 2026-11-23 08:00:00 UTC, ends at Sun 2026-11-29 10:10:00 UTC. --\n"
    return head + "".join(f"2026-11-29T10:00:{i % 60:02d}.{i:06d}+00:00 gpu-node-01 python3[99]: {line}\n"
                          for i, line in enumerate(_lines(text)))  # fmt: skip


def journald_short(text: str) -> str:
    return "".join(f"Nov 29 10:00:{i % 60:02d} gpu-node-01 vllm[1234]: {line}\n" for i, line in enumerate(_lines(text)))


def journald_json(text: str) -> str:
    out = []
    for i, line in enumerate(_lines(text)):
        # journald stores a message that is not plain UTF-8 text as a list of byte values
        message: Any = list(line.encode()) if "\x1b" in line or "\r" in line else line
        entry = {"__REALTIME_TIMESTAMP": str(1_764_410_400_000_000 + i), "_HOSTNAME": "gpu-node-01",
                 "SYSLOG_IDENTIFIER": "vllm", "_PID": "1234", "PRIORITY": "6", "MESSAGE": message,
                 "_CMDLINE": "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --enforce-eager"}  # fmt: skip
        out.append(json.dumps(entry) + "\n")
    return "".join(out)


def gcp_text_payload(text: str) -> str:
    out = []
    for i, line in enumerate(_lines(text)):
        stream = _stream(line)
        entry = {
            "insertId": f"id{i}",
            "resource": {"type": "k8s_container", "labels": {"container_name": "vllm", "pod_name": "vllm-0"}},
            "textPayload": line + "\n",
            "timestamp": _ts(i),
            "severity": "ERROR" if stream == "stderr" else "INFO",  # the outer level is the stream's, not vLLM's
            "logName": f"projects/p/logs/{stream}",
        }
        out.append(json.dumps(entry) + "\n")
    return "".join(out)


def gcp_json_payload(text: str) -> str:
    return "".join(
        json.dumps({"jsonPayload": {"message": line, "python_logger": "vllm"}, "timestamp": _ts(i),
                    "severity": "INFO"}, ensure_ascii=False) + "\n"
        for i, line in enumerate(_lines(text))
    )  # fmt: skip


def cloud_export(text: str) -> str:
    """A logging console's text export: the console's level (stderr is ERROR), its time, the container."""
    return "".join(f"{'ERROR' if _stream(line) == 'stderr' else 'INFO'} {_ts(i)} [resource.labels.containerName: vllm] "
                   f"{line}\n" for i, line in enumerate(_lines(text)))  # fmt: skip


def custom_timestamps(text: str) -> str:
    """A line shipper's own stamp, which holds the "MM-DD HH:MM:SS" shape of vLLM's."""
    return "".join(f"2026-11-29 10:00:{i % 60:02d},{i % 1000:03d} {line}\n" for i, line in enumerate(_lines(text)))


def bracketed_timestamps(text: str) -> str:
    return "".join(f"[2026-11-29 10:00:{i % 60:02d}.{i:06d}] [vllm] {line}\n" for i, line in enumerate(_lines(text)))


def dmesg(text: str) -> str:
    """Lines that reached the kernel log (a unit with StandardOutput=kmsg), as dmesg prints them."""
    return "".join(f"[{12_000 + i // 100:5d}.{i * 7919 % 10**6:06d}] {line}\n" for i, line in enumerate(_lines(text)))


def dmesg_human(text: str) -> str:
    return "".join(f"[Sun Nov 29 10:00:{i % 60:02d} 2026] {line}\n" for i, line in enumerate(_lines(text)))


FORMATS: dict[str, tuple[str, Callable[[str], str]]] = {
    "cri": ("kubernetes-cri", cri),
    "kubectl-timestamps": ("timestamps", kubectl_timestamps),
    "kubectl-prefix": ("kubectl-prefix", kubectl_prefix),
    "kubectl-prefix-timestamps": ("kubectl-prefix", kubectl_prefix_timestamps),
    "docker-timestamps": ("timestamps", docker_timestamps),
    "compose": ("docker-compose", compose),
    "compose-timestamps": ("docker-compose", compose_timestamps),
    "journald-short-iso": ("journald", journald_short_iso),
    "journald-short-iso-precise": ("journald", journald_short_iso_precise),
    "journald-short": ("journald", journald_short),
    "journald-json": ("journald-json", journald_json),
    "gcp-text-payload": ("gcp-logging-json", gcp_text_payload),
    "gcp-json-payload": ("gcp-logging-json", gcp_json_payload),
    "cloud-export": ("other-prefix", cloud_export),
    "custom-timestamps": ("other-prefix", custom_timestamps),
    "bracketed-timestamps": ("other-prefix", bracketed_timestamps),
    "dmesg": ("other-prefix", dmesg),
    "dmesg-human": ("other-prefix", dmesg_human),
}


def _without_wrapper(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key != "wrapper"}


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem.removeprefix("vllm-0.24.0-h200-"))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_wrapped_real_log_parses_as_the_bare_log(fmt: str, path: Path, tmp_path: Path) -> None:
    name, wrap = FORMATS[fmt]
    text = path.read_text(encoding="utf-8")
    bare = parse_log_file(path)
    assert bare["wrapper"] == "none"
    wrapped = tmp_path / f"{fmt}.log"
    wrapped.write_text(wrap(text), encoding="utf-8")
    record = parse_log_file(wrapped)
    assert record["wrapper"] == name
    assert _without_wrapper(record) == _without_wrapper(bare)


@pytest.mark.parametrize("fmt", ["cri", "gcp-text-payload", "journald-json", "compose", "cloud-export", "dmesg"])
def test_wrapped_log_streams_across_small_chunks(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CRI partial records, JSON lines and long lines split over many reads give the same record."""
    path = LOGS / "real" / "vllm-0.24.0-h200-disk_cold_cache_warm.log"
    name, wrap = FORMATS[fmt]
    wrapped = tmp_path / "wrapped.log.gz"
    wrapped.write_bytes(gzip.compress(wrap(path.read_text(encoding="utf-8")).encode()))
    expected = parse_log_file(path)
    monkeypatch.setattr(vllm_log, "_CHUNK", 977)
    record = parse_log_file(wrapped)
    assert record["wrapper"] == name
    assert _without_wrapper(record) == _without_wrapper(expected)


def test_bare_and_fixture_logs_detect_as_expected() -> None:
    for path in REAL:
        assert detect(path.read_text(encoding="utf-8").split("\n")[:64]) is NONE
    compose_fixture = (LOGS / "docker_compose_ansi_crlf.log").read_text(encoding="utf-8")
    assert detect(compose_fixture.split("\n")).name == "docker-compose"
    assert parse_log_text(compose_fixture)["wrapper"] == "docker-compose"


def test_a_bare_log_in_colour_is_bare() -> None:
    """vLLM colours its process prefix and level on a terminal: that is no collector's prefix."""
    lines = [f"\x1b[36m(APIServer pid=1)\x1b[0m \x1b[32mINFO\x1b[0m 11-29 14:43:{i:02d} [a.py:1] line {i}"
             for i in range(10)]  # fmt: skip
    assert detect(lines) is NONE
    assert detect([f"[ 12.5{i}] {line}" for i, line in enumerate(lines)]).name == "other-prefix"


def test_detection_needs_a_majority_of_lines() -> None:
    bare = [f"(APIServer pid=1) INFO 11-29 14:43:{i:02d} [a.py:1] line {i}" for i in range(10)]
    assert detect([f"{_ts(0)} {bare[0]}", *bare[1:]]) is NONE
    assert detect([f"{_ts(i)} {line}" for i, line in enumerate(bare)]).name == "timestamps"
    cri_lines = [f"{_ts(i)} stdout F {line}" for i, line in enumerate(bare[:3])]
    assert detect(["", "  ", *cri_lines]).name == "kubernetes-cri"
    assert detect([]) is NONE


def test_each_wrapper_strips_only_its_own_format() -> None:
    vllm_line = "(APIServer pid=1) INFO 11-29 14:43:27 [api_utils.py:273] non-default args: {}"
    for wrapper in WRAPPERS:
        assert wrapper.strip(vllm_line) is None, wrapper.name
    assert NONE.strip(vllm_line) == vllm_line


def test_cri_partial_records_are_joined_per_stream() -> None:
    chunk = (
        b"2026-11-29T10:00:00.1Z stdout P Loading wei\n"
        b"2026-11-29T10:00:00.2Z stderr F other stream line\n"
        b"2026-11-29T10:00:00.3Z stdout P ghts took \n"
    )
    pending: dict[bytes, bytes] = {}
    out = rejoin_cri(chunk, pending, 1 << 16)
    assert out == b"2026-11-29T10:00:00.2Z stderr F other stream line\n"
    out = rejoin_cri(b"2026-11-29T10:00:00.4Z stdout F 1.50 seconds\n", pending, 1 << 16)
    assert out == b"2026-11-29T10:00:00.4Z stdout F Loading weights took 1.50 seconds\n"
    assert pending == {}


def test_wrapped_log_without_vllm_lines_says_so(tmp_path: Path) -> None:
    other = (LOGS / "not_vllm" / "other_app.log").read_text(encoding="utf-8")
    path = tmp_path / "other.log"
    path.write_text(cri(other), encoding="utf-8")
    with pytest.raises(ParseError, match=r"no vLLM log lines found \(read as a kubernetes-cri log\)"):
        parse_log_file(path)
    path.write_text(gcp_text_payload(other), encoding="utf-8")
    with pytest.raises(ParseError, match=r"no vLLM log lines found \(read as a gcp-logging-json log\)"):
        parse_log_file(path)


def test_json_lines_that_are_not_log_entries_are_kept_raw(tmp_path: Path) -> None:
    text = FORMATS["gcp-text-payload"][1]((LOGS / "real" / "vllm-0.24.0-h200-first_start.log").read_text())
    noisy = '{"protoPayload": {"methodName": "io.k8s.core.v1.pods.create"}}\nnot json at all\n' + text
    assert _without_wrapper(parse_log_text(noisy)) == _without_wrapper(
        parse_log_file(LOGS / "real" / "vllm-0.24.0-h200-first_start.log")
    )


def test_cli_text_output_names_the_wrapper(tmp_path: Path) -> None:
    path = tmp_path / "pod.log"
    path.write_text(cri((LOGS / "real" / "vllm-0.24.0-h200-enforce_eager.log").read_text()), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "runner", "parse-log", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrapper: kubernetes-cri" in done.stdout.splitlines()
    assert "init_engine_s: 10.89" in done.stdout.splitlines()
