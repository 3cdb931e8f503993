"""Which cuda-checkpoint acts: the role's marker beside it when its sha256 is the file's, else the content.

The marker is what the cuda_checkpoint role writes: ``<path>.json`` with ``tool`` ("nvidia" or
"cuda_checkpoint_api"), ``sha256`` and ``version``. NVIDIA's binary is stood in for by a FAKE ELF
compiled here that prints the first lines of NVIDIA's help (skipped without a C compiler).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nodetools.snapshot import cuda_tool
from tests.nodetools.fake_cuda import TOOL

FAKE_NVIDIA_C = r"""
#include <stdio.h>
int main(void) {
    puts("CUDA checkpoint and restore utility.");
    puts("Version 580.159.04. Copyright (C) 2026 NVIDIA Corporation. All rights reserved.");
    return 0;
}
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_nvidia_binary(tmp_path: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake NVIDIA cuda-checkpoint")
    source = tmp_path / "fake_nvidia_cuda_checkpoint.c"
    source.write_text(FAKE_NVIDIA_C)
    out = tmp_path / "bin" / "cuda-checkpoint"
    out.parent.mkdir()
    subprocess.run([cc, "-o", str(out), str(source)], check=True, capture_output=True)
    return out


def test_an_elf_that_speaks_of_checkpoints_is_nvidias_with_its_version(fake_nvidia_binary: Path) -> None:
    found = cuda_tool.identify(str(fake_nvidia_binary))
    assert found == {"asked": str(fake_nvidia_binary), "path": str(fake_nvidia_binary),
                     "sha256": sha256(fake_nvidia_binary), "tool": "nvidia", "version": "580.159.04",
                     "source": "content"}


def test_our_tool_is_known_by_its_text_also_behind_a_symlink(tmp_path: Path) -> None:
    link = tmp_path / "cuda-checkpoint"
    link.symlink_to(TOOL)
    found = cuda_tool.identify(str(link))
    assert found["tool"] == "cuda_checkpoint_api" and found["version"] is None and found["source"] == "content"
    assert found["resolves_to"] == str(TOOL) and found["sha256"] == sha256(TOOL)


def test_the_roles_marker_is_believed_when_its_sha256_is_the_files(tmp_path: Path) -> None:
    installed = tmp_path / "cuda-checkpoint"
    shutil.copy(TOOL, installed)
    marker = tmp_path / "cuda-checkpoint.json"
    marker.write_text(json.dumps({"tool": "cuda_checkpoint_api", "sha256": sha256(installed), "version": "0.3"}))
    found = cuda_tool.identify(str(installed))
    assert (found["tool"], found["version"], found["source"], found["marker"]) == (
        "cuda_checkpoint_api", "0.3", "marker", str(marker))
    marker.write_text(json.dumps({"tool": "cuda_checkpoint_api", "sha256": f"sha256:{sha256(installed)}"}))
    assert cuda_tool.identify(str(installed))["source"] == "marker"  # the role's "sha256:<hex>" form too
    marker.write_text(json.dumps({"tool": "nvidia", "sha256": "0" * 64, "version": "580.159.04"}))  # stale
    found = cuda_tool.identify(str(installed))
    assert found["tool"] == "cuda_checkpoint_api" and found["source"] == "content"
    assert found["marker_problem"] == f"its sha256 {'0' * 64} is not the file's: identified by content"
    marker.write_text("{not json")
    assert cuda_tool.identify(str(installed))["marker_problem"].startswith("unreadable: ")


def test_the_roles_default_marker_elsewhere_is_read_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The role writes /usr/local/lib/cuda-checkpoint.json by default, not beside the tool."""
    installed = tmp_path / "bin" / "cuda-checkpoint"
    installed.parent.mkdir()
    shutil.copy(TOOL, installed)
    role_marker = tmp_path / "lib" / "cuda-checkpoint.json"
    role_marker.parent.mkdir()
    monkeypatch.setattr(cuda_tool, "ROLE_MARKER", role_marker)
    role_marker.write_text(json.dumps({"tool": "cuda_checkpoint_api", "path": str(installed),
                                       "sha256": sha256(installed), "source": "project", "version": "0.1.0"}))
    found = cuda_tool.identify(str(installed))
    assert (found["source"], found["marker"], found["version"]) == ("marker", str(role_marker), "0.1.0")
    assert "marker_problem" not in found
    other = tmp_path / "bin" / "other-tool"
    other.write_text("#!/bin/sh\n")  # the marker speaks of another file: ignored
    assert cuda_tool.identify(str(other))["source"] == "content"


def test_anything_else_is_unknown_and_nothing_is_not_found(tmp_path: Path) -> None:
    script = tmp_path / "cuda-checkpoint"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    assert cuda_tool.identify(str(script))["tool"] == "unknown"
    assert cuda_tool.identify(str(tmp_path / "absent")) == {"asked": str(tmp_path / "absent"), "path": None,
                                                             "tool": None, "source": "not found"}


def test_the_plugin_finds_a_given_tool_as_cuda_checkpoint(tmp_path: Path) -> None:
    copy = tmp_path / "cuda_checkpoint_api.py"  # shipped without its executable bit
    shutil.copy(TOOL, copy)
    copy.chmod(0o644)
    path = cuda_tool.plugin_path(str(copy), tmp_path / "shim")
    assert path is not None and path.startswith(f"{tmp_path / 'shim'}:")
    done = subprocess.run(["cuda-checkpoint", "--help"], capture_output=True, text=True, check=False,
                          env={"PATH": path})
    assert done.returncode == 0 and "not NVIDIA's tool" in done.stdout
    assert cuda_tool.plugin_path("cuda-checkpoint", tmp_path / "shim2") is None  # CRIU's own PATH
