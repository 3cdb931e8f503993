"""The vllm_images role's node-side source build (files/build_from_source.py), run for real with pip.

The sdists here carry their own PEP 517 backend (nothing to install offline) that calls nvcc and the
C++ compiler as a CUDA extension's build does. No CUDA toolkit is assumed on the test machine: the
compilers are MOCK stand-ins (shell scripts that answer ``--version``) named through CUDA_HOME and
CXX, the variables torch's cpp_extension reads. A build-only dependency (as LMCache's build imports
``grpc_tools``) is ``whtest-builddep``, a tiny real wheel this test writes; the test environment lacks it.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
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
    try:  # a build-only module, as LMCache's build imports grpc_tools: where it came from
        import whtest_builddep
        seen["builddep"] = os.path.dirname(os.path.dirname(whtest_builddep.__file__))
    except ImportError:
        seen["builddep"] = None
    name = "%(mod)s-%(version)s-py3-none-any.whl"
    dist = "%(mod)s-%(version)s.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        whl.writestr("%(mod)s/__init__.py", "SEEN = %%r\\n" %% seen)
        whl.writestr(dist + "/METADATA", "Metadata-Version: 2.1\\nName: %(name)s\\nVersion: %(version)s\\n")
        whl.writestr(dist + "/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        whl.writestr(dist + "/RECORD", "")
    return name
'''


def make_sdist(folder: Path, name: str = "whtest-ext", version: str = "1.0", builds: str | None = None,
               requires: tuple[str, ...] = (), pyproject_tail: str = "", fmt: str = "tar.gz") -> Path:
    """An sdist (.tar.gz or .zip) of ``name`` whose backend builds a wheel of ``builds`` (default: itself)."""
    built = builds or name
    top = f"{name.replace('-', '_')}-{version}"
    files = {
        "pyproject.toml": f'[build-system]\nrequires = {json.dumps(list(requires))}\nbuild-backend = "backend"\n'
                          f'backend-path = ["."]\n{pyproject_tail}',
        "backend.py": BACKEND % {"mod": built.replace("-", "_"), "name": built, "version": version},
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    path = folder / f"{top}.{fmt}"
    if fmt == "zip":
        with zipfile.ZipFile(path, "w") as archive:
            for member, text in files.items():
                archive.writestr(f"{top}/{member}", text)
        return path
    with tarfile.open(path, "w:gz") as tar:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def make_build_wheel(folder: Path, name: str = "whtest-builddep", version: str = "1.0") -> Path:
    """A tiny real wheel of a module only the build imports."""
    folder.mkdir(parents=True, exist_ok=True)
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(f"{mod}/__init__.py", "BUILD_ONLY = True\n")
        whl.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}/RECORD", "")
    return path


@pytest.fixture
def mock_cuda(tmp_path: Path) -> Path:
    """A MOCK CUDA_HOME whose bin/ holds a MOCK nvcc and a MOCK c++ (no toolkit on the test machine);
    each call is noted in ``calls`` beside bin/."""
    home = tmp_path / "mock-cuda"
    (home / "bin").mkdir(parents=True)
    for tool in ("nvcc", "c++"):
        (home / "bin" / tool).write_text(f"#!/bin/sh\necho {tool} >> '{home}/calls'\necho 'MOCK {tool}'\n")
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
                                      "PYTHONPATH": "/opt/vllm/site", "nvcc": f"{mock_cuda}/bin/nvcc",
                                      "builddep": None}
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


def compilers(mock_cuda: Path) -> tuple[str, str]:
    return f"--env=CUDA_HOME={mock_cuda}", f"--env=CXX={mock_cuda}/bin/c++"


def top_level(wheel: str) -> list[str]:
    """The top-level names a wheel installs (what reaches the engine's --target folder)."""
    with zipfile.ZipFile(wheel) as whl:
        return sorted({member.split("/")[0] for member in whl.namelist()})


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_a_build_requirement_the_node_lacks_stops_before_any_compiler_or_pip_and_names_it(
        tmp_path: Path, mock_cuda: Path, fmt: str) -> None:
    out = tmp_path / "built" / "k"
    sdist = make_sdist(tmp_path, requires=("pip", "whtest-builddep==1.78.0", "Whtest_Absent[extra]>=2"), fmt=fmt)
    done = run(sdist, out, *compilers(mock_cuda), "--pythonpath", str(tmp_path / "site"))
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"build_from_source: cannot build whtest-ext from whtest_ext-1.0.{fmt} on this node: its [build-system] "
        f"requires whtest-builddep, whtest-absent, not installed (looked in --pythonpath ({tmp_path / 'site'}), "
        f"{sys.executable}'s path). Add wheels of them built for this node's Python to the item's build_wheels "
        "(docs/offload.md, 'Building the extension for the node's torch'); or build the wheel elsewhere for this "
        "node's Python and torch and pass it with vllm_images_local_wheels (docs/offload.md, 'Building the extension "
        "for the node's torch')"]
    assert not (mock_cuda / "calls").exists(), "a compiler ran"
    assert not out.exists() and not out.with_name("k.partial").exists() and not out.with_name("k.log").exists()


def test_a_missing_compiler_and_a_missing_requirement_are_said_at_once(tmp_path: Path) -> None:
    done = run(make_sdist(tmp_path, requires=("whtest-builddep",)), tmp_path / "built" / "k",
               "--env=CUDA_HOME=/nonexistent", "--env=CXX=/nonexistent/g++")
    assert done.returncode == 3
    assert "no host C++ compiler (CXX=/nonexistent/g++); its [build-system] requires whtest-builddep, not installed" \
        in done.stderr
    assert "in the item's env (CUDA_HOME, CXX); add wheels of them built for this node's Python" in done.stderr


def test_build_wheels_are_installed_for_the_build_alone_first_on_its_path(tmp_path: Path, mock_cuda: Path) -> None:
    out, wheels = tmp_path / "built" / "k", tmp_path / "build-wheels"
    make_build_wheel(wheels)
    sdist = make_sdist(tmp_path, requires=("whtest-builddep",))
    done = run(sdist, out, *compilers(mock_cuda), "--build-wheels", str(wheels), "--pythonpath", "/opt/vllm/site")
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["built"] is True and (mock_cuda / "calls").read_text().split() == ["nvcc", "c++"]
    # The backend imported the build-only module from the build's own folder, first on PYTHONPATH ...
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--target", str(target), made["wheel"]],
                   check=True, capture_output=True, env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": os.devnull})
    seen = ast.literal_eval(subprocess.run(
        [sys.executable, "-c", "import whtest_ext; print(whtest_ext.SEEN)"], env={"PYTHONPATH": str(target)},
        capture_output=True, text=True, check=True).stdout)
    deps = f"{out}.build-deps"
    assert seen["builddep"] == deps and seen["PYTHONPATH"] == f"{deps}:/opt/vllm/site"
    # ... and it reaches neither the wheel built nor, once built, the node.
    assert top_level(made["wheel"]) == ["whtest_ext", "whtest_ext-1.0.dist-info"]
    assert not Path(deps).exists()


def test_the_versions_the_sdist_pins_are_not_compared(tmp_path: Path, mock_cuda: Path) -> None:
    """LMCache 0.5.6 pins torch==2.13.0 and setuptools<81; the node has torch 2.11 and setuptools 81, by design."""
    wheels = tmp_path / "build-wheels"
    make_build_wheel(wheels, version="1.0")
    requires = ("pip==0.0.1", "whtest-builddep==1.78.0", "whtest-windows-only; sys_platform == 'win32'")
    done = run(make_sdist(tmp_path, requires=requires), tmp_path / "built" / "k", *compilers(mock_cuda),
               "--build-wheels", str(wheels))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["built"] is True


def test_a_build_wheel_that_does_not_install_for_this_python_is_refused(tmp_path: Path, mock_cuda: Path) -> None:
    wheels = tmp_path / "build-wheels"
    wheels.mkdir()
    (wheels / "whtest_builddep-1.0-cp27-cp27mu-manylinux1_x86_64.whl").write_bytes(b"not for this Python")
    done = run(make_sdist(tmp_path, requires=("whtest-builddep",)), tmp_path / "built" / "k", *compilers(mock_cuda),
               "--build-wheels", str(wheels))
    assert done.returncode == 3
    assert "the build wheels whtest_builddep-1.0-cp27-cp27mu-manylinux1_x86_64.whl do not install for" in done.stderr
    assert not (mock_cuda / "calls").exists()


def test_an_oversized_pyproject_is_not_read(tmp_path: Path, mock_cuda: Path) -> None:
    out = tmp_path / "built" / "k"
    sdist = make_sdist(tmp_path, pyproject_tail="# padding\n" * (1 << 17))  # valid TOML, 1.25 MiB: pip would build it
    done = run(sdist, out, *compilers(mock_cuda))
    assert done.returncode == 2
    assert done.stderr.strip() == ("build_from_source: whtest_ext-1.0.tar.gz: its pyproject.toml is over 1048576 "
                                   "bytes; not read, nothing built")
    assert not (mock_cuda / "calls").exists() and not out.exists()
