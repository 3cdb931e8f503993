"""nodetools/cuda_checkpoint_api.py, the cuda-checkpoint command line over the driver's checkpoint API.

Without a GPU: its help, its argument errors, its message when there is no libcuda, and its calls
into a FAKE libcuda (tests/nodetools/fake_libcuda.c, compiled here with the machine's C compiler;
skipped with the reason when there is none) that records every call, keeps each pid's checkpoint
state in a file and refuses transitions the driver refuses. The same program on a real GPU:
test_snapshot_cuda_checkpoint_gpu.py.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodetools import cuda_checkpoint_api as api
from tests.nodetools.fake_cuda import TOOL, Fake, compile_fake, run_tool


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_fake(tmp_path_factory.mktemp("fakecuda"), "fake_libcuda.so")


@pytest.fixture
def fake(fake_libcuda: Path, tmp_path: Path) -> Fake:
    return Fake(fake_libcuda, tmp_path)


def test_help_says_what_it_is() -> None:
    done = run_tool("--help")
    assert done.returncode == 0
    for option in ("--action {lock,checkpoint,restore,unlock}", "--toggle", "--get-state", "--pid PID",
                   "--timeout MS", "--get-restore-tid"):
        assert option in done.stdout
    assert "not NVIDIA's tool" in done.stdout
    assert "re-implementation" in (api.__doc__ or "") and "NOT NVIDIA's" in (api.__doc__ or "")


def test_it_runs_alone_as_an_executable() -> None:
    assert os.access(TOOL, os.X_OK)
    assert TOOL.read_text().startswith("#!/usr/bin/env python3\n")
    assert shutil.which(str(TOOL)) == str(TOOL)  # what nodetools.snapshot's gate asks
    imports = [line for line in TOOL.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in imports if "nodetools" in line or "runner" in line]


@pytest.mark.parametrize(("args", "message"), [
    (("--pid", "1"), "one of the arguments --action --toggle --get-state --get-restore-tid is required"),
    (("--get-state",), "the following arguments are required: --pid/-p"),
    (("--action", "freeze", "--pid", "1"), "argument --action: invalid choice: 'freeze'"),
    (("--action", "lock", "--toggle", "--pid", "1"), "not allowed with argument"),
    (("--get-state", "--pid", "abc"), "argument --pid/-p: invalid int value: 'abc'"),
    (("--get-state", "--pid", "0"), "--pid must be a positive process id, not 0"),
    (("--action", "checkpoint", "--pid", "1", "--timeout", "5"), "--timeout applies to --action lock and --toggle"),
    (("--action", "lock", "--pid", "1", "--timeout", "-1"), "--timeout must be 0..4294967295 milliseconds"),
])
def test_argument_errors(args: tuple[str, ...], message: str) -> None:
    done = run_tool(*args, env={api.LIBCUDA_ENV: "/nonexistent/libcuda.so.1"})
    assert done.returncode == api.EXIT_USAGE
    assert done.stdout == ""
    assert done.stderr.startswith("cuda_checkpoint_api.py: ") and message in done.stderr
    assert done.stderr.count("\n") == 1


def test_no_libcuda_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "libcuda.so.1"
    done = run_tool("--action", "lock", "--pid", "123", env={api.LIBCUDA_ENV: str(missing)})
    assert done.returncode == api.EXIT_NO_DRIVER
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"cuda_checkpoint_api.py: --action lock --pid 123: cannot load {missing}")
    assert "no NVIDIA driver on this machine?" in done.stderr and "driver 570 or newer" in done.stderr


def test_a_driver_before_570_lacks_the_api(tmp_path: Path) -> None:
    old = compile_fake(tmp_path, "fake_libcuda_before_570.so", "-DFAKE_OLD_DRIVER")
    done = run_tool("--toggle", "--pid", "123", env={api.LIBCUDA_ENV: str(old)})
    assert done.returncode == api.EXIT_NO_DRIVER
    assert f"{old} lacks cuCheckpointProcessLock, cuCheckpointProcessCheckpoint" in done.stderr
    assert "needs NVIDIA driver 570 or newer (CUDA 12.8 driver API); this driver: " in done.stderr
    assert "CUDA 12.4" in done.stderr


def test_argument_structures_match_the_c_layout(fake: Fake) -> None:
    pid = fake.process(4242)
    for action in ("lock", "checkpoint", "restore", "unlock"):
        assert fake.run("--action", action, "--pid", str(pid)).returncode == 0
    sizes = {line.split()[0]: int(line.split("argsize=")[1].split()[0]) for line in fake.calls() if "argsize=" in line}
    # the fake's sizes are the C compiler's sizeof of the documented structures
    assert sizes["cuCheckpointProcessLock"] == ctypes.sizeof(api.CUcheckpointLockArgs) == 64
    for name in ("cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"):
        assert sizes[name] == ctypes.sizeof(api.CUcheckpointReservedArgs) == 64


def test_actions_one_by_one(fake: Fake) -> None:
    pid = str(fake.process(5001))
    assert fake.run("--get-state", "--pid", pid).stdout == "running\n"
    assert fake.calls() == ["cuInit flags=0", f"cuCheckpointProcessGetState {pid}"]
    done = fake.run("--action", "lock", "--pid", pid, "--timeout", "2500")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert fake.calls() == ["cuInit flags=0",
                            f"cuCheckpointProcessLock {pid} argsize=64 timeoutMs=2500 reserved_zero=1"]
    assert fake.run("--get-state", "-p", pid).stdout == "locked\n"
    assert fake.run("--action", "checkpoint", "--pid", pid).returncode == 0
    assert fake.run("--get-state", "--pid", pid).stdout == "checkpointed\n"
    assert fake.run("--get-restore-tid", "--pid", pid).stdout == f"{int(pid) + 1}\n"
    assert fake.run("--action", "restore", "--pid", pid).returncode == 0
    assert fake.state(int(pid)) == "locked"
    assert fake.run("--action", "unlock", "--pid", pid).returncode == 0
    assert fake.run("--get-state", "--pid", pid).stdout == "running\n"
    calls = fake.calls()
    assert [c.split()[0] for c in calls if not c.startswith(("cuInit", "cuCheckpointProcessGet"))] == [
        "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"]
    assert all("reserved_zero=1" in c for c in calls if "argsize" in c)


def test_toggle_goes_both_ways(fake: Fake) -> None:
    pid = fake.process(5002)
    assert fake.run("--toggle", "--pid", str(pid)).returncode == 0
    assert fake.state(pid) == "checkpointed"
    assert [c.split()[0] for c in fake.calls()] == ["cuInit", "cuCheckpointProcessGetState",
                                                     "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint"]
    assert fake.run("--toggle", "--pid", str(pid)).returncode == 0
    assert fake.state(pid) == "running"
    assert [c.split()[0] for c in fake.calls()] == ["cuInit", "cuCheckpointProcessGetState",
                                                     "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"]
    assert fake.run("--toggle", "--pid", str(pid), "--timeout", "30").returncode == 0
    assert "cuCheckpointProcessLock 5002 argsize=64 timeoutMs=30 reserved_zero=1" in fake.calls()


def test_toggle_refuses_a_locked_process(fake: Fake) -> None:
    pid = fake.process(5003, "locked")
    done = fake.run("--toggle", "--pid", str(pid))
    assert done.returncode == api.EXIT_FAILED
    assert done.stderr == ("cuda_checkpoint_api.py: --toggle --pid 5003 failed: cannot toggle a process in state "
                           "locked (only running or checkpointed)\n")
    assert fake.state(pid) == "locked"


def test_a_refused_action_names_the_action_the_pid_and_the_cuda_error(fake: Fake) -> None:
    pid = fake.process(5004)
    done = fake.run("--action", "checkpoint", "--pid", str(pid))
    assert done.returncode == api.EXIT_FAILED
    assert done.stderr == ("cuda_checkpoint_api.py: --action checkpoint --pid 5004 failed: "
                           "cuCheckpointProcessCheckpoint returned CUDA_ERROR_ILLEGAL_STATE: "
                           "the operation cannot be performed in the present state\n")
    assert fake.state(pid) == "running"
    fake.run("--action", "lock", "--pid", str(pid))
    done = fake.run("--action", "checkpoint", "--pid", str(pid),
                    FAKE_LIBCUDA_FAIL="cuCheckpointProcessCheckpoint:5004")
    assert done.returncode == api.EXIT_FAILED
    assert "CUDA_ERROR_OUT_OF_MEMORY: out of memory" in done.stderr
    done = fake.run("--get-state", "--pid", "5999")  # not a CUDA process
    assert done.returncode == api.EXIT_FAILED
    assert done.stderr == ("cuda_checkpoint_api.py: --get-state --pid 5999 failed: cuCheckpointProcessGetState "
                           "returned CUDA_ERROR_NOT_INITIALIZED: initialization error\n")


def test_in_process_main_with_the_fake(fake: Fake, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in fake.env.items():
        monkeypatch.setenv(key, value)
    pid = fake.process(5005)
    assert api.main(["--toggle", "--pid", str(pid)]) == 0
    assert api.main(["--get-state", "--pid", str(pid)]) == 0
    assert capsys.readouterr().out == "checkpointed\n"


def test_python_runs_a_copy_without_its_executable_bit(fake: Fake, tmp_path: Path) -> None:
    copy = tmp_path / "cuda_checkpoint_api.py"
    copy.write_text(TOOL.read_text())  # alone, without the project, as a campaign may ship it
    pid = fake.process(5006)
    done = subprocess.run([sys.executable, str(copy), "--toggle", "--pid", str(pid)], capture_output=True,
                          text=True, check=False, env={**os.environ, **fake.env}, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert fake.state(pid) == "checkpointed"
