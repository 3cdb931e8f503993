"""The role-test harness runs a scenario a second time only when the test infrastructure failed
(``rt_infra_failure`` in tests/roles/lib.sh, used by scripts/test-roles.sh): a container or VM that
did not come up, the emulated NVMe controller hanging, a host lost to Ansible while no task failed.
A failed task or assertion, or a changed idempotence run, is never retried."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def recap(host: str, ok: int, changed: int, unreachable: int, failed: int) -> str:
    """A PLAY RECAP line as ansible-playbook prints it."""
    return (f"{host:<27}: ok={ok:<4} changed={changed:<4} unreachable={unreachable:<4} failed={failed:<4} "
            "skipped=0    rescued=0    ignored=0")


RECAP_OK = recap("rt-fio", 12, 0, 0, 0)
RECAP_UNREACHABLE = recap("rt-cache-volumes", 3, 1, 1, 0)
RECAP_FAILED = recap("rt-criu", 20, 0, 0, 1)
NO_ROUTE = ("fatal: [rt-cache-volumes]: UNREACHABLE! => changed=false\n  msg: 'Failed to connect to the host via ssh: "
            "ssh: connect to host 172.17.0.2 port 22: No route to host'")


def why(tmp_path: Path, log: str, note: str | None = None) -> str:
    path = tmp_path / "cache_volumes.default.attempt1.log"
    path.write_text(log)
    if note is not None:
        (tmp_path / "cache_volumes.default.attempt1.infra").write_text(note)
    script = 'source "$1/tests/roles/lib.sh"; rt_infra_failure "$2"'
    out = subprocess.run(["bash", "-c", script, "_", str(REPO), str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_host_lost_while_no_task_failed_is_retried(tmp_path: Path) -> None:
    log = f"PLAY [Converge] ***\n{NO_ROUTE}\n\nPLAY RECAP ***\n{RECAP_UNREACHABLE}\n"
    assert "No route to host" in why(tmp_path, log)


def test_a_failed_assertion_is_not_retried(tmp_path: Path) -> None:
    log = ("TASK [Assert] ***\nfatal: [rt-criu]: FAILED! => changed=false\n"
           f"  assertion: __rt_parts[0] is search('4.2.1')\n\nPLAY RECAP ***\n{RECAP_FAILED}\n")
    assert why(tmp_path, log) == ""


def test_a_lost_host_beside_a_failed_task_is_not_retried(tmp_path: Path) -> None:
    log = f"{NO_ROUTE}\nPLAY RECAP ***\n{RECAP_UNREACHABLE}\n{RECAP_FAILED}\n"
    assert why(tmp_path, log) == ""


def test_a_changed_idempotence_run_is_not_retried(tmp_path: Path) -> None:
    log = (f"PLAY RECAP ***\n{RECAP_OK.replace('changed=0', 'changed=1')}\n"
           "CRITICAL Idempotence test failed because of the following tasks:\n* [rt-fio] => fio : Install fio\n")
    assert why(tmp_path, log) == ""


def test_a_note_from_the_harness_is_retried(tmp_path: Path) -> None:
    note = "12:00:01 VM rt-raid0, boot 2: the emulated NVMe controller stopped completing I/O (QEMU)\n"
    reason = why(tmp_path, f"PLAY RECAP ***\n{RECAP_OK}\n", note)
    assert "NVMe controller stopped completing I/O" in reason


def test_container_and_vm_scripts_note_what_they_could_not_start() -> None:
    container = (REPO / "tests" / "roles" / "container.sh").read_text()
    vm = (REPO / "tests" / "roles" / "vm.sh").read_text()
    assert 'rt_infra_error "container $name: no ssh login' in container
    assert 'rt_infra_error "VM $name: no ssh' in vm
    assert "the emulated NVMe controller stopped completing I/O" in vm


def test_infra_error_writes_the_attempts_note(tmp_path: Path) -> None:
    note = tmp_path / "x.attempt1.infra"
    subprocess.run(["bash", "-c", 'source "$1/tests/roles/lib.sh"; rt_infra_error "container rt-x: no ssh login"',
                    "_", str(REPO)], env={"RT_INFRA_LOG": str(note), "PATH": "/usr/bin:/bin"},
                   capture_output=True, text=True, check=True)
    assert note.read_text().strip().endswith("container rt-x: no ssh login")
