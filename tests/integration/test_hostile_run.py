"""A run under attack or accident: campaign text that looks like Jinja, a second run into the same
folder, planted credentials, Ctrl-C and SIGKILL of the runner, a full disk, a host that freezes,
a host key nobody trusts. Real ansible-runner, real processes, real sshd hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from runner.cli import main
from runner.inventory import Inventory
from runner.livelog import LogFollower
from runner.progress import QuietProgress
from runner.results_lock import ResultsLock
from runner.supervise import _holders, results_id
from tests.support.sshd_hosts import SshHostSet, _descendants

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _campaign(write_campaign: Callable[[str], Path], experiments: str, extra: str = "") -> Path:
    return write_campaign(f"name: hostile\ninventory: inventory\n{extra}experiments:\n{experiments}")


def _lingering(root: Path) -> list[int]:
    return _holders(results_id(root) + ":", exact=False)


def test_campaign_text_is_never_templated(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    jinja = "{{ lookup('pipe', 'touch " + str(marker) + "') }}"
    path = _campaign(write_campaign, f"""\
  - kind: selftest
    modes:
      fail: {{message: "{jinja}"}}
      skip: {{reason: "{jinja}"}}
""")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    assert not marker.exists()
    reasons = {json.loads(p.read_text())["mode"]: json.loads(p.read_text())["reason"]
               for p in results.glob("trials/*/trial.json")}
    assert reasons["fail"].endswith(f"task 'Fail on purpose': {jinja}")
    assert reasons["skip"] == jinja
    extravars = (results / "trials" / "selftest.fail.r1@localhost" / "ansible" / "env" / "extravars")
    # What ansible-playbook reads with -e @file: the campaign's values tagged !unsafe, never templated.
    text = extravars.read_text()
    assert "message: !unsafe '{{ lookup(" in text


def test_a_second_run_into_the_same_results_folder_is_refused(write_campaign: Callable[[str], Path],
                                                              tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop]\n")
    results = tmp_path / "results"
    with ResultsLock(results):
        assert main([str(path), "--quiet", "--results", str(results)]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {results} is in use by another run (pid {os.getpid()} on host ")
    assert not (results / "trials").exists()  # nothing of the second run was written
    assert main([str(path), "--quiet", "--results", str(results)]) == 0  # released: runs


def test_a_credential_named_by_the_campaign_lands_in_no_artifact(write_campaign: Callable[[str], Path],
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    planted = "planted-Secret-value-7f3a9c"
    monkeypatch.setenv("DB_PASS", planted)  # not caught by the old name-based masking (no TOKEN in it)
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop, sleep]\n",
                     extra="engine: {model: m, env_from_controller: [DB_PASS]}\n")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    holding = [p for p in results.rglob("*") if p.is_file() and planted.encode() in p.read_bytes()]
    assert holding == []
    plan = json.loads((results / "plan.json").read_text())
    assert plan["trials"][0]["engine"]["env_from_controller"] == ["DB_PASS"]


def test_an_unset_credential_is_bad_input(write_campaign: Callable[[str], Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop]\n",
                     extra="engine: {model: m, env_from_controller: [HF_TOKEN]}\n")
    assert main([str(path), "--quiet", "--results", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip() == \
        f"{path}: engine.env_from_controller: HF_TOKEN is not set in this shell's environment"


def _start_runner(path: Path, results: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "runner", str(path), "--plain", "--no-follow",
                             "--results", str(results)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_tick(remote: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any("tick 2" in p.read_text(errors="replace") for p in remote.glob("**/server.log")):
            return
        time.sleep(0.2)
    raise AssertionError(f"the sleep trial never started under {remote}")


def test_ctrl_c_leaves_no_ansible_process_behind(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    remote = tmp_path / "node"
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: {sleep: {seconds: 60}}\n",
                     extra=f"remote_dir: {remote}\n")
    results = tmp_path / "results"
    proc = _start_runner(path, results)
    _wait_for_tick(remote)
    assert _lingering(results)  # the phase's processes carry the run's lease
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert _lingering(results) == []  # before: ansible's setsid worker ran on for the task's length


def test_orphans_of_a_killed_run_are_stopped_before_the_next_starts(write_campaign: Callable[[str], Path],
                                                                     tmp_path: Path) -> None:
    remote = tmp_path / "node"
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: {sleep: {seconds: 60}}\n",
                     extra=f"remote_dir: {remote}\n")
    results = tmp_path / "results"
    proc = _start_runner(path, results)
    _wait_for_tick(remote)
    proc.kill()
    proc.wait()
    time.sleep(1)
    orphans = _lingering(results)
    assert orphans, "a SIGKILLed runner leaves ansible's worker running"
    path.write_text(path.read_text().replace("seconds: 60", "seconds: 1"))
    assert main([str(path), "--quiet", "--no-follow", "--results", str(results)]) == 0
    assert _lingering(results) == []
    trial = json.loads((results / "trials" / "selftest.sleep.r1@localhost" / "trial.json").read_text())
    assert trial["status"] == "ok" and trial["params"]["seconds"] == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_full_disk_stops_the_run_with_one_line_and_whole_files(write_campaign: Callable[[str], Path],
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 160 * 1024))
        path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop]\n    repeats: 40\n")
        results = disk / "results"
        rc = main([str(path), "--quiet", "--no-follow", "--results", str(results)])
        captured = capsys.readouterr()
        assert rc == 4
        (line,) = [x for x in captured.err.splitlines() if x.startswith("error:")]
        assert "No space left on device" in line and "Traceback" not in captured.err
        for trial in results.glob("trials/*/trial.json"):
            assert json.loads(trial.read_text())["status"] != "running"  # every file written is whole
        for name in ("plan.json", "run.json"):
            if (results / name).exists():
                json.loads((results / name).read_text())
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_disk_full_mid_run_leaves_no_trial_running_and_no_traceback(write_campaign: Callable[[str], Path],
                                                                      tmp_path: Path) -> None:
    # Before: ansible-runner's traceback on the terminal, and the trial it was writing left `running`.
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 400 * 1024))  # room for the reserve and a trial
        path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop]\n    repeats: 40\n")
        results = disk / "results"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", "runner", str(path), "--quiet", "--no-follow", "--results",
                               str(results)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 4
        assert "Traceback" not in done.stderr
        (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
        assert "No space left on device" in line
        records = [json.loads(p.read_text()) for p in results.glob("trials/*/trial.json")]
        assert records  # the disk filled while trials ran
        assert [r["id"] for r in records if r["status"] == "running"] == []
        stopped = [r for r in records if r["status"] == "interrupted"]
        assert all(r["reason"].startswith("the run stopped before it ended (the results folder refused a write: ")
                   for r in stopped)
        run = json.loads((results / "run.json").read_text())
        assert run["runs"][-1]["stopped"] and not (results / ".reserve").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_crash_mid_run_is_one_line_a_log_and_no_trial_left_running(write_campaign: Callable[[str], Path],
                                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop]\n")
    results = tmp_path / "results"

    def broken(self: QuietProgress, trial_id: str, host: str) -> None:
        raise RuntimeError("the display broke")

    monkeypatch.setattr(QuietProgress, "trial_started", broken)  # fault injected: every known one is fixed
    assert main([str(path), "--quiet", "--no-follow", "--results", str(results)]) == 5
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.startswith("error: internal error: RuntimeError: the display broke at runner/campaign.py:")
    (log,) = results.glob("crash-*.log")
    assert f"the traceback is in {log}." in line
    (record,) = [json.loads(p.read_text()) for p in results.glob("trials/*/trial.json")]
    assert record["status"] == "interrupted"
    assert record["reason"] == ("the run stopped before it ended (the runner failed: RuntimeError); the next run "
                                "repeats it")


def test_a_250_character_results_name_runs(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    # Before: the lock file beside the folder (.<name>.lock) overflowed NAME_MAX: a traceback.
    path = _campaign(write_campaign, "  - kind: selftest\n    modes: [noop]\n")
    results = tmp_path / ("r" * 250)
    assert main([str(path), "--quiet", "--no-follow", "--results", str(results)]) == 0
    assert main([str(path), "--quiet", "--no-follow", "--fresh", "--results", str(results)]) == 0
    (aside,) = [p for p in tmp_path.iterdir() if ".before-" in p.name]
    assert (aside / "plan.json").is_file() and (results / "plan.json").is_file()


def test_a_frozen_host_fails_fast_and_the_others_go_on(ssh_hosts: SshHostSet, ssh_inventory: Path,
                                                        tmp_path: Path) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(f"""\
name: frozen
inventory: {ssh_inventory}
remote_dir: {tmp_path / 'node'}
defaults: {{timeout_s: 600}}
experiments:
  - kind: selftest
    modes: {{sleep: {{seconds: 2}}}}
    repeats: 4
""")
    results = tmp_path / "results"
    h2 = ssh_hosts.hosts[1]
    proc = _start_runner(campaign, results)
    facts = results / "hosts" / "h2" / "facts.json"
    deadline = time.monotonic() + 60
    while not facts.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(h2.pidfile.read_text().split()[0])
    frozen = [pid, *_descendants(pid)]
    started = time.monotonic()
    for victim in frozen:
        os.kill(victim, signal.SIGSTOP)
    try:
        rc = proc.wait(timeout=240)
    finally:
        for victim in frozen:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
    took = time.monotonic() - started
    assert rc == 1
    records = [json.loads(p.read_text()) for p in results.glob("trials/*/trial.json")]
    by_host = {h: [r for r in records if r["host"] == h] for h in ("h1", "h2")}
    assert [r["status"] for r in by_host["h1"]] == ["ok"] * 4
    # The first trial reads the facts in its own run (facts.json is in place once that run ends): it
    # is over before the freeze. Every later one fails.
    later = [r for r in by_host["h2"] if not r["id"].startswith("selftest.sleep.r1@")]
    assert len(later) == 3 and all(r["status"] == "failed" for r in later)
    assert sum(r["reason"].startswith("not tried: host h2 stopped answering") for r in by_host["h2"]) >= 2
    assert took < 150  # not 4 x 600 s of phase timeouts


def test_the_log_follower_never_trusts_an_unknown_host_key(ssh_hosts: SshHostSet, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    inventory = ssh_hosts.write_inventory(tmp_path / "inv" / "hosts.yml")
    data = yaml.safe_load(inventory.read_text())
    data["all"]["vars"]["ansible_ssh_common_args"] = f"-o UserKnownHostsFile={known}"
    inventory.write_text(yaml.safe_dump(data))
    conn = Inventory(inventory).connection("h1")
    log = tmp_path / "remote.log"
    log.write_text("")
    seen: list[str] = []
    follower = LogFollower(conn, str(log), seen.append, poll_s=0.05)
    follower.start()
    time.sleep(1.5)
    with log.open("a") as fh:
        fh.write("INFO Starting vLLM API server\n")
    time.sleep(1.5)
    follower.stop()
    assert seen == []
    assert known.read_text() == ""  # the unknown key was refused, not added
