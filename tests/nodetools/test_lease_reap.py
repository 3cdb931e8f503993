"""The node side of a killed run: the lease every engine-starting tool writes, the reaper that stops
what a stale lease names (and nothing else), and the engine port's lock.

Everything is real: the node tools run as programs, the "engine" is a real process group (a leader
and a child that only sleep), the controller's SIGKILL is a real SIGKILL of the tool.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodetools import exitcodes
from nodetools.engine_cleanup import cleanup
from nodetools.lease import PortBusy, PortLock, claim
from nodetools.proc import group_members, is_running, start_time
from tests.nodetools.conftest import REPO, free_port

# An engine that never answers: a leader and a child in the leader's process group, both sleeping.
ENGINE = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}\\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(300)
"""
# The same, but the leader ends once its child runs (vLLM's API process gone, its EngineCore left).
LEADER_EXITS = ENGINE.rsplit("time.sleep(300)", 1)[0]
SLEEPER = "import sys, time; time.sleep(300)"


def node_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO, timeout=120,
                          check=False)


class Trial:
    """``<tmp>/remote/<campaign>/<host>/<trial>``, as the runner lays a node out, with a launch file."""

    def __init__(self, tmp: Path, name: str = "startup.disk_cold.r1@node", port: int | None = None) -> None:
        self.host_dir = tmp / "remote" / "campaign" / "node"
        self.dir = self.host_dir / name
        self.dir.mkdir(parents=True)
        self.leases = self.host_dir / ".leases"
        self.locks = tmp / "locks"
        self.port = port or free_port()
        self.pids_file = self.dir / "engine.pids"
        (self.dir / "engine.py").write_text(ENGINE)
        launch = {"argv": [sys.executable, str(self.dir / "engine.py"), str(self.pids_file)], "env": {},
                  "port": self.port, "model": "m"}
        (self.dir / "launch.json").write_text(json.dumps(launch))

    def measure(self, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "nodetools.coldstart", "measure", "--launch", str(self.dir / "launch.json"),
             "--log", str(self.dir / "server.log"), "--out", str(self.dir / "timings.json"), "--timeout-s", "120",
             "--lock-dir", str(self.locks), *extra],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def lease(self) -> dict[str, object]:
        (path,) = self.leases.glob("*.json")
        return json.loads(path.read_text())

    def wait_engine(self, tool: subprocess.Popen[str], started: list[object]) -> tuple[int, int]:
        """The engine's (leader, child) once both run and the lease names the group."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert tool.poll() is None, tool.communicate()
            with contextlib.suppress(OSError, ValueError):
                if self.pids_file.is_file() and self.lease()["groups"]:
                    leader, child = map(int, self.pids_file.read_text().split())
                    started.append((leader, start_time(leader) or 0))
                    return leader, child
            time.sleep(0.05)
        raise AssertionError("the engine did not start")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str] | tuple[int, int]]]:
    """What a test starts: processes, and (group, leader start) of engine groups that may outlive
    their tool; whatever of it still runs at the end is killed."""
    started: list[subprocess.Popen[str] | tuple[int, int]] = []
    yield started
    for item in started:
        if isinstance(item, tuple):
            if any(s >= item[1] for _, s in group_members(item[0])):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(item[0], signal.SIGKILL)
            continue
        item.terminate()  # a tool stops its engine on SIGTERM
        try:
            item.wait(timeout=20)
        except subprocess.TimeoutExpired:
            item.kill()
            item.wait(timeout=10)


def sleeper(processes: list[subprocess.Popen[str]], *argv: str) -> subprocess.Popen[str]:
    """An unrelated process in a session (and process group) of its own."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *argv], start_new_session=True, text=True)
    processes.append(proc)
    return proc


def gone(pgid: int) -> bool:
    deadline = time.monotonic() + 10
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(pgid)


def reap(*args: str) -> tuple[int, dict[str, list[str]], str]:
    done = node_tool("nodetools.reap", *args)
    return done.returncode, json.loads(done.stdout or "{}"), done.stderr


def assert_lock_free(port: int, lock_dir: Path) -> None:
    lock = PortLock(port, "next", "test", lock_dir)
    lock.acquire()
    lock.release()


# --- the lease ------------------------------------------------------------------------------------


def test_the_timer_leases_its_engine_group_and_removes_the_lease_when_it_ends(tmp_path: Path) -> None:
    trial = Trial(tmp_path)
    (trial.dir / "engine.py").write_text("import sys; sys.exit(7)\n")  # exits before any token
    tool = trial.measure("--trial", "startup.disk_cold.r1")
    _, err = tool.communicate(timeout=60)
    assert tool.returncode == exitcodes.DIED, err
    assert list(trial.leases.glob("*")) == []  # removed: the tool ended normally
    pgid, start = map(int, (trial.dir / "engine.pgid").read_text().split())  # "PGID START"
    assert start > 0 and pgid > 0
    assert_lock_free(trial.port, trial.locks)


def test_a_sigkilled_timer_leaves_its_engine_running_and_the_reaper_stops_only_that(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    trial = Trial(tmp_path)
    tool = trial.measure("--trial", "startup.disk_cold.r1")
    processes.append(tool)
    leader, child = trial.wait_engine(tool, processes)
    lease = trial.lease()
    assert lease["trial"] == "startup.disk_cold.r1" and lease["ports"] == [trial.port]
    assert lease["owner"] == {"pid": tool.pid, "start": start_time(tool.pid)}
    assert lease["groups"] == [{"pgid": leader, "start": start_time(leader), "what": f"engine on port {trial.port}",
                                "container": ""}]

    tool.send_signal(signal.SIGKILL)  # the controller's kill reaches the tool, never its engine
    tool.wait(timeout=10)
    assert is_running(leader) and is_running(child)  # the orphan runs on
    # An unrelated process in the place of a reused pid: a lease naming its number, but with another
    # start time, as owner and as group, must leave it alone.
    other = sleeper(processes)
    other_start = start_time(other.pid)
    assert other_start is not None
    (trial.leases / "old.coldstart-measure.1.json").write_text(json.dumps({
        "version": 1, "tool": "coldstart measure", "trial": "startup.disk_cold.r0", "owner":
        {"pid": other.pid, "start": other_start - 1}, "groups": [{"pgid": other.pid, "start": other_start - 1}]}))

    rc, out, err = reap("--root", str(trial.leases), "--grace-s", "5")
    assert rc == exitcodes.OK, err
    assert f"process group {leader} (engine on port {trial.port}, trial startup.disk_cold.r1)" in out["stopped"]
    assert gone(leader) and not is_running(child)
    assert is_running(other.pid, other_start)  # untouched
    assert any(f"pid {other.pid} now belongs to another process (reused)" in s for s in out["skipped"])
    assert any(f"process group {other.pid}: pid {other.pid} now belongs to a process started later" in s
               for s in out["skipped"])
    assert list(trial.leases.glob("*.json")) == []
    assert_lock_free(trial.port, trial.locks)  # the engine held it after its tool was killed; no more


def test_a_live_orphan_timer_is_stopped_and_its_old_folder_cleared_after_it_wrote_its_last_word(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """The controller was killed but the timer runs on (its own session, a ControlPersist ssh): the
    reaper's SIGTERM makes it stop its engine and end, and only then is the trial folder emptied, so
    nothing the orphan writes lands in the next attempt's folder."""
    trial = Trial(tmp_path)
    tool = trial.measure()
    processes.append(tool)
    leader, _ = trial.wait_engine(tool, processes)
    rc, out, err = reap("--root", str(trial.leases), "--grace-s", "20", "--clear", str(trial.dir))
    assert rc == exitcodes.OK, err
    assert tool.wait(timeout=10) == exitcodes.TIMEOUT  # its own SIGTERM handling: "timer interrupted"
    assert gone(leader)
    assert f"coldstart measure pid {tool.pid} (trial startup.disk_cold.r1@node)" in out["stopped"]
    assert out["cleared"] == [str(trial.dir)] and not trial.dir.exists()
    assert list(trial.leases.glob("*.json")) == []


def test_the_reaper_stops_a_group_whose_leader_is_gone(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """vLLM's API process can exit and leave its EngineCore: the group id is then no process's pid."""
    pids = tmp_path / "pids"
    leader = subprocess.Popen([sys.executable, "-c", LEADER_EXITS, str(pids)], start_new_session=True, text=True)
    start = start_time(leader.pid)
    assert start is not None
    processes.append((leader.pid, start))
    leader.wait(timeout=30)  # the leader is gone (reaped), its child still in the group
    child = int(pids.read_text().split()[1])
    assert group_members(leader.pid) == [(child, start_time(child))]
    leases = tmp_path / ".leases"
    leases.mkdir()
    (leases / "t.coldstart-measure.1.json").write_text(json.dumps(
        {"tool": "coldstart measure", "trial": "t", "owner": {"pid": 1, "start": -1},
         "groups": [{"pgid": leader.pid, "start": start, "what": "engine"}]}))
    rc, out, _ = reap("--root", str(leases), "--grace-s", "5")
    assert rc == exitcodes.OK and out["stopped"] == [f"process group {leader.pid} (engine, trial t)"]
    assert gone(leader.pid)


def test_the_reaper_keeps_to_one_trial_when_asked(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    a, b = sleeper(processes), sleeper(processes)
    leases = tmp_path / ".leases"
    leases.mkdir()
    for name, proc in (("a", a), ("b", b)):
        (leases / f"{name}.x.1.json").write_text(json.dumps(
            {"tool": "x", "trial": name, "groups": [{"pgid": proc.pid, "start": start_time(proc.pid)}]}))
    rc, out, _ = reap("--root", str(leases), "--trial", "a", "--grace-s", "5")
    assert rc == exitcodes.OK and out["stopped"] == [f"process group {a.pid} (engine, trial a)"]
    assert gone(a.pid) and is_running(b.pid)
    assert sorted(p.name for p in leases.iterdir()) == ["b.x.1.json"]


def test_clear_users_stops_a_stray_process_that_writes_into_the_folder(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """storage.yml: an earlier attempt's fio, still writing its --output into the trial folder."""
    folder, other = tmp_path / "storage.seq.r1", tmp_path / "storage.seq.r2"
    folder.mkdir()
    (folder / "fio-seq.json").write_text("{}")
    stray = sleeper(processes, f"--output={folder}/fio-seq.json", str(folder / "seq.fio"))
    bystander = sleeper(processes, f"--output={other}/fio-seq.json")
    rc, out, err = reap("--root", str(tmp_path / ".leases"), "--clear", str(folder), "--clear-users",
                        "--grace-s", "5")
    assert rc == exitcodes.OK, err
    assert stray.wait(timeout=10) == -signal.SIGTERM
    assert is_running(bystander.pid)
    assert len(out["stopped"]) == 1 and out["stopped"][0].startswith(f"pid {stray.pid} (")
    assert out["cleared"] == [str(folder)] and not folder.exists()


def test_the_reaper_refuses_to_clear_the_folder_that_holds_the_leases(tmp_path: Path) -> None:
    rc, _, err = reap("--root", str(tmp_path / "host" / ".leases"), "--clear", str(tmp_path / "host"))
    assert rc == exitcodes.BAD_INPUT and "refusing to clear" in err
    assert reap("--root", str(tmp_path), "--clear-users")[0] == exitcodes.BAD_INPUT


def test_cleanup_never_kills_a_reused_pid_from_engine_pgid(tmp_path: Path,
                                                           processes: list[subprocess.Popen[str]]) -> None:
    other = sleeper(processes)
    start = start_time(other.pid)
    assert start is not None
    work = tmp_path / "trial"
    work.mkdir()
    for recorded in (f"{other.pid} {start - 1}", f"{other.pid}"):  # another start time; none recorded
        (work / "engine.pgid").write_text(recorded + "\n")
        assert cleanup(work, free_port())["stopped"] == []
        assert is_running(other.pid, start)
    (work / "engine.pgid").write_text(f"{other.pid} {start}\n")  # really the engine's group
    assert cleanup(work, free_port())["stopped"] == [f"process group {other.pid}"]
    assert gone(other.pid)


# --- the port lock --------------------------------------------------------------------------------


def test_a_second_start_on_a_locked_port_is_refused_naming_the_holder(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    first = Trial(tmp_path, "startup.disk_cold.r1@node")
    second = Trial(tmp_path / "other-run", "startup.disk_cold.r1@node", port=first.port)
    second.locks = first.locks
    tool = first.measure("--trial", "startup.disk_cold.r1")
    processes.append(tool)
    first.wait_engine(tool, processes)

    refused = second.measure("--trial", "startup.fresh.r2")
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == exitcodes.BUSY
    assert err.count("\n") == 1 and err.startswith(f"coldstart: port {first.port} is locked by pid {tool.pid} "
                                                   f"(coldstart measure) on {socket.gethostname()}, trial "
                                                   "startup.disk_cold.r1, since ")
    assert not second.pids_file.exists() and list(second.leases.glob("*")) == []  # it started nothing

    tool.send_signal(signal.SIGKILL)
    tool.wait(timeout=10)
    # The orphaned engine still holds the lock (it inherited it): still refused, and told why.
    refused = second.measure()
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == exitcodes.BUSY
    assert f"is locked by the engine of pid {tool.pid} " in err and "that tool is gone but its engine lives on" in err
    assert reap("--root", str(first.leases), "--grace-s", "5")[0] == exitcodes.OK
    with claim("test", "t", tmp_path / "t", [first.port], tmp_path / "leases", first.locks):
        pass  # free again


def test_the_lock_is_exclusive_even_within_one_process(tmp_path: Path) -> None:
    first, second = PortLock(9, "a", "tool-a", tmp_path), PortLock(9, "b", "tool-b", tmp_path)
    first.acquire()
    with pytest.raises(PortBusy, match=rf"^port 9 is locked by pid {os.getpid()} \(tool-a\) on .*, trial a, since "):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


def test_the_lock_folder_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_CAMPAIGN_LOCK_DIR", str(tmp_path))
    lock = PortLock(8123, "t", "x")
    lock.acquire()
    assert lock.path == tmp_path / "gpu-campaign-port-8123.lock"
    info = json.loads(lock.path.read_text())
    assert info["pid"] == os.getpid() and info["trial"] == "t" and info["port"] == 8123
    lock.release()


def test_a_port_that_already_answers_is_busy_and_leaves_nothing_behind(tmp_path: Path) -> None:
    trial = Trial(tmp_path)
    with socket.socket() as server:
        server.bind(("127.0.0.1", trial.port))
        server.listen()
        tool = trial.measure()
        _, err = tool.communicate(timeout=60)
    assert tool.returncode == exitcodes.BUSY
    assert err == f"coldstart: port {trial.port} already answers: another server is running\n"
    assert not trial.pids_file.exists() and list(trial.leases.glob("*")) == []
    assert_lock_free(trial.port, trial.locks)  # released on the way out


def test_snapshot_and_offload_run_take_the_same_lock(tmp_path: Path) -> None:
    trial = Trial(tmp_path)
    holder = PortLock(trial.port, "someone", "tool-a", trial.locks)
    holder.acquire()
    done = node_tool("nodetools.snapshot", "measure", "--mode", "cuda_checkpoint", "--launch",
                     str(trial.dir / "launch.json"), "--log", str(trial.dir / "server.log"), "--out",
                     str(trial.dir / "timings.json"), "--images", str(trial.dir / "images"), "--lock-dir",
                     str(trial.locks))
    assert done.returncode == exitcodes.BUSY and "trial someone" in done.stderr
    (trial.dir / "offload.json").write_text(json.dumps({"copies": [json.loads((trial.dir / "launch.json")
                                                                              .read_text())]}))
    done = node_tool("nodetools.offload_run", "run", "--launch", str(trial.dir / "offload.json"), "--dir",
                     str(trial.dir), "--load", "{}", "--lock-dir", str(trial.locks))
    assert done.returncode == exitcodes.BUSY and "trial someone" in done.stderr
    assert not trial.pids_file.exists()
    holder.release()


def test_offload_run_leases_every_copy_and_removes_the_lease(tmp_path: Path) -> None:
    trial = Trial(tmp_path, "offload.hbm_only.r1@node")
    spec = {"argv": [sys.executable, "-c", "import sys; sys.exit(7)"], "env": {}, "model": "m"}
    (trial.dir / "offload.json").write_text(json.dumps({"copies": [{**spec, "port": free_port()},
                                                                   {**spec, "port": free_port()}]}))
    done = node_tool("nodetools.offload_run", "run", "--launch", str(trial.dir / "offload.json"), "--dir",
                     str(trial.dir), "--load", "{}", "--lock-dir", str(trial.locks))
    assert done.returncode == exitcodes.DIED, done.stderr
    assert done.stderr.startswith("offload_run: engine copy 0 exited before it answered")
    for pgid_file in (trial.dir / "engine.pgid", trial.dir / "copy1" / "engine.pgid"):
        assert len(pgid_file.read_text().split()) == 2
    assert list(trial.leases.glob("*")) == []


# --- one exit-code table --------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["nodetools.coldstart", "measure", "--launch", "/nonexistent/launch.json", "--log", "/tmp/x", "--out", "/tmp/y"],
    ["nodetools.coldstart", "nonsense"],
    ["nodetools.coldstart", "prepare", "--dir", "/tmp/x", "--launch-json", "{"],
    ["nodetools.snapshot", "measure", "--mode", "criu", "--launch", "/nonexistent", "--log", "/tmp/x", "--out",
     "/tmp/y", "--images", "/tmp/z"],
    ["nodetools.snapshot", "gates", "--mode", "criu", "--gpus", "a,b"],
    ["nodetools.snapshot"],
    ["nodetools.offload_run", "run", "--launch", "/nonexistent", "--dir", "/tmp/x", "--load", "{}"],
    ["nodetools.offload_run", "preflight", "--facts", "/nonexistent", "--need", "{}"],
    ["nodetools.preflight", "--port", "1", "--gpus", "x"],
    ["nodetools.pagecache", "nonsense"],
    ["nodetools.reap", "--root", "/tmp/x", "--clear-users"],
    ["nodetools.reap"],  # argparse: a missing --root
])
def test_bad_input_exits_2_in_every_tool(argv: list[str]) -> None:
    done = node_tool(*argv)
    assert done.returncode == exitcodes.BAD_INPUT == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_group_io_counts_what_every_process_of_the_group_read(tmp_path: Path) -> None:
    # A KV tier on disk is read by the engine's processes (EngineCore's threads): /proc/<pid>/io
    # counts it whatever the engine's own metrics say.
    from nodetools.proc import group_io

    data = tmp_path / "tier.bin"
    data.write_bytes(os.urandom(4 << 20))
    done = tmp_path / "read"
    reader = f"open({str(data)!r}, 'rb').read(); open({str(done)!r}, 'w').close(); import time; time.sleep(30)"
    proc = subprocess.Popen(["sh", "-c", f"{sys.executable} -c \"{reader}\" & sleep 30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        io = group_io(proc.pid)["processes"]
        assert len(io) == 3  # the shell, its python child and its sleep, each by pid and start time
        assert all(key.split(":")[0].isdigit() and key.split(":")[1].isdigit() for key in io)
        assert max(p["rchar"] for p in io.values()) >= 4 << 20
        assert group_io(999_999_999) == {"processes": {}}
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
