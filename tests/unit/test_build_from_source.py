"""The vllm_images role's node-side source build (files/build_from_source.py), run for real with pip.

The sdists here carry their own PEP 517 backend (nothing to install offline) that calls nvcc and the
C++ compiler as a CUDA extension's build does. No CUDA toolkit is assumed on the test machine: the
compilers are MOCK stand-ins (shell scripts that answer ``--version``) named through CUDA_HOME and
CXX, the variables torch's cpp_extension reads.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/vllm_images/files/build_from_source.py"

BACKEND = '''
import os, shutil, subprocess, zipfile

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if os.environ.get("WHTEST_FAIL"):
        raise RuntimeError("nvcc fatal: Unsupported gpu architecture 'compute_900' (MOCK)")
    nvcc = shutil.which("nvcc")
    subprocess.run([nvcc, "--version"], check=True)
    subprocess.run([os.environ.get("CXX", "c++"), "--version"], check=True)
    seen = {k: os.environ.get(k) for k in ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "PYTHONPATH")}
    seen["nvcc"] = nvcc
    name = "%(mod)s-%(version)s-py3-none-any.whl"
    dist = "%(mod)s-%(version)s.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        whl.writestr("%(mod)s/__init__.py", "SEEN = %%r\\n" %% seen)
        whl.writestr(dist + "/METADATA", "Metadata-Version: 2.1\\nName: %(name)s\\nVersion: %(version)s\\n")
        whl.writestr(dist + "/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        whl.writestr(dist + "/RECORD", "")
    return name
'''


def make_sdist(folder: Path, name: str = "whtest-ext", version: str = "1.0", builds: str | None = None) -> Path:
    """An sdist of ``name`` whose backend builds a wheel of ``builds`` (default: itself)."""
    built = builds or name
    top = f"{name.replace('-', '_')}-{version}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": BACKEND % {"mod": built.replace("-", "_"), "name": built, "version": version},
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    path = folder / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def mock_cuda(tmp_path: Path) -> Path:
    """A MOCK CUDA_HOME whose bin/ holds a MOCK nvcc and a MOCK c++ (no toolkit on the test machine)."""
    home = tmp_path / "mock-cuda"
    (home / "bin").mkdir(parents=True)
    for tool in ("nvcc", "c++"):
        (home / "bin" / tool).write_text(f"#!/bin/sh\necho 'MOCK {tool}'\n")
        (home / "bin" / tool).chmod(0o755)
    return home


def run(sdist: Path, out: Path, *extra: str, name: str = "whtest-ext", env: dict | None = None,
        ) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": os.devnull, "HOME": str(out.parent)}
    return subprocess.run([sys.executable, "-I", str(SCRIPT), "--sdist", str(sdist), "--out", str(out), "--name", name,
                           *extra], capture_output=True, text=True, check=False, env={**base, **(env or {})})


def test_it_builds_with_the_found_compilers_the_items_env_and_the_target_folder_then_reuses_the_build(
        tmp_path: Path, mock_cuda: Path) -> None:
    sdist, out = make_sdist(tmp_path), tmp_path / "built" / "whtest-ext-key"
    env_args = (f"--env=CUDA_HOME={mock_cuda}", f"--env=CXX={mock_cuda}/bin/c++", "--env=TORCH_CUDA_ARCH_LIST=9.0")
    done = run(sdist, out, *env_args, "--pythonpath", "/opt/vllm/site")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["built"] is True and made["name"] == "whtest-ext" and made["version"] == "1.0"
    assert made["wheel"] == str(out / "whtest_ext-1.0-py3-none-any.whl") and Path(made["wheel"]).is_file()
    assert not (out.parent / "whtest-ext-key.partial").exists() and (out.parent / "whtest-ext-key.log").is_file()
    # What the build saw: the nvcc found (its folder put on PATH), the item's env, the --target folder.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--target", str(target), made["wheel"]],
                   check=True, capture_output=True, env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": os.devnull})
    seen = subprocess.run([sys.executable, "-c", "import whtest_ext; print(whtest_ext.SEEN)"],
                          env={"PYTHONPATH": str(target)}, capture_output=True, text=True, check=True).stdout
    assert ast.literal_eval(seen) == {"CUDA_HOME": str(mock_cuda), "TORCH_CUDA_ARCH_LIST": "9.0",
                                      "PYTHONPATH": "/opt/vllm/site", "nvcc": f"{mock_cuda}/bin/nvcc"}
    # Done once: the second run builds nothing and needs no compiler.
    again = run(sdist, out, "--env=CUDA_HOME=/nonexistent")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {**made, "built": False}


def test_a_missing_compiler_stops_before_the_build_and_says_what_and_the_alternative(tmp_path: Path) -> None:
    out = tmp_path / "built" / "k"
    done = run(make_sdist(tmp_path), out, "--env=CUDA_HOME=/nonexistent", "--env=CXX=/nonexistent/g++")
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        "build_from_source: cannot build whtest-ext from whtest_ext-1.0.tar.gz on this node: no nvcc (looked in "
        "CUDA_HOME/bin (/nonexistent/bin/nvcc)); no host C++ compiler (CXX=/nonexistent/g++). Install CUDA's toolkit "
        "(nvcc) and a C++ compiler it accepts on the node, or name them in the item's env (CUDA_HOME, CXX); or build "
        "the wheel elsewhere for this node's Python and torch and pass it with vllm_images_local_wheels "
        "(docs/offload.md, 'Building the extension for the node's torch')"]
    assert not out.exists() and not out.with_name("k.partial").exists()


def test_check_mode_builds_nothing(tmp_path: Path, mock_cuda: Path) -> None:
    out = tmp_path / "built" / "k"
    done = run(make_sdist(tmp_path), out, f"--env=CUDA_HOME={mock_cuda}", "--check")
    assert done.returncode == 0 and json.loads(done.stdout) == {"built": False}
    assert not out.exists()


def test_a_failed_build_leaves_no_wheel_and_shows_the_logs_tail(tmp_path: Path, mock_cuda: Path) -> None:
    out = tmp_path / "built" / "k"
    env_args = (f"--env=CUDA_HOME={mock_cuda}", f"--env=CXX={mock_cuda}/bin/c++", "--env=WHTEST_FAIL=1")
    done = run(make_sdist(tmp_path), out, *env_args)
    assert done.returncode == 4
    assert f"pip wheel of whtest_ext-1.0.tar.gz failed (exit 1, 0 wheels; whole log in {out}.log)" in done.stderr
    assert "Unsupported gpu architecture 'compute_900' (MOCK)" in done.stderr
    assert not out.exists() and "Unsupported gpu architecture" in out.with_name("k.log").read_text()


def test_an_sdist_that_builds_another_distribution_is_refused(tmp_path: Path, mock_cuda: Path) -> None:
    out = tmp_path / "built" / "k"
    sdist = make_sdist(tmp_path, builds="whtest-other")
    done = run(sdist, out, f"--env=CUDA_HOME={mock_cuda}", f"--env=CXX={mock_cuda}/bin/c++")
    assert done.returncode == 4
    assert "built whtest_other-1.0-py3-none-any.whl, not a wheel of whtest-ext" in done.stderr
    assert not out.exists()
