"""Campaigns on the local inventory (connection: local) through real ansible-runner."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main
from runner.inventory import Connection
from runner.livelog import LogFollower

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_default_campaign_runs_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    assert main([str(REPO / "campaigns/local.yaml"), "--quiet", "--results", str(results)]) == 0
    with (results / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["status"] for r in rows] == ["ok"] * 9
    assert [r["kind"] for r in rows] == ["facts"] + ["selftest"] * 3 + ["startup"] * 5
    assert (results / "startup.csv").is_file() and (results / "startup.png").is_file()
    facts = json.loads((results / "hosts/localhost/facts.json").read_text())
    assert facts["memory"]["total_bytes"] > 0 and facts["gpus"] == []
    trial = json.loads((results / "trials/overhead.noop.r1@localhost/trial.json").read_text())
    assert trial["host_facts"] == facts  # provenance: every trial carries its host's facts
    assert rows[0]["mem_total_gib"] and float(rows[0]["mem_total_gib"]) > 0
    report = (results / "report.md").read_text()
    assert "| localhost | none |" in report and "overhead.noop.r3@localhost" in report
    run = json.loads((results / "run.json").read_text())
    assert run["tools"]["ansible-core"] == "2.19.14" and run["inventory"]["files"] == 1
    assert "local: ok 9" in capsys.readouterr().out
    assert "**engine=stand-in**" in report


def test_failed_and_skipped_trials_are_rows_with_reasons(write_campaign: Callable[[str], Path],
                                                         tmp_path: Path) -> None:
    path = write_campaign("""\
name: drills
inventory: inventory
experiments:
  - kind: selftest
    modes:
      fail: {message: "the node said no"}
      skip: {reason: "needs a GPU"}
      noop:
""")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 1
    with (results / "summary.csv").open() as fh:
        rows = {r["mode"]: r for r in csv.DictReader(fh)}
    assert rows["fail"]["status"] == "failed"
    assert rows["fail"]["reason"] == "failed in phase run: localhost: task 'Fail on purpose': the node said no"
    assert rows["skip"]["status"] == "skipped" and rows["skip"]["reason"] == "needs a GPU"
    assert rows["noop"]["status"] == "ok"
    record = json.loads((results / "trials/selftest.fail.r1@localhost/trial.json").read_text())
    (phase,) = record["phases"]
    assert phase["failures"][0]["task"] == "Fail on purpose" and phase["rc"] == 2
    assert "the node said no" in (results / "report.md").read_text()

    # `report` rebuilds the same files from disk alone.
    (results / "summary.csv").unlink()
    assert main(["report", str(results)]) == 0
    assert (results / "summary.csv").is_file()


def test_plan_touches_no_host(write_campaign: Callable[[str], Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inventory" / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gone:\n      ansible_host: 127.0.0.9\n      ansible_port: 1\n")
    path = write_campaign("name: p\ninventory: inventory\nexperiments:\n  - kind: selftest\n    repeats: 2\n")
    started = time.monotonic()
    assert main([str(path), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [t["id"] for t in plan["trials"]] == ["selftest.noop.r1@gone", "selftest.noop.r2@gone"]
    assert time.monotonic() - started < 5
    assert not (tmp_path / "results").exists()


def test_bad_campaign_exits_2_with_one_line_per_error(write_campaign: Callable[[str], Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write_campaign("name: x\ninventory: inventory\nexperiments:\n  - kind: selftest\n    modes: [nap]\n"
                          "    timeout_s: 0\n")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"{path}:5: experiments[0].modes.nap: unknown mode for kind selftest (known: noop, sleep, "
                   "fail, skip)", f"{path}:6: experiments[0].timeout_s: must be > 0"]


def test_local_log_follower_sees_new_lines_as_they_are_written(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("an earlier run's line\n")
    seen: list[str] = []
    follower = LogFollower(Connection("localhost", "local", "localhost", 22, "root", None), str(log),
                           seen.append, poll_s=0.05)
    follower.start()
    time.sleep(0.2)
    with log.open("w") as fh:  # the new run truncates the log: it is followed from its start
        fh.write("Loading weights took 1.00 seconds\nGraph capturing")
        fh.flush()
        time.sleep(0.3)
        fh.write(" finished in 2 secs\n")
    time.sleep(0.3)
    follower.stop()
    assert seen == ["Loading weights took 1.00 seconds", "Graph capturing finished in 2 secs"]


@pytest.mark.skipif(shutil.which("tail") is None, reason="needs tail")
def test_ssh_log_follower_reads_through_openssh(ssh_inventory: Path, tmp_path: Path) -> None:
    from runner.inventory import Inventory

    conn = Inventory(ssh_inventory).connection("h1")
    assert conn.kind == "ssh" and conn.address == "127.0.0.2" and conn.key_file
    log = tmp_path / "remote.log"
    log.write_text("")
    seen: list[str] = []
    follower = LogFollower(conn, str(log), seen.append, poll_s=0.05)
    follower.start()
    # `tail -n 0 -F` shows what is written once it runs; on a loaded machine the SSH connection can
    # take longer than any fixed pause, so the line is written again until it shows (a 2-core CI
    # machine under a parallel load once missed a line written after 1 s).
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:
        with log.open("a") as fh:
            fh.write("INFO Starting vLLM API server\n")
        time.sleep(0.5)
    follower.stop()
    assert seen and set(seen) == {"INFO Starting vLLM API server"}, seen


def test_parse_log_cli(capsys: pytest.CaptureFixture[str]) -> None:
    real = REPO / "tests/fixtures/vllm_logs/real/vllm-0.24.0-h200-first_start.log"
    assert main(["parse-log", str(real), "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["weights_load_s"] == 0.29 and parsed["compile_cache_hit"] is False
    assert parsed["missing"] == [] and parsed["errors"] == []
    assert main(["parse-log", "/etc/hostname"]) == 2
    assert capsys.readouterr().err.strip() == "error: /etc/hostname: no vLLM log lines found"


def test_a_selftest_campaign_imports_no_pandas_and_once_cached_no_ansible(tmp_path: Path) -> None:
    """pandas (~0.5 CPU s to import) serves only a kind's own report section: a campaign of kinds
    without one runs and writes its whole report without it (runner/report_table.py). Run again
    (the runner's cache: the inventory's hosts, the host's facts), a quiet run imports no Ansible
    either: ansible-playbook alone reads Ansible's configuration and plugins."""
    campaign = tmp_path / "one.yaml"
    campaign.write_text(f"name: one\ninventory: {REPO / 'inventory/local'}\nhosts: all\n"
                        f"remote_dir: {tmp_path / 'remote'}\nexperiments:\n  - kind: selftest\n    modes: [noop]\n")
    seen = []
    for name in ("first", "again"):
        code = ("import sys; from runner.cli import main; "
                f"rc = main([{str(campaign)!r}, '--quiet', '--results', {str(tmp_path / name)!r}]); "
                "print(rc, 'pandas' in sys.modules, 'ansible' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False)
        seen.append(done.stdout.strip().splitlines()[-1:])
        with (tmp_path / name / "summary.csv").open() as fh:
            assert [r["status"] for r in csv.DictReader(fh)] == ["ok"], done.stdout + done.stderr
    assert seen == [["0 False True"], ["0 False False"]]
