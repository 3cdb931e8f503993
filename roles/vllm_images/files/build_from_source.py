# SPDX-License-Identifier: MIT
"""Build one source distribution into a wheel on the node, against the node's own torch.

    build_from_source.py --sdist SDIST --out DIR --name NAME [--env KEY=VALUE ...] [--pythonpath DIR] [--check]

Run by the vllm_images role with the Python that will import the result (``python -I``; the build
itself gets the environment below). A CUDA extension such as LMCache's ``lmcache.cuda_ops`` must be
compiled against the torch it is loaded into: a wheel built for another torch fails to import
(``undefined symbol``) and the package falls back to slow torch ops. So the build runs
``pip wheel --no-build-isolation --no-deps --no-index`` with this Python and ``--pythonpath`` (the
``--target`` folder) on PYTHONPATH, where the node's torch and the build's own needs are.

DIR is named after the sdist's checksum and the build's inputs: a DIR that already holds a wheel is
the build, done (nothing is compiled, no compiler is needed). Otherwise the compilers come first, the
way torch's ``cpp_extension`` finds them: nvcc in ``$CUDA_HOME/bin`` (or ``$CUDA_PATH/bin``) when
that is set, else on PATH, else in /usr/local/cuda/bin; the host compiler is ``$CXX`` or ``c++``.
A missing one stops here with one line saying what is missing and the alternative. The build writes
into ``DIR.partial`` and renames it to DIR when pip made exactly one wheel of NAME, so a failed or
interrupted build leaves no wheel that looks done; its whole log stays in ``DIR.log``.

Prints one JSON line: {"built": bool, "wheel": path, "file", "name", "version", "sha256"}; with
``--check`` (Ansible's check mode) nothing is built, and a build still to do prints {"built": false}.
Exit codes: 0 done; 2 bad arguments; 3 a compiler is missing; 4 the build failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

BUILD_TIMEOUT_S = 3 * 3600  # LMCache's CUDA kernels for one arch: minutes; a hung compiler: stopped
LOG_TAIL_LINES = 25
WHEEL_NAME = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-([A-Za-z0-9_.!+]+)(?:-\d[^-]*)?"
                        r"-[^-]+-[^-]+-[^-]+\.whl$")
ALTERNATIVE = ("or build the wheel elsewhere for this node's Python and torch and pass it with "
               "vllm_images_local_wheels (docs/offload.md, 'Building the extension for the node's torch')")


class BuildError(Exception):
    """What stops the build, in one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(wheel: Path, built: bool) -> dict:
    match = WHEEL_NAME.match(wheel.name)
    if not match:
        raise BuildError(f"{wheel}: not a wheel file name (NAME-VERSION-PY-ABI-PLATFORM.whl)", 4)
    return {"built": built, "wheel": str(wheel), "file": wheel.name, "name": canonical(match.group(1)),
            "version": match.group(2), "sha256": sha256(wheel)}


def find_nvcc(env: dict[str, str]) -> tuple[str | None, str]:
    """nvcc as torch's cpp_extension finds CUDA, and where it looked."""
    for key in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(key):
            nvcc = Path(env[key]) / "bin" / "nvcc"
            return (str(nvcc) if os.access(nvcc, os.X_OK) else None), f"{key}/bin ({nvcc})"
    on_path = shutil.which("nvcc", path=env.get("PATH", ""))
    if on_path:
        return on_path, "PATH"
    fixed = Path("/usr/local/cuda/bin/nvcc")
    return (str(fixed) if os.access(fixed, os.X_OK) else None), "PATH and /usr/local/cuda/bin (CUDA_HOME unset)"


def find_cxx(env: dict[str, str]) -> tuple[str | None, str]:
    """The host C++ compiler torch's cpp_extension calls: $CXX, else c++."""
    wanted = env.get("CXX") or "c++"
    where = f"CXX={wanted}" if env.get("CXX") else "c++ on PATH (CXX unset)"
    return shutil.which(wanted, path=env.get("PATH", "")), where


def build_env(args: argparse.Namespace, nvcc: str) -> dict[str, str]:
    env = {**os.environ, **args.env}
    cuda_home = str(Path(nvcc).resolve().parent.parent)
    env.setdefault("CUDA_HOME", cuda_home)
    env["PATH"] = os.pathsep.join([str(Path(nvcc).parent), env.get("PATH", "")])
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, args.env.get("PYTHONPATH", "")) if p)
    return env


def build(args: argparse.Namespace) -> dict:
    out, sdist = Path(args.out), Path(args.sdist)
    done = sorted(out.glob("*.whl")) if out.is_dir() else []
    if done:
        return describe(done[0], built=False)
    if args.check:
        return {"built": False}
    if not sdist.is_file():
        raise BuildError(f"{sdist}: no such source distribution on the node", 2)
    env = {**os.environ, **args.env}
    nvcc, nvcc_where = find_nvcc(env)
    cxx, cxx_where = find_cxx(env)
    missing = ([f"no nvcc (looked in {nvcc_where})"] if not nvcc else []) + (
        [f"no host C++ compiler ({cxx_where})"] if not cxx else [])
    if missing or nvcc is None:
        raise BuildError(f"cannot build {args.name} from {sdist.name} on this node: {'; '.join(missing)}. Install "
                         "CUDA's toolkit (nvcc) and a C++ compiler it accepts on the node, or name them in the item's "
                         f"env (CUDA_HOME, CXX); {ALTERNATIVE}", 3)
    partial, log = out.with_name(out.name + ".partial"), out.with_name(out.name + ".log")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
            "--disable-pip-version-check", "--wheel-dir", str(partial), str(sdist)]
    with log.open("w") as fh:
        try:
            status = str(subprocess.run(argv, env=build_env(args, nvcc), stdout=fh, stderr=subprocess.STDOUT,
                                        cwd=partial.parent, timeout=BUILD_TIMEOUT_S, check=False).returncode)
        except subprocess.TimeoutExpired:
            status = f"stopped after {BUILD_TIMEOUT_S} s"
    wheels = sorted(partial.glob("*.whl"))
    if status != "0" or len(wheels) != 1:
        tail = [line[:300] for line in log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]]
        raise BuildError(f"pip wheel of {sdist.name} failed (exit {status}, {len(wheels)} wheels; whole log in "
                         f"{log}):\n" + "\n".join(tail), 4)
    made = describe(wheels[0], built=True)
    if made["name"] != canonical(args.name):
        raise BuildError(f"{sdist.name} built {wheels[0].name}, not a wheel of {args.name}: check the item's name", 4)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return {**made, "wheel": str(out / wheels[0].name)}


def env_pair(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise argparse.ArgumentTypeError(f"--env {value!r}: write KEY=VALUE")
    return key, val


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sdist", required=True, help="the source distribution on the node")
    p.add_argument("--out", required=True, help="the folder the wheel goes to (named after the build's inputs)")
    p.add_argument("--name", required=True, help="the distribution the sdist must build")
    p.add_argument("--env", action="append", type=env_pair, default=[], metavar="KEY=VALUE")
    p.add_argument("--pythonpath", default="", help="the --target folder the build imports torch through")
    p.add_argument("--check", action="store_true", help="say what is built, build nothing")
    args = p.parse_args(argv)
    args.env = dict(args.env)
    try:
        print(json.dumps(build(args)))
    except BuildError as exc:
        print(f"build_from_source: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
