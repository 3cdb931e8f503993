"""Build the MOCK artefacts the GPU-stack role scenarios install in their containers.

Nothing here contains NVIDIA software. Every package version ends in ``mock1``, every package
description starts with ``MOCK``, and every program the packages ship is named ``mock-*``
(the packages link the real command names to them where a role calls that command):

* NVIDIA driver 580 packages as NVIDIA's CUDA repository names them (``nvidia-dkms-580-open``,
  ``nvidia-utils-580``, ``nvidia-compute-utils-580``, ``libnvidia-compute-580``,
  ``nvidia-fabricmanager-580``), each at 580.159.04 and at a newer 580.159.05, so a test can
  show that the role installs the pinned version and not the newest. ``nvidia-compute-utils``
  ships ``nvidia-persistenced.service`` (running mock-nvidia-persistenced, ``--no-persistence-mode``
  as Ubuntu's unit does), ``nvidia-fabricmanager`` ships ``nvidia-fabricmanager.service``.
  The mocks record their state under /run/mock-nvidia, where mock-nvidia-smi reads it.
* NVIDIA Container Toolkit packages at 1.17.8 and a newer 1.18.0; ``nvidia-ctk`` is
  mock-nvidia-ctk, which edits /etc/docker/daemon.json the way ``nvidia-ctk runtime configure`` does.
* ``mock_vllm-0.24.0-py3-none-any.whl``: the stand-in for a pinned vLLM in a wheelhouse.
* Two docker-archive tarballs of tiny images tagged ``rt-mock/...``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAINTAINER = "gpu-campaign-runner role tests <noreply@example.invalid>"

DRIVER_VERSIONS = ["580.159.04", "580.159.05"]
TOOLKIT_VERSIONS = ["1.17.8", "1.18.0"]


def unit(description: str, exec_start: str) -> str:
    return (
        f"[Unit]\nDescription={description}\n\n[Service]\nType=simple\nExecStart={exec_start}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def build_deb(out: Path, name: str, version: str, description: str, *, depends: str = "",
              files: dict[str, tuple[str, int]] | None = None, links: dict[str, str] | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        control = [f"Package: {name}", f"Version: {version}", "Architecture: amd64", f"Maintainer: {MAINTAINER}",
                   "Section: misc", "Priority: optional"]
        if depends:
            control.append(f"Depends: {depends}")
        control.append(f"Description: MOCK {description}\n"
                       " role-test stand-in built by tests/roles/gpu_mocks; no NVIDIA software inside.")
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        marker = root / "usr/share/doc" / name / "MOCK"
        marker.parent.mkdir(parents=True)
        marker.write_text(f"{name} {version} is a mock package for role tests.\n")
        for path, (content, mode) in (files or {}).items():
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(content)
            dest.chmod(mode)
        for path, target in (links or {}).items():
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(target)
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root),
                        str(out / f"{name}_{version}_amd64.deb")], check=True, stdout=subprocess.DEVNULL)


def driver_debs(out: Path) -> None:
    persistenced = (HERE / "mock-nvidia-persistenced").read_text()
    fabricmanager = (HERE / "mock-nv-fabricmanager").read_text()
    for upstream in DRIVER_VERSIONS:
        version = f"{upstream}-0mock1"
        branch = upstream.split(".")[0]
        build_deb(out, f"libnvidia-compute-{branch}", version, f"NVIDIA compute libraries {upstream}")
        build_deb(out, f"nvidia-dkms-{branch}-open", version, f"NVIDIA open kernel modules {upstream}")
        build_deb(out, f"nvidia-utils-{branch}", version, f"NVIDIA driver utilities {upstream}",
                  depends=f"libnvidia-compute-{branch} (= {version})")
        build_deb(out, f"nvidia-compute-utils-{branch}", version, f"NVIDIA compute utilities {upstream}",
                  depends=f"libnvidia-compute-{branch} (= {version})",
                  files={"/usr/lib/mock-nvidia/mock-nvidia-persistenced": (persistenced, 0o755),
                         "/lib/systemd/system/nvidia-persistenced.service": (unit(
                             "MOCK NVIDIA Persistence Daemon",
                             "/usr/lib/mock-nvidia/mock-nvidia-persistenced --user root"
                             " --no-persistence-mode --verbose"),
                             0o644)})
        build_deb(out, f"nvidia-fabricmanager-{branch}", version, f"NVIDIA Fabric Manager {upstream}",
                  files={"/usr/lib/mock-nvidia/mock-nv-fabricmanager": (fabricmanager, 0o755),
                         "/lib/systemd/system/nvidia-fabricmanager.service": (unit(
                             "MOCK NVIDIA fabric manager service",
                             "/usr/lib/mock-nvidia/mock-nv-fabricmanager"
                             " -c /usr/share/nvidia/nvswitch/fabricmanager.cfg"),
                             0o644)})


def toolkit_debs(out: Path) -> None:
    ctk = (HERE / "mock-nvidia-ctk").read_text()
    runtime = (HERE / "mock-nvidia-container-runtime").read_text()
    lib = "/usr/lib/mock-nvidia-container-toolkit"
    for upstream in TOOLKIT_VERSIONS:
        version = f"{upstream}-0mock1"
        build_deb(out, "libnvidia-container1", version, f"NVIDIA container runtime library {upstream}")
        build_deb(out, "libnvidia-container-tools", version, f"NVIDIA container runtime library tools {upstream}",
                  depends=f"libnvidia-container1 (= {version})")
        build_deb(out, "nvidia-container-toolkit-base", version, f"NVIDIA Container Toolkit base {upstream}",
                  files={f"{lib}/mock-nvidia-ctk": (ctk, 0o755),
                         f"{lib}/mock-nvidia-container-runtime": (runtime, 0o755)},
                  links={"/usr/bin/nvidia-ctk": f"{lib}/mock-nvidia-ctk",
                         "/usr/bin/nvidia-container-runtime": f"{lib}/mock-nvidia-container-runtime"})
        build_deb(out, "nvidia-container-toolkit", version, f"NVIDIA Container Toolkit {upstream}",
                  depends=f"nvidia-container-toolkit-base (= {version}), libnvidia-container-tools (= {version})")


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def mock_vllm_wheel(out: Path, version: str = "0.24.0") -> None:
    dist = f"mock_vllm-{version}.dist-info"
    files = {
        "mock_vllm/__init__.py": (f'"""MOCK stand-in for a pinned vLLM in role tests."""\n'
                                  f'__version__ = "{version}"\n').encode(),
        f"{dist}/METADATA": (f"Metadata-Version: 2.1\nName: mock-vllm\nVersion: {version}\n"
                             "Summary: MOCK stand-in for vllm in the vllm_images role test\n").encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: build_mocks.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/top_level.txt": b"mock_vllm\n",
    }
    record = [record_line(p, d) for p, d in files.items()] + [f"{dist}/RECORD,,"]
    with zipfile.ZipFile(out / f"mock_vllm-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in files.items():
            whl.writestr(zipfile.ZipInfo(path, (2026, 1, 1, 0, 0, 0)), data)
        whl.writestr(zipfile.ZipInfo(f"{dist}/RECORD", (2026, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")


def tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1767225600
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def mock_image(out: Path, tag: str, filename: str) -> None:
    """A docker-archive (``docker save`` format) of one layer holding a marker file."""
    layer = tar_bytes({"MOCK-IMAGE": f"{tag} is a mock image for role tests\n".encode()})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
        "config": {"Labels": {"rt.mock": "true"}, "Cmd": ["/MOCK-IMAGE"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "tests/roles/gpu_mocks/build_mocks.py"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_dir = hashlib.sha256(layer).hexdigest()
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [f"{layer_dir}/layer.tar"]}]).encode()
    (out / filename).write_bytes(tar_bytes({config_name: config, f"{layer_dir}/layer.tar": layer,
                                            "manifest.json": manifest}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debs", type=Path, required=True)
    parser.add_argument("--wheels", type=Path, required=True)
    parser.add_argument("--images", type=Path, required=True)
    args = parser.parse_args()
    for folder in (args.debs, args.wheels, args.images):
        folder.mkdir(parents=True, exist_ok=True)
    driver_debs(args.debs)
    toolkit_debs(args.debs)
    mock_vllm_wheel(args.wheels)
    mock_image(args.images, "rt-mock/vllm-openai:v0.24.0", "rt-mock-vllm-openai-v0.24.0.tar")
    mock_image(args.images, "rt-mock/lmcache-vllm-openai:v0.5.6", "rt-mock-lmcache-vllm-openai-v0.5.6.tar")


if __name__ == "__main__":
    main()
