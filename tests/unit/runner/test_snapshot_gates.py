"""Snapshot gates on the node, each refusal with its message (fake tools say so in their names)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodetools import snapshot
from nodetools.snapshot import gates

CRIU_OK = 'case "$1" in --version) echo "Version: 4.2.1";; check) echo "Looks good.";; esac'


def fake_tool(tmp_path: Path, name: str, script: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_missing_criu(tmp_path: Path) -> None:
    reasons, facts = gates("criu", str(tmp_path / "no-criu"), "", "cuda-checkpoint", [], 1, "/m", "", "vllm")
    assert reasons == [f"CRIU not found ({tmp_path / 'no-criu'}): the criu role builds it from source"]
    assert facts["criu_version"] is None


def test_debian_12_criu_is_too_old(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-3.17", 'echo "Version: 3.17.1"')
    reasons, _ = gates("criu", criu, "", "cuda-checkpoint", [], 1, "/m", "", "vllm")
    assert reasons == ["CRIU 3.17.1 is too old (needs >= 4.1: older releases fail 'criu check' on kernels >= 6.13)"]


def test_failing_criu_check(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-4.2", 'case "$1" in --version) echo "Version: 4.2.1";; '
                                               'check) echo "Error: kernel lacks X" >&2; exit 1;; esac')
    reasons, facts = gates("criu", criu, "", "cuda-checkpoint", [], 1, "/m", "", "vllm")
    assert reasons == ["'criu check' fails: Error: kernel lacks X"]
    assert facts["criu_version"] == "4.2.1"


def test_gpu_engine_needs_the_cuda_plugin_and_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, no cuda-checkpoint
    monkeypatch.delenv("CRIU_LIBS_DIR", raising=False)
    monkeypatch.setattr(snapshot, "PLUGIN_DIRS", (str(tmp_path / "usr-lib-criu"),))  # this machine may have one
    reasons, _ = gates("criu", criu, str(tmp_path / "plugins"), "cuda-checkpoint", [4], 1, "/m", "", "vllm")
    assert any(r.startswith("CRIU's CUDA plugin (cuda_plugin.so) is in none of ") for r in reasons)
    assert "no GPU: cuda-checkpoint needs an NVIDIA GPU and driver" in reasons


def test_tp2_needs_a_driver_that_restores_cuda_ipc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path, "nvidia-smi", 'case "$1" in --query-gpu=driver_version) echo "580.159.04";; '
                                      '--query-gpu=index,persistence_mode) echo "0, Enabled"; echo "1, Disabled";; '
                                      '*) echo "0, 143771"; echo "1, 143771";; esac')
    fake_tool(tmp_path, "cuda-checkpoint", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    reasons, facts = gates("cuda_checkpoint", "criu", "", "cuda-checkpoint", [0, 1], 2, "/m", "", "vllm")
    assert facts["driver_major"] == 580
    assert "TP=2 uses CUDA IPC, whose checkpoint/restore needs driver >= 610; this node has 580" in reasons
    assert "persistence mode is off on GPU(s) 1: cuda-checkpoint restore needs it" in reasons


def test_vllm_snapshot_needs_a_remote_model_and_revision(tmp_path: Path) -> None:
    criu = fake_tool(tmp_path, "fake-criu-ok", CRIU_OK)
    reasons, _ = gates("vllm_snapshot", criu, "", "cuda-checkpoint", [], 2, "/mnt/models/q", "main",
                       str(tmp_path / "no-vllm"))
    assert reasons == [
        "snapshot create requires an immutable remote model: give a model id, not a local path",
        "snapshot create requires a 40-character --revision (the model's commit hash)",
        "vllm snapshot supports TP1 only (this engine has TP=2)",
        f"'{tmp_path / 'no-vllm'} snapshot' is not available (needs vLLM with the snapshot command)",
    ]
