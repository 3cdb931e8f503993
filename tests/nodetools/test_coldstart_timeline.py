"""What the cold-start timer sees of a start on the node: the engine group's processes as they
appear (the EngineCore among them), the log's first byte, the port opening, and the clocks that
place them; and what ``prepare`` reads from disk before the start (the caches, the bytecode).

The engine is a real program: an "API server" that logs a vLLM line, spawns a child named
``VLLM::EngineCore`` the way vLLM's setproctitle names it, and answers completions over real HTTP.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nodetools import exitcodes
from nodetools.procwatch import GroupWatcher, clock_sample, role_of
from nodetools.startstate import bytecode_state, cache_state
from runner.parse.startup_timeline import timeline
from runner.parse.vllm_log import parse_log_file
from tests.nodetools.conftest import REPO, free_port

ENGINE = """\
import http.server, json, subprocess, sys, time
port = int(sys.argv[1])
time.sleep(0.3)  # the API server's imports
stamp = lambda: time.strftime("%m-%d %H:%M:%S")
print(f"(APIServer pid=1) INFO {stamp()} [api_utils.py:273] non-default args: {{'model': '/m'}}", flush=True)
core = subprocess.Popen(["VLLM::EngineCore", "-c", "import sys, time; time.sleep(0.4); "
    "print('(EngineCore pid=2) INFO ' + time.strftime('%m-%d %H:%M:%S') + ' [core.py:114] Initializing a V1 LLM "
    "engine (v0.24.0) with config: model=/m', flush=True); time.sleep(300)"], executable=sys.executable)
time.sleep(1.0)

class Answer(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"text": "hi"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

print(f"(APIServer pid=1) INFO {stamp()} [api_server.py:581] Starting vLLM server on http://127.0.0.1:{port}",
      flush=True)
http.server.HTTPServer(("127.0.0.1", port), Answer).serve_forever()
"""


def node_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodetools.coldstart", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)


def test_the_timer_records_the_engine_core_process_the_first_byte_and_the_clocks(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "engine.py").write_text(ENGINE)
    work = tmp_path / "trial"
    launch = {"argv": [sys.executable, str(tmp_path / "engine.py"), str(port)], "env": {}, "port": port,
              "model": "m", "caches": {"vllm": str(tmp_path / "cache/vllm")}}
    prepared = node_tool("prepare", "--dir", str(work), "--launch-json", json.dumps(launch))
    assert prepared.returncode == 0, prepared.stderr
    assert json.loads(prepared.stdout)["before_start"]["cache_state"] == "empty"

    done = node_tool("measure", "--launch", str(work / "launch.json"), "--log", str(work / "server.log"),
                     "--out", str(work / "timings.json"), "--poll-s", "0.05", "--lock-dir", str(tmp_path))
    assert done.returncode == exitcodes.OK, done.stderr
    timings = json.loads((work / "timings.json").read_text())
    first_token = timings["first_token_s"]
    clock = timings["clock"]
    assert clock["wall"] == timings["started_at"] and clock["clk_tck"] > 0
    assert clock["utc_offset_s"] == time.localtime(clock["wall"]).tm_gmtoff
    roles = {p["role"]: p for p in timings["processes"]}
    assert roles["api_server"]["start_s"] == pytest.approx(0.0, abs=0.1)  # the leader: the start command
    core = roles["engine_core"]  # found by its name, from its start time in /proc (to the clock tick)
    assert "VLLM::EngineCore" in core["cmdline"] and core["ppid"] == roles["api_server"]["pid"]
    assert 0.25 < core["start_s"] < first_token
    assert 0.25 < timings["events"]["log_first_byte"] < core["start_s"] + 0.3
    assert timings["events"]["port_open"] <= first_token
    assert timings["before_start"]["cache_state"] == "empty"  # prepare.json, copied in

    # The runner's timeline places the process between the API server's line and the EngineCore's.
    parts = timeline(first_token, parse_log_file(work / "server.log"), timings)
    assert parts["timeline_sources"] == "timer+log+proc"
    assert parts["api_imports_s"] == pytest.approx(timings["events"]["log_first_byte"], abs=0.001)  # as it came
    assert parts["engine_spawn_s"] >= 0 and parts["engine_imports_s"] >= 0
    assert parts["first_request_s"] == pytest.approx(first_token - timings["events"]["port_open"], abs=0.002)


def test_the_watcher_sees_members_come_and_go_and_ignores_other_groups() -> None:
    clock = clock_sample()
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.5)']); "
                               "time.sleep(30)"], start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        watcher = GroupWatcher(leader.pid, clock)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            watcher.poll()
            if len(watcher.members) == 2 and all(m.gone_s is None for m in watcher.members.values()):
                break
            time.sleep(0.02)
        while time.monotonic() < deadline and any(m.gone_s is None for m in watcher.members.values()
                                                  if m.pid != leader.pid):
            watcher.poll()
            time.sleep(0.05)
        records = {r["pid"]: r for r in watcher.records()}
        assert leader.pid in records and stranger.pid not in records
        (child,) = [r for pid, r in records.items() if pid != leader.pid]
        assert child["ppid"] == leader.pid and child["role"] == "other"
        assert child["gone_s"] is not None and child["gone_s"] - child["start_s"] >= 0.45  # it slept 0.5 s
        assert records[leader.pid]["role"] == "api_server" and records[leader.pid]["gone_s"] is None
    finally:
        for proc in (leader, stranger):
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.parametrize(("name", "cmdline", "leader", "role"), [
    ("VLLM::EngineCor", "VLLM::EngineCore", False, "engine_core"),
    ("python3", "python3 -c from multiprocessing.spawn import spawn_main", False, "other"),
    ("VLLM::Worker_TP", "VLLM::Worker_TP1", False, "worker"),
    ("python3", "python3 -m vllm.model_executor.models.registry", False, "model_inspect"),
    ("python3", "python3 -c from multiprocessing.resource_tracker import main;main(5)", False, "resource_tracker"),
    ("cc1", "cc1 -quiet kernel.c", False, "compiler"),
    ("python3", "python3 -m vllm.entrypoints.cli.main serve /m", True, "api_server"),
])
def test_roles_come_from_vllm_s_process_names(name: str, cmdline: str, leader: bool, role: str) -> None:
    assert role_of(name, cmdline, leader) == role


def test_cache_state_is_read_from_disk(tmp_path: Path) -> None:
    caches = {"vllm": str(tmp_path / "cache/vllm"), "triton": str(tmp_path / "cache/triton")}
    for folder in caches.values():
        Path(folder).mkdir(parents=True)
    assert cache_state(caches)["cache_state"] == "empty"
    (tmp_path / "cache/triton/abc").mkdir()
    (tmp_path / "cache/triton/abc/kernel.cubin").write_bytes(b"x" * 100)
    warm = cache_state(caches)
    assert (warm["cache_state"], warm["cache_files"], warm["cache_bytes"]) == ("warm", {"triton": 1, "vllm": 0}, 100)
    fresh = {"vllm": str(tmp_path / "trial/fresh-cache/vllm")}
    Path(fresh["vllm"]).mkdir(parents=True)
    assert cache_state(fresh, str(tmp_path / "trial/fresh-cache"))["cache_state"] == "fresh"
    assert cache_state({}, container=True)["cache_state"] == "fresh"  # a new container: no cache volume
    assert cache_state({})["cache_state"] == "unknown"  # a process engine's own default folders


def write_package(root: Path, modules: int) -> list[Path]:
    pkg = root / "pkgx"
    (pkg / "sub").mkdir(parents=True)
    sources = [pkg / "__init__.py"] + [pkg / f"m{i}.py" for i in range(modules - 2)] + [pkg / "sub" / "__init__.py"]
    for path in sources:
        path.write_text(f"VALUE = {len(str(path))}\n")
    return sources


def test_bytecode_state_counts_current_pyc_for_the_engine_s_interpreter(tmp_path: Path) -> None:
    sources = write_package(tmp_path, 4)
    env = {"PYTHONPATH": str(tmp_path)}
    cold = bytecode_state(sys.executable, env, ["pkgx", "not_a_package_here"])
    pkg = cold["packages"]["pkgx"]
    assert (pkg["modules"], pkg["current"], pkg["fraction"], pkg["path"]) == (4, 0, 0.0, str(tmp_path / "pkgx"))
    assert cold["packages"]["not_a_package_here"]["error"].startswith("not_a_package_here is not importable")
    assert cold["order"] == ["pkgx", "not_a_package_here"]

    for path in sources[:3]:
        py_compile.compile(str(path), doraise=True)
    py_compile.compile(str(sources[3]), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    assert bytecode_state(sys.executable, env, ["pkgx"])["packages"]["pkgx"]["fraction"] == 1.0
    # An edited source makes its timestamp pyc stale, and its checked-hash pyc too.
    stat = sources[0].stat()
    os.utime(sources[0], (stat.st_atime, stat.st_mtime + 10))
    sources[3].write_text("VALUE = 'changed'\n")
    warm = bytecode_state(sys.executable, env, ["pkgx"])["packages"]["pkgx"]
    assert (warm["current"], warm["fraction"]) == (2, 0.5)


def test_a_large_package_s_bytecode_is_sampled_evenly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM, torch and transformers hold ~10,000 modules: every header read cost 0.5 s a trial on
    # the H200. Past MAX_PYC_CHECKS an even spread in path order answers the share warm.
    from nodetools import startstate

    monkeypatch.setattr(startstate, "MAX_PYC_CHECKS", 10)
    sources = sorted(write_package(tmp_path, 40))
    for path in sources[:20]:  # the first half, in path order, compiled
        py_compile.compile(str(path), doraise=True)
    got = startstate.pyc_fraction(tmp_path / "pkgx", sys.implementation.cache_tag, importlib.util.MAGIC_NUMBER)
    assert (got["modules"], got["checked"], got["every"]) == (40, 10, 4)
    assert (got["current"], got["fraction"]) == (20, 0.5)


def test_prepare_empties_the_persistent_caches_only_when_asked(tmp_path: Path) -> None:
    caches = {"vllm": str(tmp_path / "cache/vllm"), "flashinfer": str(tmp_path / "cache/flashinfer")}
    (tmp_path / "cache/vllm/torch_compile_cache").mkdir(parents=True)
    (tmp_path / "cache/vllm/torch_compile_cache/graph.bin").write_bytes(b"g")
    launch: dict[str, Any] = {"argv": ["true"], "port": 1, "model": "m", "caches": caches}

    kept = node_tool("prepare", "--dir", str(tmp_path / "t1"), "--launch-json", json.dumps(launch))
    assert json.loads(kept.stdout)["before_start"]["cache_state"] == "warm"
    emptied = node_tool("prepare", "--dir", str(tmp_path / "t2"), "--launch-json", json.dumps(launch), "--empty-cache",
                        "--engine-python", sys.executable, "--bytecode-packages", "nodetools")
    out = json.loads(emptied.stdout)
    assert f"emptied the persistent vllm cache {caches['vllm']}" in out["changed"]
    assert out["before_start"]["cache_state"] == "empty" and Path(caches["vllm"]).is_dir()
    assert out["before_start"]["bytecode"]["packages"]["nodetools"]["modules"] > 10
    assert json.loads((tmp_path / "t2/prepare.json").read_text()) == out["before_start"]


def test_prepare_refuses_to_empty_a_folder_near_the_root(tmp_path: Path) -> None:
    launch = {"argv": ["true"], "port": 1, "model": "m", "caches": {"vllm": "/tmp"}}
    done = node_tool("prepare", "--dir", str(tmp_path / "t"), "--launch-json", json.dumps(launch), "--empty-cache")
    assert done.returncode == exitcodes.BAD_INPUT
    assert done.stderr.strip() == "coldstart prepare: refusing to empty /tmp: not a cache folder (<cache_root>/<name>)"


def age(root: Path, seconds: float = 60) -> None:
    """Every folder under ``root`` last changed ``seconds`` ago: a folder changed within the last
    seconds is never trusted unchanged (its mtime could hide a change in the same clock tick)."""
    then = time.time() - seconds
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(folder, (then, then))


def test_where_the_packages_are_is_kept_across_trials_and_the_headers_read_each_time(tmp_path: Path) -> None:
    # The engine's interpreter and the walk of vLLM's packages cost 0.35 s a trial on the H200: a
    # campaign's later trials reuse what the first found while nothing it depends on changed.
    lib, keep = tmp_path / "lib", tmp_path / "node" / ".answers"
    sources = write_package(lib, 4)
    py_compile.compile(str(sources[0]), doraise=True)
    age(lib)
    env = {"PYTHONPATH": str(lib)}
    first = bytecode_state(sys.executable, env, ["pkgx"], keep=keep)
    assert first["located_from_earlier_trial"] is False and first["packages"]["pkgx"]["fraction"] == 0.25
    py_compile.compile(str(sources[1]), doraise=True)  # a start writes bytecode: its headers are read again
    again = bytecode_state(sys.executable, env, ["pkgx"], keep=keep)
    assert again["located_from_earlier_trial"] is True
    assert (again["packages"]["pkgx"]["current"], again["packages"]["pkgx"]["fraction"]) == (2, 0.5)
    assert again["packages"]["pkgx"] == bytecode_state(sys.executable, env, ["pkgx"])["packages"]["pkgx"]
    # A module added (its folder's mtime moves) is found: nothing kept is used.
    (lib / "pkgx" / "sub" / "extra.py").write_text("X = 1\n")
    added = bytecode_state(sys.executable, env, ["pkgx"], keep=keep)
    assert added["located_from_earlier_trial"] is False and added["packages"]["pkgx"]["modules"] == 5
    # ...and, changed within the last seconds, not kept for the next trial either.
    assert bytecode_state(sys.executable, env, ["pkgx"], keep=keep)["located_from_earlier_trial"] is False
    # A mode that compiles into its own PYTHONPYCACHEPREFIX (bytecode_persisted) is another key,
    # and its compile, made after an earlier trial's look, is seen.
    age(lib)
    env_prefixed = {**env, "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    before = bytecode_state(sys.executable, env_prefixed, ["pkgx"], keep=keep)
    assert before["located_from_earlier_trial"] is False and before["packages"]["pkgx"]["current"] == 0
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(lib / "pkgx")],
                   env={**os.environ, **env_prefixed}, check=True)
    compiled = bytecode_state(sys.executable, env_prefixed, ["pkgx"], keep=keep)
    assert compiled["located_from_earlier_trial"] is True and compiled["pycache_prefix"] == str(tmp_path / "pycache")
    assert compiled["packages"]["pkgx"]["fraction"] == 1.0
    # A package installed earlier on the path (its sys.path folder's mtime moves) is found there.
    first_on_path, second_on_path = tmp_path / "a", tmp_path / "b"
    first_on_path.mkdir()
    write_package(second_on_path, 2)
    age(first_on_path)
    age(second_on_path)
    env_path = {"PYTHONPATH": f"{first_on_path}{os.pathsep}{second_on_path}"}
    assert bytecode_state(sys.executable, env_path, ["pkgx"], keep=keep)["packages"]["pkgx"]["path"] == \
        str(second_on_path / "pkgx")
    assert bytecode_state(sys.executable, env_path, ["pkgx"], keep=keep)["located_from_earlier_trial"] is True
    write_package(first_on_path, 2)
    moved = bytecode_state(sys.executable, env_path, ["pkgx"], keep=keep)
    assert moved["located_from_earlier_trial"] is False
    assert moved["packages"]["pkgx"]["path"] == str(first_on_path / "pkgx")
    # A kept answer that cannot be read is asked again, not trusted.
    for kept in keep.glob("bytecode-*.json"):
        kept.write_text("{")
    assert bytecode_state(sys.executable, env, ["pkgx"], keep=keep)["located_from_earlier_trial"] is False
