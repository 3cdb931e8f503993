"""``coldstart prepare`` does everything before a start in one program (a trial used to run five).

Stale leases of a killed attempt are reaped first, the model is made only when it is missing, an
unmet precondition is a reason to skip that changes nothing else (no folder emptied, no page cache
dropped), and each step's seconds are reported. ``coldstart measure`` fails when the port still
answers after its engine was stopped: the playbook's cleanup then runs, and only then.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from nodetools import exitcodes
from nodetools.lease import Lease
from nodetools.proc import is_running, start_time
from tests.nodetools.conftest import REPO, free_port


def node_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodetools.coldstart", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)


def _launch(tmp_path: Path, port: int) -> dict[str, object]:
    return {"argv": ["true"], "env": {}, "port": port, "model": "m", "caches": {"vllm": str(tmp_path / "cache/vllm")}}


def test_an_unmet_precondition_skips_and_changes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "trial"
    work.mkdir()
    (work / "server.log").write_text("an earlier attempt's log\n")
    made = tmp_path / "made"
    done = node_tool("prepare", "--dir", str(work), "--launch-json", json.dumps(_launch(tmp_path, free_port())),
                     "--check", "--python-module", "no_such_module_here", "--engine-python", sys.executable,
                     "--exists", str(tmp_path / "no-vllm"), "--page-cache", "drop", "--drop-scope", "files",
                     "--model", str(tmp_path / "model"),
                     "--make-model", json.dumps([sys.executable, "-c", f"open({str(made)!r}, 'w')"]))
    assert done.returncode == exitcodes.OK, done.stderr
    out = json.loads(done.stdout)
    assert out["reasons"] == [
        f"{tmp_path / 'no-vllm'} does not exist",
        f"python module no_such_module_here is not installed beside the engine ({sys.executable}): the mode needs it"]
    assert "before_start" not in out
    assert (work / "server.log").read_text() == "an earlier attempt's log\n"  # not emptied
    assert not (tmp_path / "cache").exists() and made.exists()  # the model maker ran (its folder had no config)
    assert set(out["steps_s"]) == {"model_s", "preconditions_s"}

    # With the reap (the startup trial's first step) the earlier attempt's files go before any check:
    # a skip must not fetch them as its own.
    again = node_tool("prepare", "--dir", str(work), "--launch-json", json.dumps(_launch(tmp_path, free_port())),
                      "--reap-leases", str(tmp_path / ".leases"), "--check", "--exists", str(tmp_path / "no-vllm"))
    out = json.loads(again.stdout)
    assert out["reasons"] == [f"{tmp_path / 'no-vllm'} does not exist"] and f"emptied {work}" in out["changed"]
    assert not work.exists()


def test_a_port_that_answers_is_a_reason(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = node_tool("prepare", "--dir", str(tmp_path / "t"), "--launch-json", json.dumps(_launch(tmp_path, port)),
                         "--check")
    assert json.loads(done.stdout)["reasons"] == [f"port {port} already answers: another server runs on this node"]


def test_prepare_reaps_a_killed_attempts_engine_then_makes_a_missing_model_once(tmp_path: Path) -> None:
    leases = tmp_path / ".leases"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        lease = Lease(leases, "coldstart measure", "startup.disk_cold.r0", tmp_path / "old", [1])
        lease.data["owner"] = {"pid": 999_999_999, "start": 1}  # its timer is long gone
        lease.add_group(orphan.pid, "engine on port 1")
        model = tmp_path / "model"
        maker = [sys.executable, "-c", "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(); "
                 "(p / 'config.json').write_text('{}')", str(model)]
        launch = json.dumps(_launch(tmp_path, free_port()))
        first = node_tool("prepare", "--dir", str(tmp_path / "t1"), "--launch-json", launch, "--reap-leases",
                          str(leases), "--model", str(model), "--make-model", json.dumps(maker), "--check")
        assert first.returncode == exitcodes.OK, first.stderr
        out = json.loads(first.stdout)
        assert f"stopped process group {orphan.pid} (engine on port 1, trial startup.disk_cold.r0)" in out["changed"]
        assert f"made the model {model}" in out["changed"]
        orphan.wait(timeout=10)
        assert list(leases.glob("*.json")) == []
        assert out["before_start"]["prepare_steps_s"].keys() == {"folders_s", "read_state_s", "page_cache_s"}
        assert {"reap_s", "model_s", "preconditions_s", "page_cache_s"} <= out["steps_s"].keys()

        again = node_tool("prepare", "--dir", str(tmp_path / "t2"), "--launch-json", launch, "--model", str(model),
                          "--make-model", json.dumps([sys.executable, "-c", "raise SystemExit('must not run')"]))
        assert again.returncode == exitcodes.OK, again.stderr
        assert not any(c.startswith("made the model") for c in json.loads(again.stdout)["changed"])
    finally:
        if is_running(orphan.pid, start_time(orphan.pid)):
            orphan.kill()


def test_a_model_that_cannot_be_made_fails_prepare_with_the_makers_words(tmp_path: Path) -> None:
    done = node_tool("prepare", "--dir", str(tmp_path / "t"), "--launch-json", json.dumps(_launch(tmp_path, 1)),
                     "--model", str(tmp_path / "model"),
                     "--make-model", json.dumps([sys.executable, "-c", "raise SystemExit('no room for weights')"]))
    assert done.returncode == exitcodes.DIED
    model = tmp_path / "model"
    assert done.stderr.strip() == f"coldstart prepare: could not make the model {model}: no room for weights"


# An engine that answers a one-token completion from its own process (stopped with its group).
SIMPLE_ENGINE = """\
import http.server, json, sys
class A(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"choices": [{"text": "hi"}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
print("engine up", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), A).serve_forever()
"""


# An "engine" that hands its port to a process outside its group (the engine above, in a session
# of its own) and exits: the port still answers after the timer stopped the engine's group.
ESCAPING_ENGINE = """\
import pathlib, subprocess, sys
escaped = subprocess.Popen([sys.executable, sys.argv[3], sys.argv[1]], start_new_session=True,
                           stdout=subprocess.DEVNULL)
pathlib.Path(sys.argv[2]).write_text(str(escaped.pid))
import time; time.sleep(300)
"""


def test_a_port_that_still_answers_after_the_stop_fails_the_measure(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "engine.py").write_text(ESCAPING_ENGINE)
    (tmp_path / "server.py").write_text(SIMPLE_ENGINE)
    work = tmp_path / "trial"
    work.mkdir()
    escaped = tmp_path / "escaped.pid"
    argv = [sys.executable, str(tmp_path / "engine.py"), str(port), str(escaped), str(tmp_path / "server.py")]
    launch = {"argv": argv, "env": {}, "port": port, "model": "m"}
    (work / "launch.json").write_text(json.dumps(launch))
    done = node_tool("measure", "--launch", str(work / "launch.json"), "--log", str(work / "server.log"),
                     "--out", str(work / "timings.json"), "--lock-dir", str(tmp_path))
    try:
        assert done.returncode == exitcodes.BUSY, done.stderr
        assert done.stderr.strip() == f"coldstart: port {port} still answers after the engine was stopped"
        timings = json.loads((work / "timings.json").read_text())
        assert timings["first_token_s"] > 0 and timings["port_free_after_stop"] is False
        assert timings["events"]["stopped"] >= timings["events"]["stop_requested"]
    finally:
        if escaped.is_file():
            os.kill(int(escaped.read_text()), signal.SIGKILL)


def test_trial_prepares_then_measures_in_one_program_and_records_the_node_after_the_stop(tmp_path: Path) -> None:
    # One node program instead of two: a task per program costs 0.3-0.7 s on the H200.
    port = free_port()
    (tmp_path / "engine.py").write_text(SIMPLE_ENGINE)
    work = tmp_path / "trial"
    launch = {**_launch(tmp_path, port), "argv": [sys.executable, str(tmp_path / "engine.py"), str(port)]}
    done = node_tool("trial", "--dir", str(work), "--launch-json", json.dumps(launch), "--check",
                     "--reap-leases", str(tmp_path / ".leases"), "--lease-dir", str(tmp_path / ".leases"),
                     "--lock-dir", str(tmp_path), "--poll-s", "0.02", "--timeout-s", "60")
    assert done.returncode == exitcodes.OK, done.stderr
    out = json.loads(done.stdout)
    assert out["reasons"] == [] and out["measure_rc"] == exitcodes.OK and "before_start" not in out
    assert {"reap_s", "preconditions_s", "folders_s", "page_cache_s"} <= out["steps_s"].keys()
    timings = json.loads((work / "timings.json").read_text())
    assert timings["first_token_s"] > 0 and timings["port_free_after_stop"] is True
    assert timings["before_start"]["cache_state"]  # prepare.json, read by the timer
    assert json.loads((work / "launch.json").read_text())["argv"] == launch["argv"]
    assert (work / "server.log").read_text().startswith("engine up")
    after = timings["node_after_stop"]
    assert after["mem_total_bytes"] >= after["mem_available_bytes"] > 0 and after["page_cache_bytes"] > 0
    assert after["shm_offload_files"] == [] or all("size_bytes" in f for f in after["shm_offload_files"])


def test_trial_with_an_unmet_precondition_starts_nothing(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    launch = {**_launch(tmp_path, free_port()), "argv": [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]}
    done = node_tool("trial", "--dir", str(tmp_path / "trial"), "--launch-json", json.dumps(launch), "--check",
                     "--exists", str(tmp_path / "no-vllm"), "--lock-dir", str(tmp_path))
    assert done.returncode == exitcodes.OK, done.stderr
    out = json.loads(done.stdout)
    assert out["reasons"] == [f"{tmp_path / 'no-vllm'} does not exist"] and "measure_rc" not in out
    assert not ran.exists() and not (tmp_path / "trial" / "timings.json").exists()


def test_node_state_reads_meminfo_and_the_offload_buffers(tmp_path: Path) -> None:
    from nodetools.node_state import node_state

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:   10 kB\nMemAvailable:    600 kB\nCached:  300 kB\n"
                       "HugePages_Total:       0\n")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "vllm_offload_0").write_bytes(b"x" * 4096)
    (shm / "other").write_bytes(b"y")
    assert node_state(meminfo, shm) == {
        "mem_total_bytes": 1_024_000, "mem_available_bytes": 614_400, "page_cache_bytes": 307_200,
        "shm_offload_files": [{"name": "vllm_offload_0", "size_bytes": 4096}]}
    assert node_state(tmp_path / "missing", tmp_path / "none") == {"shm_offload_files": []}
