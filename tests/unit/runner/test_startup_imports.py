"""A startup trial's import columns: the profile (real CPython output) windowed by the timer's samples
of each process's profile size, CPU seconds and storage reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.experiments.startup_imports import import_metrics, pyc_metrics
from runner.parse.importtime import read_importtime

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "importtime"
API_PID, CORE_PID = 101, 202


def _raw(tmp_path: Path) -> tuple[Path, int]:
    """importtime.txt as the timer writes it: the API server's real profile, then the EngineCore's."""
    api = (FIXTURES / "cpython311-pandas-aiohttp-pydantic.txt").read_text()
    core = (FIXTURES / "cpython311-asyncio-json.txt").read_text()
    (tmp_path / "importtime.txt").write_text(f"# process {API_PID} api_server\n{api}# process {CORE_PID} engine_core\n"
                                             f"{core}")
    return tmp_path, len(api.encode())


def _timings(api_bytes: int, half_bytes: int) -> dict[str, object]:
    # The API server's file grew to half by 1.0 s and was whole by 2.0 s, its first log line at 2.5 s;
    # the EngineCore started at 3.0 s and logged at 4.0 s.
    return {
        "events": {"log_first_byte": 2.5, "port_open": 5.0}, "poll_s": 0.05,
        "processes": [
            {"pid": API_PID, "role": "api_server", "start_s": 0.0,
             "usage": [[1.0, 0.9, 1_000_000, 5_000_000, half_bytes], [2.0, 1.8, 3_000_000, 9_000_000, api_bytes],
                       [2.5, 2.2, 3_000_000, 9_500_000, api_bytes]]},
            {"pid": CORE_PID, "role": "engine_core", "start_s": 3.0,
             "usage": [[3.5, 0.4, 0, 100, 4000], [4.0, 0.8, 2_000_000, 200, 8090]]},
        ],
    }


def _log() -> dict[str, object]:
    return {"ts_has_ms": True, "first_line": {"ts": None}}


def test_each_window_is_split_by_package_with_its_cpu_and_reads(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    raw, api_bytes = _raw(tmp_path)
    # The boundaries are the timeline's job (tested with it): fixed here.
    monkeypatch.setattr("runner.experiments.startup_imports.boundaries", lambda *_: {
        "start": 0.0, "api_first": 2.5, "engine_process": 3.0, "engine_first": 4.0, "first_token": 6.0})
    out = import_metrics(raw, _timings(api_bytes, api_bytes // 2), _log(), 6.0)
    api, core = out["imports"]["api"], out["imports"]["engine"]
    whole = read_importtime(raw / "importtime.txt")[0]
    assert api["seconds"] == 2.5 and api["cpu_s"] == pytest.approx(2.2)
    assert api["read_bytes"] == pytest.approx(3_000_000)
    # Every import of the API server finished before its first line: the window holds the whole profile.
    assert api["profiled_s"] == pytest.approx(whole.total_s, abs=0.01)
    assert list(api["packages"])[:3] == ["pandas", "stdlib", "aiohttp"]
    assert core["cpu_s"] == pytest.approx(0.8) and core["read_bytes"] == pytest.approx(2_000_000)
    assert out["import_cpu_s"] == pytest.approx(3.0) and out["import_read_mb"] == pytest.approx(5.0)
    assert out["import_top_package"] == "pandas"
    assert 0 < out["import_profiled_fraction"] <= 1.0


def test_a_window_that_ends_half_way_holds_only_what_finished_before(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    raw, api_bytes = _raw(tmp_path)
    monkeypatch.setattr("runner.experiments.startup_imports.boundaries", lambda *_: {
        "start": 0.0, "api_first": 1.0, "first_token": 6.0})
    out = import_metrics(raw, _timings(api_bytes, api_bytes // 2), _log(), 6.0)
    api = out["imports"]["api"]
    whole = read_importtime(raw / "importtime.txt")[0]
    assert 0 < api["profiled_s"] < whole.total_s  # the first half of the file only
    assert "engine" not in out["imports"]  # no EngineCore boundary: no window, never a zero


def test_no_profile_no_import_columns(tmp_path: Path) -> None:
    assert import_metrics(tmp_path, {"processes": []}, _log(), 5.0) == {}


def test_bytecode_columns_say_how_many_modules_lacked_a_pyc_and_why() -> None:
    before = {"bytecode": {"packages": {
        "vllm": {"modules": 1000, "current": 1000, "reasons": {}, "writable": True},
        "torch": {"modules": 4000, "current": 2800, "reasons": {"stale": 1000, "no_pycache_dir": 200},
                  "writable": False},
        "flashinfer": {"error": "flashinfer is not importable"}}},
        "bytecode_compiled": {"compiled": True, "seconds": 41.5}}
    out = pyc_metrics(before)
    assert out["pyc_missing_modules"] == 1200
    assert out["pyc_packages"]["torch"]["reasons"] == {"stale": 1000, "no_pycache_dir": 200}
    assert "flashinfer" not in out["pyc_packages"] and out["bytecode_compile_s"] == 41.5


def test_the_summary_names_the_costliest_packages_not_the_first_in_name_order() -> None:
    """trial.json is written with sorted keys: the packages come back in name order (cv2, networkx,
    numpy, ... torch), and the H100 lease's report listed the three first names as the costliest."""
    from runner.experiments.startup_imports_report import _summary

    packages = {"cv2": 0.34, "networkx": 0.46, "numpy": 0.39, "sympy": 1.48, "torch": 6.51, "transformers": 3.38}
    row = {"mode": "page_cache_warm", "repeat": 1,
           "_imports": {"api": {"seconds": 18.0, "profiled_s": 17.9, "cpu_s": 21.1, "read_bytes": 0,
                                "packages": dict(sorted(packages.items()))}}}
    table = "\n".join(_summary([row]))
    assert "torch 6.51, transformers 3.38, sympy 1.48" in table
    assert "cv2" not in table
