"""Write the scenario's MOCK replacements of the resolved mock-vllm 0.24.0, as an lmcache built for
the node's torch would replace PyPI's:

* ``mock_vllm-0.24.0+local-py3-none-any.whl``, a wheel "built elsewhere" (vllm_images_local_wheels):
  ``mock_vllm.local_build`` imports only from it (the import check that passes); ``mock_vllm.cuda_ops``
  fails the way an extension built for another torch fails (the import check that fails).
* ``mock_vllm-0.24.0+node.tar.gz``, a source distribution the role builds on the node
  (vllm_images_build_from_source). Its build backend is in the sdist itself (no setuptools needed
  offline); it calls the nvcc and the C++ compiler it is given, as a CUDA extension's build does, and
  writes what it saw into ``mock_vllm.built_on_node``.
* ``mock_vllm-0.24.0+stubs.tar.gz``, the same whose build also needs a build-only package the node
  lacks, as LMCache 0.5.6's imports ``grpc_tools`` (``[build-system] requires`` names it, pinned to
  another version than the one given: versions are not compared), and
  ``mock_grpc_tools-1.84.0-py3-none-any.whl`` and ``-1.84.1-`` (stand-ins for grpcio-tools), the
  wheels given in the item's ``build_wheels``. Its build imports ``mock_grpc_tools`` and writes where
  from into ``mock_vllm.built_on_node.STUBS``.

    python make_mock_builds.py DIR
"""

import base64
import hashlib
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL_VERSION, SDIST_VERSION, STUBS_VERSION = "0.24.0+local", "0.24.0+node", "0.24.0+stubs"
BUILD_ONLY_VERSIONS = ("1.84.0", "1.84.1")
STAMP = (2026, 1, 1, 0, 0, 0)
# The words of an extension built for another torch, as the H200 gave them for LMCache's.
CUDA_OPS = ('raise ImportError("/opt/vllm/site/mock_vllm/cuda_ops.so: undefined symbol: '
            '_ZN3c1017SymbolicShapeMeta18init_is_contiguousEv (MOCK)")\n')
BACKEND = '''"""MOCK PEP 517 backend: "compiles" with the given nvcc and C++ compiler, then writes the wheel."""
import base64, hashlib, os, shutil, subprocess, zipfile

VERSION = "%(version)s"
GENERATE_STUBS = %(stubs)s


def _record(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%%s,sha256=%%s,%%d" %% (path, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    nvcc = shutil.which("nvcc")
    cxx = os.environ.get("CXX", "c++")
    for tool in (nvcc, cxx):  # a CUDA extension's build calls both; a missing one fails here
        subprocess.run([tool, "--version"], check=True)
    stubs = None
    if GENERATE_STUBS:  # as LMCache's build_py runs "from grpc_tools import protoc"
        import mock_grpc_tools
        stubs = os.path.dirname(mock_grpc_tools.__file__)
    dist = "mock_vllm-%%s.dist-info" %% VERSION
    files = {
        "mock_vllm/__init__.py": '__version__ = "%%s"\\n' %% VERSION,
        "mock_vllm/built_on_node.py": (
            "NVCC = %%r\\nCUDA_HOME = %%r\\nARCH = %%r\\nPYTHONPATH = %%r\\nSTUBS = %%r\\n" %% (
                nvcc, os.environ.get("CUDA_HOME"), os.environ.get("TORCH_CUDA_ARCH_LIST"),
                os.environ.get("PYTHONPATH"), stubs)),
        dist + "/METADATA": "Metadata-Version: 2.1\\nName: mock-vllm\\nVersion: %%s\\n" %% VERSION,
        dist + "/WHEEL": "Wheel-Version: 1.0\\nGenerator: mock_backend\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    name = "mock_vllm-%%s-py3-none-any.whl" %% VERSION
    record = [_record(p, d.encode()) for p, d in files.items()] + [dist + "/RECORD,,"]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
        whl.writestr(dist + "/RECORD", "\\n".join(record) + "\\n")
    return name
'''


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(out: Path, module: str, version: str, files: dict[str, str]) -> None:
    """``out/{module}-{version}-py3-none-any.whl`` of ``files`` plus its METADATA, WHEEL and RECORD."""
    dist = f"{module}-{version}.dist-info"
    files = {**files,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: {version}\n",
             f"{dist}/WHEEL": ("Wheel-Version: 1.0\nGenerator: make_mock_builds.py\nRoot-Is-Purelib: true\n"
                                "Tag: py3-none-any\n")}
    record = [record_line(p, d.encode()) for p, d in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(out / f"{module}-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in files.items():
            whl.writestr(zipfile.ZipInfo(path, STAMP), data)
        whl.writestr(zipfile.ZipInfo(f"{dist}/RECORD", STAMP), "\n".join(record) + "\n")


def local_wheel(out: Path) -> None:
    write_wheel(out, "mock_vllm", WHEEL_VERSION, {
        "mock_vllm/__init__.py": f'"""MOCK stand-in for vLLM, built elsewhere."""\n__version__ = "{WHEEL_VERSION}"\n',
        "mock_vllm/local_build.py": "BUILT_ELSEWHERE = True\n",
        "mock_vllm/cuda_ops.py": CUDA_OPS,
    })


def build_only_wheel(out: Path, version: str) -> None:
    write_wheel(out, "mock_grpc_tools", version, {
        "mock_grpc_tools/__init__.py": (f'"""MOCK stand-in for grpcio-tools: only a build imports it."""\n'
                                        f'__version__ = "{version}"\n'),
    })


def sdist(out: Path, version: str, requires: list[str]) -> None:
    top = f"mock_vllm-{version}"
    files = {
        "pyproject.toml": (f'[build-system]\nrequires = {json.dumps(requires)}\nbuild-backend = "mock_backend"\n'
                           'backend-path = ["."]\n'),
        "mock_backend.py": BACKEND % {"version": version, "stubs": bool(requires)},
        "PKG-INFO": f"Metadata-Version: 2.1\nName: mock-vllm\nVersion: {version}\n",
    }
    with tarfile.open(out / f"{top}.tar.gz", "w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size, info.mtime, info.mode = len(data), 1767225600, 0o644
            tar.addfile(info, io.BytesIO(data))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    local_wheel(out)
    for version in BUILD_ONLY_VERSIONS:
        build_only_wheel(out, version)
    sdist(out, SDIST_VERSION, [])
    sdist(out, STUBS_VERSION, ["mock-grpc-tools==1.78.0"])  # the way LMCache 0.5.6 pins grpcio-tools


if __name__ == "__main__":
    main()
