"""Snapshot gates on the node, each refusal with its message (fake tools say so in their names)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodetools.snapshot import criu_node
from nodetools.snapshot import gates as gates_module
from nodetools.snapshot.gates import gates

CRIU_OK = ('case "$1" in --version) echo "Version: 4.2.1";; check) case "$3" in '
           'network_lock_nftables|uffd) echo "$3 is supported";; "") echo "Looks good.";; esac;; esac')
CRIU_NO_FEATURES = ('case "$1" in --version) echo "Version: 4.2.1";; check) case "$3" in '
                    'network_lock_nftables) echo "Warn (criu/cr-check.c:1348): Nftables based locking requires '
                    'libnftables and set concatenations support"; exit 1;; '
                    'uffd) echo "Error (criu/kerndat.c:1002): uffd: Unable to open an userfaultfd descriptor"; '
                    'exit 1;; "") echo "Looks good.";; esac;; esac')


def fake_tool(tmp_path: Path, name: str, script: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def only_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH of one folder (the fakes) and /bin's shell: no iptables, no nvidia-smi."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}/bin")
    return folder


def test_missing_criu(tmp_path: Path) -> None:
    reasons, facts = gates("criu", criu=str(tmp_path / "no-criu"))
    assert reasons[0] == f"CRIU not found ({tmp_path / 'no-criu'}): the criu role builds it from source"
    assert facts["criu_version"] is None


def test_debian_12_criu_is_too_old(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-3.17", 'echo "Version: 3.17.1"')
    reasons, _ = gates("criu", criu=criu, network_lock="skip")
    assert reasons == ["CRIU 3.17.1 is too old (needs >= 4.1: older releases fail 'criu check' on kernels >= 6.13)"]


def test_failing_criu_check(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-4.2", 'case "$1" in --version) echo "Version: 4.2.1";; '
                                               'check) echo "Error: kernel lacks X" >&2; exit 1;; esac')
    reasons, facts = gates("criu", criu=criu, network_lock="skip")
    assert reasons == ["'criu check' fails: Error: kernel lacks X"]
    assert facts["criu_version"] == "4.2.1"


def test_gpu_engine_needs_the_cuda_plugin_and_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = only_path(tmp_path, monkeypatch)  # no nvidia-smi, no cuda-checkpoint
    criu = fake_tool(folder, "fake-criu-ok", CRIU_OK)
    monkeypatch.delenv("CRIU_LIBS_DIR", raising=False)
    monkeypatch.setattr(criu_node, "PLUGIN_DIRS", (str(tmp_path / "usr-lib-criu"),))  # this machine may have one
    reasons, _ = gates("criu", criu=criu, libdir=str(tmp_path / "plugins"), gpus=[4])
    assert any(r.startswith("CRIU's CUDA plugin (cuda_plugin.so) is in none of ") for r in reasons)
    assert "no GPU: cuda-checkpoint needs an NVIDIA GPU and driver" in reasons


def test_tp2_needs_a_driver_that_restores_cuda_ipc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path, "nvidia-smi", 'case "$1" in --query-gpu=driver_version) echo "580.159.04";; '
                                      '--query-gpu=index,persistence_mode) echo "0, Enabled"; echo "1, Disabled";; '
                                      '*) echo "0, 143771"; echo "1, 143771";; esac')
    fake_tool(tmp_path, "cuda-checkpoint", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    reasons, facts = gates("cuda_checkpoint", gpus=[0, 1], tp=2, gpu_memory_fraction=0.1)
    assert facts["driver_major"] == 580
    assert "TP=2 uses CUDA IPC, whose checkpoint/restore needs driver >= 610; this node has 580" in reasons
    assert "persistence mode is off on GPU(s) 1: cuda-checkpoint restore needs it" in reasons


def test_vllm_snapshot_needs_a_remote_model_and_revision(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    reasons, _ = gates("vllm_snapshot", criu=criu, tp=2, model="/mnt/models/q", revision="main",
                       launch={"argv": [str(tmp_path / "no-vllm"), "serve", "/mnt/models/q"]})
    assert reasons == [
        "snapshot create requires an immutable remote model: give a model id, not a local path",
        "snapshot create requires a 40-character --revision (the model's commit hash)",
        "vllm snapshot supports TP1 only (this engine has TP=2)",
        f"'{tmp_path / 'no-vllm'} snapshot' is not available: {tmp_path / 'no-vllm'} not found",
    ]


def test_a_vllm_without_the_snapshot_command_is_named_with_its_own_words(tmp_path: Path) -> None:
    """vLLM 0.24.0 (the H200's) has no `snapshot`: its argparse error is the reason's end."""
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    python = fake_tool(tmp_path, "fake-python-vllm-0.24", 'if [ "$3" = snapshot ]; then echo "usage: vllm [-h] '
                                                          '{chat,complete,serve,bench}" >&2; echo "vllm: error: '
                                                          "argument subparser: invalid choice: 'snapshot'\" >&2; "
                                                          "exit 2; fi")
    launch = {"argv": [python, "-m", "vllm.entrypoints.cli.main", "serve", "org/m", "--port", "8000"],
              "env": {"PYTHONPATH": "/opt/vllm/site"}}
    reasons, _ = gates("vllm_snapshot", criu=criu, model="org/m", revision="0" * 40, launch=launch)
    assert reasons == [f"'{python} -m vllm.entrypoints.cli.main snapshot' is not available (this vLLM has no "
                       "snapshot command): vllm: error: argument subparser: invalid choice: 'snapshot'"]
    reasons, _ = gates("vllm_snapshot", criu=criu, model="org/m", revision="0" * 40,
                       launch={"argv": ["docker", "run", "img"], "container": "c1"})
    assert reasons == ["vllm_snapshot runs vLLM as a process on the node (runtime: process), not in a container"]


# --- the criu mode's settings ---------------------------------------------------------------------


def test_network_lock_auto_takes_what_the_node_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = only_path(tmp_path, monkeypatch)
    criu = fake_tool(folder, "fake-criu-ok", CRIU_OK)
    _, facts = gates("criu", criu=criu)
    assert facts["network_lock"]["method"] == "nftables"  # no iptables here; CRIU says it can
    for name in ("iptables", "iptables-restore"):
        fake_tool(folder, name, "exit 0")
    _, facts = gates("criu", criu=criu)
    assert facts["network_lock"]["method"] == "iptables"
    assert facts["network_lock"]["why"] == "iptables and iptables-restore are on the PATH"
    bare = fake_tool(tmp_path, "fake-criu-without-nftables", CRIU_NO_FEATURES)
    (folder / "iptables").unlink()
    reasons, facts = gates("criu", criu=bare)
    assert reasons == [] and facts["network_lock"]["method"] == "skip"
    assert facts["network_lock"]["why"].startswith("neither iptables nor CRIU's nftables lock on this node")


def test_an_asked_network_lock_the_node_lacks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = only_path(tmp_path, monkeypatch)
    bare = fake_tool(folder, "fake-criu-without-nftables", CRIU_NO_FEATURES)
    reasons, _ = gates("criu", criu=bare, network_lock="iptables")
    assert reasons == ["network_lock iptables: iptables or iptables-restore is not on the PATH, so CRIU's lock "
                       "fails ('Iptables configuration failed'); use network_lock auto, nftables or skip"]
    reasons, _ = gates("criu", criu=bare, network_lock="nftables")
    assert reasons == ["network_lock nftables: 'criu check --feature network_lock_nftables' says: Warn "
                       "(criu/cr-check.c:1348): Nftables based locking requires libnftables and set concatenations "
                       "support; use network_lock auto, iptables or skip"]


def test_lazy_pages_need_userfaultfd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = only_path(tmp_path, monkeypatch)
    bare = fake_tool(folder, "fake-criu-without-uffd", CRIU_NO_FEATURES)
    reasons, _ = gates("criu", criu=bare, network_lock="skip", lazy_pages=True)
    assert reasons == ["lazy_pages needs userfaultfd: 'criu check --feature uffd' says: Error (criu/kerndat.c:1002): "
                       "uffd: Unable to open an userfaultfd descriptor"]
    assert gates("criu", criu=bare, network_lock="skip")[0] == []


def test_flags_the_tool_sets_itself_are_refused(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    reasons, _ = gates("criu", criu=criu, network_lock="skip", criu_flags=["--shell-job", "--network-lock=skip", "x"])
    assert reasons == ["criu flag 'x' does not start with '-'",
                       "criu flag '--network-lock=skip' is set by the tool itself (network_lock, lazy_pages, "
                       "images_dir, libdir are mode parameters)"]


def one_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Fake tools of a node with one H200 (143,771 MiB), cuda-checkpoint and CRIU's CUDA plugin; CRIU's path."""
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    fake_tool(tmp_path, "nvidia-smi", 'case "$1" in --query-gpu=driver_version) echo "580.159.04";; '
                                      '--query-gpu=index,persistence_mode) echo "0, Enabled";; *) echo "0, 143771";; '
                                      'esac')
    fake_tool(tmp_path, "cuda-checkpoint", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gates_module, "cuda_plugin_dir", lambda _libdir: "/usr/local/lib/criu")
    return criu


def test_the_image_must_fit_where_it_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.15 engine on an H200 is a 21 GiB image (plus the host memory); on tmpfs it is RAM twice."""
    criu = one_h200(tmp_path, monkeypatch)
    mounts = tmp_path / "mounts"
    mounts.write_text(f"tmpfs {tmp_path} tmpfs rw 0 0\n")
    real = gates_module.images.filesystem
    monkeypatch.setattr(gates_module.images, "filesystem",
                        lambda path: {**real(path, mounts), "free_bytes": 10 * 2**30})
    monkeypatch.setattr(gates_module, "mem_available_bytes", lambda: 40 * 2**30)
    reasons, facts = gates("criu", criu=criu, gpus=[0], gpu_memory_fraction=0.15, network_lock="skip",
                           images_dir=tmp_path / "images")
    assert facts["images_dir"]["fs_type"] == "tmpfs" and facts["images_dir"]["in_ram"] is True
    assert reasons == [
        f"the image holds the engine's GPU memory (>= 21.1 GiB) but {tmp_path / 'images'} (tmpfs) has 10.0 GiB free",
        "dumping moves 21.1 GiB of GPU memory to host RAM and writes it again to tmpfs: 42.1 GiB needed, "
        "40.0 GiB available"]


# --- a quiesced engine, and the staging folder ------------------------------------------------------


def test_a_quiesced_engine_needs_sleep_mode_in_its_launch(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    bare = {"argv": ["vllm", "serve", "/m"], "env": {}}
    reasons, _ = gates("criu", criu=criu, network_lock="skip", quiesce="sleep", launch=bare)
    assert reasons == ["quiesce sleep needs the engine started with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 "
                       "(the plan adds them)"]
    planned = {"argv": ["vllm", "serve", "/m", "--enable-sleep-mode"], "env": {"VLLM_SERVER_DEV_MODE": "1"}}
    assert gates("criu", criu=criu, network_lock="skip", quiesce="sleep", launch=planned)[0] == []
    assert gates("criu", criu=criu, network_lock="skip", launch=bare)[0] == []  # unquiesced: nothing asked


def test_a_quiesced_image_holds_the_weights_not_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.9 engine on an H200 asleep: not 126 GiB of GPU memory but its weights (the model folder's files)."""
    criu = one_h200(tmp_path, monkeypatch)
    real = gates_module.images.filesystem
    monkeypatch.setattr(gates_module.images, "filesystem", lambda path: {**real(path), "free_bytes": 1 * 2**30})
    monkeypatch.setattr(gates_module, "mem_available_bytes", lambda: 120 * 2**30)
    model = tmp_path / "model"
    model.mkdir()
    with (model / "model.safetensors").open("wb") as fh:
        fh.truncate(3 * 2**30)  # sparse: 3 GiB of "weights"
    launch = {"argv": ["vllm", "serve", str(model), "--enable-sleep-mode"], "env": {"VLLM_SERVER_DEV_MODE": "1"}}
    common = {"criu": criu, "gpus": [0], "gpu_memory_fraction": 0.9, "network_lock": "skip", "model": str(model),
              "launch": launch, "images_dir": tmp_path / "images"}
    reasons, facts = gates("criu", quiesce="sleep", **common)
    assert reasons == [f"the image holds the weights the sleep backs up (>= 3.0 GiB) but {tmp_path / 'images'} "
                       f"({facts['images_dir']['fs_type']}) has 1.0 GiB free"]
    assert facts["quiesce"] == {"asked": "sleep", "image_at_least_bytes": 3 * 2**30}
    assert gates("criu", quiesce="sleep2", **common)[0] == []  # level 2 keeps no weights
    unquiesced, _ = gates("criu", **common)
    assert unquiesced[0].startswith("the image holds the engine's GPU memory (>= 126.4 GiB)")


def test_the_staging_folder_must_be_in_ram(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    reasons, facts = gates("criu", criu=criu, network_lock="skip", stage_dir=tmp_path / "stage")
    if facts["stage_dir"]["in_ram"]:
        pytest.skip(f"{tmp_path} is on tmpfs here")
    assert reasons == [f"image_source tmpfs stages the images in RAM, but {tmp_path / 'stage'} is on "
                       f"{facts['stage_dir']['fs_type']} ({facts['stage_dir']['mount']})"]
    shm, _ = gates("criu", criu=criu, network_lock="skip", stage_dir=Path("/dev/shm/gpu-campaign-gate-test"))
    assert shm == []
