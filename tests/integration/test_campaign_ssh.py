"""A campaign across two real SSH hosts through real ansible-runner: lost host, resume, Ctrl-C,
what an engine trial's collect phase brings back, over SSH and on a local connection, and the
engine's secrets: in the engine's environment on the node, in no file of the results or the node,
not even while a phase runs or after the runner was killed."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from runner.cli import main
from tests.support.sshd_hosts import SshHostSet

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def campaign(tmp_path: Path, seconds: float, repeats: int) -> Path:
    path = tmp_path / "campaign.yaml"
    path.write_text(f"""\
name: ssh-drill
inventory: inventory
hosts: nodes
remote_dir: {tmp_path / 'remote'}
experiments:
  - kind: selftest
    modes:
      sleep: {{seconds: {seconds}, interval_s: 0.2}}
    repeats: {repeats}
""")
    return path


def start_runner(path: Path, results: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.Popen([sys.executable, "-m", "runner", str(path), "--plain", "--results", str(results),
                             *extra], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def records(results: Path) -> dict[str, dict[str, object]]:
    out = {}
    for path in (results / "trials").glob("*/trial.json"):
        record = json.loads(path.read_text())
        out[record["id"]] = record
    return out


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def status_of(results: Path, trial: str) -> object:
    path = results / "trials" / trial / "trial.json"
    try:
        return json.loads(path.read_text()).get("status") if path.exists() else None
    except ValueError:  # never happens with atomic writes; kept so a regression fails clearly
        return "torn-write"


def test_lost_host_fails_only_its_trials_and_a_rerun_completes_them(
        ssh_hosts: SshHostSet, ssh_inventory: Path, tmp_path: Path) -> None:
    path, results = campaign(tmp_path, seconds=0.5, repeats=4), tmp_path / "results"
    h2 = ssh_hosts.hosts[1]
    proc = start_runner(path, results)
    wait_for(lambda: status_of(results, "selftest.sleep.r1@h2") == "ok", 120, "h2's first trial")
    h2.stop()
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, out

    first = records(results)
    assert {first[f"selftest.sleep.r{i}@h1"]["status"] for i in range(1, 5)} == {"ok"}, out
    assert first["selftest.sleep.r1@h2"]["status"] == "ok"
    # The first trial that finds h2 gone fails as unreachable; the host then fails fast: every later
    # trial is "not tried" and names that one, instead of waiting out its own timeout.
    lost_ids = [f"selftest.sleep.r{i}@h2" for i in (2, 3, 4) if first[f"selftest.sleep.r{i}@h2"]["status"] != "ok"]
    assert len(lost_ids) >= 2, out
    found, *after = lost_ids
    assert str(first[found]["reason"]).startswith("unreachable in phase run: h2"), first[found]["reason"]
    for trial_id in lost_ids:
        assert first[trial_id]["status"] == "failed" and first[trial_id]["metrics"] == {}
    for trial_id in after:
        assert str(first[trial_id]["reason"]).startswith(f"not tried: host h2 stopped answering during {found}"), (
            first[trial_id]["reason"])
    assert (results / "trials/selftest.sleep.r1@h1/raw/h1/server.log").read_text().startswith("INFO selftest tick 1")
    with (results / "summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    assert len(summary) == 8
    lost = [row for row in summary if row["trial_id"] in lost_ids]
    assert len(lost) == len(lost_ids) and {row["status"] for row in lost} == {"failed"}
    assert all("h2" in row["reason"] for row in lost)

    # Without --retry-failed nothing runs; with it, only the failed trials run.
    h2.start()
    again = start_runner(path, results)
    assert again.wait(timeout=60) == 1
    assert records(results) == first
    retry = start_runner(path, results, "--retry-failed")
    out, _ = retry.communicate(timeout=240)
    assert retry.returncode == 0, out
    second = records(results)
    assert {r["status"] for r in second.values()} == {"ok"}
    for trial_id, record in first.items():
        if record["status"] == "ok":
            assert second[trial_id]["started"] == record["started"], f"{trial_id} ran again"
    assert len(list((results / "previous").iterdir())) == sum(r["status"] == "failed" for r in first.values())
    run_info = json.loads((results / "run.json").read_text())
    assert len(run_info["runs"]) == 3 and run_info["hosts"] == ["h1", "h2"]
    assert run_info["tools"]["ansible-runner"] == "2.4.3"


def test_sigint_cancels_running_phases_and_loses_nothing(ssh_inventory: Path, tmp_path: Path) -> None:
    path, results = campaign(tmp_path, seconds=4, repeats=2), tmp_path / "results"
    proc = start_runner(path, results)
    wait_for(lambda: status_of(results, "selftest.sleep.r1@h1") == "ok", 120, "a first finished trial")
    wait_for(lambda: status_of(results, "selftest.sleep.r2@h1") == "running", 60, "a running trial")
    time.sleep(1.0)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert time.monotonic() - started < 30
    first = records(results)
    assert first["selftest.sleep.r1@h1"]["status"] == "ok"
    assert first["selftest.sleep.r2@h1"]["status"] == "interrupted"
    assert "running" not in {r["status"] for r in first.values()}

    resumed = start_runner(path, results)
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out
    second = records(results)
    assert set(second) == {f"selftest.sleep.r{i}@h{h}" for i in (1, 2) for h in (1, 2)}
    assert {r["status"] for r in second.values()} == {"ok"}
    assert second["selftest.sleep.r1@h1"]["started"] == first["selftest.sleep.r1@h1"]["started"]


def engine_campaign(tmp_path: Path, inventory: Path, host: str, modes: str = "[disk_cold, runai_streamer]",
                    engine_extra: str = "") -> Path:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "engine.yaml"
    path.write_text(f"""\
name: collect-drill
inventory: {inventory}
hosts: {host}
remote_dir: {tmp_path / 'remote'}
engine:
  kind: stand-in
  model: {tmp_path / 'model'}
  standin_model_mib: 64
  served_model_name: standin
  port: {port}
  cache_root: {tmp_path / 'cache'}
  args: {{max-model-len: 8192}}
  env: {{STANDIN_COMPILE_MISS_S: "0.2", STANDIN_JIT_MISS_S: "0.1", STANDIN_GRAPH_CAPTURE_S: "0.1"}}
{engine_extra}experiments:
  - kind: startup
    modes: {modes}
    timeout_s: 180
""")
    return path


@pytest.mark.parametrize("transport", ["ssh", "local"])
def test_collect_brings_back_exactly_the_files_the_trial_wrote(
        transport: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if transport == "ssh":
        inventory, host = request.getfixturevalue("ssh_inventory"), "h1"
    else:
        inventory, host = tmp_path / "inventory" / "hosts.yml", "localhost"
        inventory.parent.mkdir()
        shutil.copy(REPO / "inventory/local/hosts.yml", inventory)
    results = tmp_path / "results"
    assert main([str(engine_campaign(tmp_path, inventory, host)), "--quiet", "--results", str(results)]) == 0
    trial = results / "trials" / f"startup.disk_cold.r1@{host}"
    raw = trial / "raw" / host
    # The node's copy and the fetched one are the same bytes; preload.log was never written, so
    # nothing was fetched for it (no stat and slurp of a missing file).
    # The timer recorded the node after the stop: no facts_after.json read by a module (0.64 s).
    assert {p.name for p in raw.iterdir()} == {"server.log", "timings.json", "launch.json", "importtime.txt"}
    node_dir = tmp_path / "remote" / "collect-drill" / host / f"startup.disk_cold.r1@{host}"
    for name in ("server.log", "timings.json", "launch.json", "importtime.txt"):
        assert (raw / name).read_bytes() == (node_dir / name).read_bytes(), name
    assert "preload.log" not in (trial / "ansible/artifacts/trial/stdout").read_text()  # one run a trial
    # The timer's window marker holds the runner's lease only where the program runs in the
    # runner's environment (local): there the next trial's run starts before this one's collect;
    # over SSH, where the node's folder is not the controller's, when the collect begins.
    marker = json.loads((node_dir / "window-over.json").read_text())
    collect_at = min(_created(e) for e in _job_events(trial) if e["event"] == "playbook_on_task_start"
                     and e["event_data"]["task"].startswith("collect_engine_files |"))
    next_started = json.loads((results / "trials" / f"startup.runai_streamer.r1@{host}" / "trial.json").read_text()
                              )["phases"][0]["started"]
    if transport == "ssh":
        assert marker["lease"] == "" and next_started >= collect_at, (marker, next_started - collect_at)
    else:
        assert marker["lease"].endswith(f":startup.disk_cold.r1@{host}") and next_started < collect_at, marker
    assert json.loads((raw / "timings.json").read_text())["node_after_stop"]["mem_total_bytes"] > 0
    skipped = json.loads((results / "trials" / f"startup.runai_streamer.r1@{host}" / "trial.json").read_text())
    assert skipped["status"] == "skipped"
    assert skipped["reason"].startswith("the stand-in does not model --load-format runai_streamer")
    # A skip ends the prepare, not the play: the collect in its always: section still ran.
    assert [p["name"] for p in skipped["phases"]] == ["trial"]
    assert (results / "trials" / f"startup.runai_streamer.r1@{host}" / "raw" / host / "facts_after.json").is_file()
    # The next trial, started early, was let go only once this one had left the node: after its
    # last task on the node (over SSH, the fetch of its files) ended.
    turn_at = skipped["phases"][0]["started"] + skipped["phases"][0]["waited_for_turn_s"]
    node_work = [e for e in _job_events(trial) if e["event"].startswith("runner_")
                 and not e["event_data"].get("task", "").endswith(("(a local connection)", "Done with the node"))]
    assert max(_created(e) for e in node_work) <= turn_at < json.loads((trial / "trial.json").read_text())["ended"]


def _job_events(trial: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in (trial / "ansible/artifacts/trial/job_events").glob("*.json")]


def _created(event: dict) -> float:
    """An ansible-runner event's time (UTC, ISO 8601 without a zone) as epoch seconds."""
    return datetime.fromisoformat(event["created"]).replace(tzinfo=UTC).timestamp()


def files_holding(root: Path, *values: str) -> list[str]:
    """Every file under ``root`` (symlinks aside) whose bytes hold one of ``values``."""
    needles = [v.encode() for v in values]
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink()
            and any(n in p.read_bytes() for n in needles)]


def this_checkouts_python(tmp_path: Path) -> Path:
    """The node's Python with this checkout's nodetools: an SSH session does not inherit the
    runner's PYTHONPATH, and an editable install may name another checkout."""
    path = tmp_path / "node-python"
    path.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


class EnvironWatch(threading.Thread):
    """Reads /proc while a campaign runs (the sshd hosts' processes are this machine's): the
    environment of every node tool and engine whose command line holds ``marker`` (a folder of
    this test's: other tests on the machine start stand-ins too), and every ``command`` artifact
    under ``results`` once its playbook runs (its first event is written), so a value seen there
    while a phase runs, even for a moment, is caught. (Before that, for the instant between
    ansible-runner writing the file, 0600 in a 0700 folder, and the runner's status handler
    rewriting it, the file holds the environment: what the resume's sweep is for.)"""

    def __init__(self, marker: bytes, results: Path, name: str, value: str) -> None:
        super().__init__(daemon=True)
        self.marker, self.results, self.key = marker, results, f"{name}=".encode()
        self.value = value.encode()
        self.environs: dict[str, set[bytes | None]] = {}  # a command line's first words -> values seen
        self.commands_with_value: set[str] = set()
        self.stop = threading.Event()

    def look(self) -> None:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if self.marker not in cmdline or b"nodetools." not in cmdline:
                    continue
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if environ == [b""]:  # it exited between the two reads: its memory, environment included, is gone
                continue
            what = b" ".join(cmdline.split(b"\0")[1:4]).decode(errors="replace")
            found = next((e[len(self.key):] for e in environ if e.startswith(self.key)), None)
            self.environs.setdefault(what, set()).add(found)
        for command in self.results.glob("trials/*/ansible/artifacts/*/command"):
            try:
                if next((command.parent / "job_events").iterdir(), None) and self.value in command.read_bytes():
                    self.commands_with_value.add(str(command))
            except OSError:
                continue

    def run(self) -> None:
        while not self.stop.is_set():
            self.look()
            time.sleep(0.02)


def test_the_engine_gets_its_secret_over_ssh_and_no_file_keeps_it(
        ssh_inventory: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    secret = f"hf_ssh-{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", secret)
    path = engine_campaign(tmp_path, ssh_inventory, "h1", modes="[disk_cold]",
                           engine_extra="  env_from_controller: [HF_TOKEN]\n")
    path.write_text(path.read_text() + f"node_python: {this_checkouts_python(tmp_path)}\n")
    port = yaml.safe_load(path.read_text())["engine"]["port"]
    results, node = tmp_path / "results", tmp_path / "remote"
    watch = EnvironWatch(str(tmp_path).encode(), results, "HF_TOKEN", secret)
    watch.start()
    try:
        assert main([str(path), "--quiet", "--results", str(results)]) == 0
    finally:
        watch.stop.set()
        watch.join()
    # Over SSH the session's environment is sshd's, not the runner's: the value can only have come
    # through the trial's secrets file, into the engine (the stand-in's serve) and nothing else.
    engine = [what for what in watch.environs if "nodetools.standin serve" in what]
    assert engine and all(watch.environs[what] == {secret.encode()} for what in engine), watch.environs
    assert str(port) in (node / "collect-drill/h1/startup.disk_cold.r1@h1/launch.json").read_text()
    tools = [what for what in watch.environs if "nodetools.coldstart" in what]
    assert tools and all(watch.environs[what] == {None} for what in tools), watch.environs
    assert watch.commands_with_value == set()  # not even while the phase ran
    assert files_holding(results, secret) == [] and files_holding(node, secret) == []
    assert not list(node.rglob("secrets.json"))
    # Nothing was there for the last guard to scrub: no value ever reached a file of the trial.
    assert not [r for r in caplog.records if "a secret's value was found" in r.getMessage()]


def test_a_killed_runner_leaves_no_value_in_its_artefacts_and_a_resume_keeps_none(
        ssh_inventory: Path, tmp_path: Path) -> None:
    secret, other = f"hf_kill-{uuid.uuid4().hex}", f"pw_kill-{uuid.uuid4().hex}"
    path = campaign(tmp_path, seconds=6, repeats=1)
    path.write_text(path.read_text().replace("experiments:", f"""\
engine:
  kind: stand-in
  model: {tmp_path / 'model'}
  env_from_controller: [HF_TOKEN]
experiments:"""))
    results = tmp_path / "results"
    env = {**os.environ, "HF_TOKEN": secret, "DB_PASSWORD": other,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    runner = subprocess.Popen([sys.executable, "-m", "runner", str(path), "--plain", "--results", str(results)],
                              cwd=REPO, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    command = results / "trials/selftest.sleep.r1@h1/ansible/artifacts/run/command"
    try:
        wait_for(lambda: status_of(results, "selftest.sleep.r1@h1") == "running" and command.exists(), 120,
                 "a running phase")
        time.sleep(1.0)  # well inside the 6 s task
        assert files_holding(results, secret, other) == []  # while it runs
        runner.kill()  # SIGKILL: no cleanup of its own runs
        runner.wait()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert files_holding(results, secret, other) == []
    resumed = subprocess.run([sys.executable, "-m", "runner", str(path), "--plain", "--results", str(results)],
                             cwd=REPO, env=env, text=True, capture_output=True, timeout=240, check=False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    kept = list((results / "previous").glob("selftest.sleep.r1@h1.*/ansible/artifacts/run/command"))
    assert kept  # the killed attempt, kept, without the values
    assert files_holding(results, secret, other) == []
    assert secret not in resumed.stdout + resumed.stderr
