"""nodetools/h2d_copy.py over a FAKE libcuda (tests/nodetools/fake_libcuda.c: FAKE GPUs whose device
memory is host memory, so a copy is a memcpy): what it allocates and copies, the record it prints,
and every refusal. The real driver and GPU: test_h2d_copy_gpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodetools import exitcodes
from tests.nodetools.fake_cuda import compile_fake, run_h2d_copy


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_fake(tmp_path_factory.mktemp("fakecuda"), "fake_libcuda.so")


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_times_every_direction_and_memory_kind_and_verifies_the_bytes(fake_libcuda: Path, tmp_path: Path) -> None:
    log, out = tmp_path / "calls.log", tmp_path / "h2d.json"
    done = run_h2d_copy(fake_libcuda, "--size-mib", "16", "--repeats", "3", "--gpu", "1", "--out", str(out),
                        FAKE_LIBCUDA_GPUS="2", FAKE_LIBCUDA_LOG=str(log))
    assert done.returncode == exitcodes.OK, done.stderr
    record = json.loads(done.stdout)
    assert json.loads(out.read_text()) == record
    size = 16 * 2**20
    assert (record["gpu"], record["gpu_name"], record["pci_bus_id"]) == (
        1, "FAKE GPU 1 (tests/nodetools/fake_libcuda.c)", "0000:F1:00.0")
    assert (record["size_bytes"], record["size_mib"], record["repeats"], record["verified"]) == (size, 16, 3, True)
    assert record["cuda_version"] == "13.0"
    assert [(c["direction"], c["memory"]) for c in record["copies"]] == [
        ("h2d", "pinned"), ("d2h", "pinned"), ("h2d", "pageable"), ("d2h", "pageable")]
    for copy in record["copies"]:
        assert len(copy["seconds"]) == 3 and all(s > 0 for s in copy["seconds"])
        assert copy["gb_s"] == pytest.approx(size / copy["seconds_median"] / 1e9, rel=1e-3)
        assert copy["gb_s_max"] >= copy["gb_s"] > 0

    calls = _calls(log)
    assert "cuDevicePrimaryCtxRetain device=1" in calls and "cuDevicePrimaryCtxRelease_v2 device=1" in calls
    assert calls.count(f"cuMemHostAlloc bytes={size} flags=0") == 1 and calls.count(f"cuMemAlloc_v2 bytes={size}") == 1
    # One warm-up and three timed copies per direction and memory kind, each of the whole size,
    # from the buffer the row names; the pageable read-back at the end is the fifth.
    assert calls.count(f"cuMemcpyHtoD_v2 host=pinned bytes={size}") == 4
    assert calls.count(f"cuMemcpyDtoH_v2 host=pinned bytes={size}") == 4
    assert calls.count(f"cuMemcpyHtoD_v2 host=pageable bytes={size}") == 4
    assert calls.count(f"cuMemcpyDtoH_v2 host=pageable bytes={size}") == 5
    assert {"cuMemFreeHost", "cuMemFree_v2"} <= set(calls)


def test_a_copy_path_that_changes_bytes_fails(fake_libcuda: Path) -> None:
    done = run_h2d_copy(fake_libcuda, "--size-mib", "4", "--repeats", "1", FAKE_LIBCUDA_CORRUPT="1")
    assert done.returncode == exitcodes.DIED and done.stdout == ""
    assert done.stderr == ("h2d_copy: GPU 0: the 4 MiB read back differ from what was copied there: the copy path "
                           "loses or changes bytes, so its rates mean nothing\n")


def test_probe_says_whether_a_driver_and_a_gpu_are_there(fake_libcuda: Path, tmp_path: Path) -> None:
    usable = run_h2d_copy(fake_libcuda, "--probe", FAKE_LIBCUDA_GPUS="8")
    assert usable.returncode == exitcodes.OK
    assert json.loads(usable.stdout) == {"usable": True, "why": "", "gpus": 8, "gpu": 0, "cuda_version": "13.0"}

    no_gpu = run_h2d_copy(fake_libcuda, "--probe", FAKE_LIBCUDA_NO_DEVICE="1")
    assert no_gpu.returncode == exitcodes.OK
    assert json.loads(no_gpu.stdout) == {"usable": False, "gpus": 0, "why": "no NVIDIA GPU on this node: cuInit "
                                         "returned CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"}

    no_driver = run_h2d_copy(tmp_path / "libcuda.so.1", "--probe")
    assert no_driver.returncode == exitcodes.OK
    found = json.loads(no_driver.stdout)
    assert found["usable"] is False
    assert found["why"].startswith(f"no NVIDIA driver on this node: cannot load {tmp_path}")


@pytest.mark.parametrize(("env", "args", "rc", "message"), [
    ({"FAKE_LIBCUDA_NO_DEVICE": "1"}, [], exitcodes.DIED,
     "no NVIDIA GPU on this node: cuInit returned CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"),
    ({"FAKE_LIBCUDA_GPUS": "0"}, [], exitcodes.DIED, "no NVIDIA GPU on this node: the driver counts 0 devices"),
    ({}, ["--gpu", "1"], exitcodes.BAD_INPUT, "--gpu 1: this node has 1 GPU (index 0)"),
    ({"FAKE_LIBCUDA_GPUS": "2"}, ["--gpu", "5"], exitcodes.BAD_INPUT, "--gpu 5: this node has 2 GPUs (indices 0-1)"),
    ({"FAKE_LIBCUDA_MEM_MIB": "512"}, ["--size-mib", "512"], exitcodes.BAD_INPUT,
     "--size-mib 512: GPU 0 (FAKE GPU 0 (tests/nodetools/fake_libcuda.c)) has 512 MiB in all"),
    ({"FAKE_LIBCUDA_FAIL": "cuMemHostAlloc:0"}, ["--size-mib", "4"], exitcodes.DIED,
     "GPU 0: cuMemHostAlloc returned CUDA_ERROR_OUT_OF_MEMORY (out of memory)"),
    ({}, ["--size-mib", "0"], exitcodes.BAD_INPUT, "--size-mib must be 1-65536, not 0 (see --help)"),
    ({}, ["--repeats", "1001"], exitcodes.BAD_INPUT, "--repeats must be 1-1000, not 1001 (see --help)"),
    ({}, ["--gpu", "-1"], exitcodes.BAD_INPUT, "--gpu must be >= 0, not -1 (see --help)"),
])
def test_refusals_are_one_line_with_the_exit_code(fake_libcuda: Path, env: dict[str, str], args: list[str], rc: int,
                                                  message: str) -> None:
    done = run_h2d_copy(fake_libcuda, *args, **env)
    assert (done.returncode, done.stdout, done.stderr) == (rc, "", f"h2d_copy: {message}\n")


def test_without_a_driver_the_measurement_names_it(tmp_path: Path) -> None:
    done = run_h2d_copy(tmp_path / "libcuda.so.1")
    assert done.returncode == exitcodes.DIED and done.stdout == ""
    assert done.stderr.startswith(f"h2d_copy: no NVIDIA driver on this node: cannot load {tmp_path}/libcuda.so.1 (")
    assert done.stderr.count("\n") == 1
