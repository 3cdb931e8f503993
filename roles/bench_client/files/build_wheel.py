"""Build a wheel of this project's node-side package (nodetools) on the controller, with no build backend.

The wheel is reproducible: files in sorted order with a fixed timestamp, so the same sources give
the same bytes, and its version carries a hash of the sources ("0.1.0+g1a2b3c4d5e6f") so a node
can tell whether it already has this code. Prints one JSON line: {"wheel": path, "version": v, "new": bool}.

    build_wheel.py --project DIR --out DIR --name gpu-campaign-nodetools --requires aiohttp==3.14.5 ...
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

STAMP = (2026, 1, 1, 0, 0, 0)


def sources(project: Path, package: str) -> list[Path]:
    root = project / package
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def project_version(project: Path) -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', (project / "pyproject.toml").read_text(), re.MULTILINE)
    if not match:
        sys.exit(f"no version in {project / 'pyproject.toml'}")
    return match.group(1)


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--package", default="nodetools")
    parser.add_argument("--name", default="gpu-campaign-nodetools")
    parser.add_argument("--requires", action="append", default=[])
    parser.add_argument("--requires-python", default=">=3.11")
    args = parser.parse_args()

    files = sources(args.project, args.package)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(args.project).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update("\n".join(args.requires).encode())
    version = f"{project_version(args.project)}+g{digest.hexdigest()[:12]}"
    dist = args.name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {args.name}", f"Version: {version}",
                "Summary: Node-side programs of gpu-campaign-runner (engine stand-in, timers, load generator)",
                f"Requires-Python: {args.requires_python}"]
    metadata += [f"Requires-Dist: {req}" for req in args.requires]
    members = {path.relative_to(args.project).as_posix(): path.read_bytes() for path in files}
    members[f"{info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    members[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: roles/bench_client/files/build_wheel.py\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    members[f"{info}/top_level.txt"] = f"{args.package}\n".encode()
    record = [record_line(name, data) for name, data in members.items()] + [f"{info}/RECORD,,"]
    members[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()

    args.out.mkdir(parents=True, exist_ok=True)
    wheel = args.out / f"{dist}-{version}-py3-none-any.whl"
    new = not wheel.exists()
    if new:
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as whl:
            for name, data in members.items():
                entry = zipfile.ZipInfo(name, STAMP)
                entry.external_attr = 0o644 << 16
                whl.writestr(entry, data)
        tmp.replace(wheel)
    print(json.dumps({"wheel": str(wheel), "version": version, "new": new}))


if __name__ == "__main__":
    main()
