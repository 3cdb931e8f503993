# SPDX-License-Identifier: MIT
"""Build one source distribution into a wheel on the node, against the node's own torch.

    build_from_source.py --sdist SDIST --out DIR --name NAME [--env KEY=VALUE ...] [--pythonpath DIR]
                         [--build-wheels WHEELS] [--check]

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
WHEELS is a folder of wheels the build alone needs (LMCache's ``grpcio-tools``, which the node's
Python lacks): installed with ``pip install --no-index --no-deps --target DIR.build-deps`` (a fresh
folder each build, removed once it built) and put first on the build's PYTHONPATH; they never reach the
engine's install. Then every distribution that the sdist's ``pyproject.toml`` names in
``[build-system] requires`` must be installed in the build's environment (DIR.build-deps,
``--pythonpath``, the Python's own path), by name only: the point is to build against the node's
own torch and tools, whatever versions the sdist pins. A missing compiler or requirement stops here,
before pip runs, with one line saying what is missing and the fix. The build writes into
``DIR.partial`` and renames it to DIR when pip made exactly one wheel of NAME, so a failed or
interrupted build leaves no wheel that looks done; its whole log stays in ``DIR.log``.

Prints one JSON line: {"built": bool, "wheel": path, "file", "name", "version", "sha256"}; with
``--check`` (Ansible's check mode) nothing is built, and a build still to do prints {"built": false}.
Exit codes: 0 done; 2 bad arguments (a missing or unreadable sdist or pyproject.toml, pyproject.toml
over 1 MiB, no wheel in WHEELS); 3 a compiler or a build requirement is missing, or a build wheel does
not install for this Python; 4 the build failed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (vLLM still supports it): pip's own copy of tomli
    from pip._vendor import tomli as tomllib
try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # not in this Python: pip is (the build runs it), with its own copy
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

BUILD_TIMEOUT_S = 3 * 3600  # LMCache's CUDA kernels for one arch: minutes; a hung compiler: stopped
INSTALL_TIMEOUT_S = 600  # a few build wheels, offline: seconds
LOG_TAIL_LINES = 25
PYPROJECT_MAX_BYTES = 1 << 20  # LMCache 0.5.6's is 9 KB; the bound keeps an odd sdist from filling memory
WHEEL_NAME = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-([A-Za-z0-9_.!+]+)(?:-\d[^-]*)?"
                        r"-[^-]+-[^-]+-[^-]+\.whl$")
DOCS = "(docs/offload.md, 'Building the extension for the node's torch')"
ALTERNATIVE = ("or build the wheel elsewhere for this node's Python and torch and pass it with "
               f"vllm_images_local_wheels {DOCS}")
COMPILERS_FIX = ("Install CUDA's toolkit (nvcc) and a C++ compiler it accepts on the node, or name them in the item's "
                 "env (CUDA_HOME, CXX)")
REQUIRES_FIX = f"add wheels of them built for this node's Python to the item's build_wheels {DOCS}"


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


def python_env(args: argparse.Namespace, deps: Path | None) -> dict[str, str]:
    """The build's environment without its compilers: the build wheels' folder, then --pythonpath, first."""
    env = {**os.environ, **args.env}
    first = [p for p in (str(deps) if deps else "", args.pythonpath) if p]
    if first:
        env["PYTHONPATH"] = os.pathsep.join([*first, args.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def build_env(args: argparse.Namespace, nvcc: str, deps: Path | None) -> dict[str, str]:
    env = python_env(args, deps)
    cuda_home = str(Path(nvcc).resolve().parent.parent)
    env.setdefault("CUDA_HOME", cuda_home)
    env["PATH"] = os.pathsep.join([str(Path(nvcc).parent), env.get("PATH", "")])
    return env


def is_top_pyproject(member: str) -> bool:
    parts = [part for part in member.split("/") if part not in ("", ".")]
    return len(parts) == 2 and parts[1] == "pyproject.toml"  # TOP/pyproject.toml, as pip unpacks an sdist


def read_pyproject(sdist: Path) -> bytes | None:
    """The sdist's top-level pyproject.toml (.tar.gz or .zip), at most PYPROJECT_MAX_BYTES; None without one."""
    try:
        if sdist.name.endswith(".zip"):
            with zipfile.ZipFile(sdist) as archive:
                info = next((i for i in archive.infolist() if is_top_pyproject(i.filename) and not i.is_dir()), None)
                if info is None:
                    return None
                with archive.open(info) as fh:
                    data = fh.read(PYPROJECT_MAX_BYTES + 1)
        else:
            with tarfile.open(sdist, "r:*") as archive:
                member = next((m for m in archive if is_top_pyproject(m.name)), None)
                if member is None:
                    return None
                fh = archive.extractfile(member) if member.isfile() else None
                if fh is None:
                    raise BuildError(f"{sdist.name}: its {member.name} is not a regular file", 2)
                data = fh.read(PYPROJECT_MAX_BYTES + 1)
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as exc:
        raise BuildError(f"{sdist.name}: not a readable source distribution (.tar.gz or .zip): {exc}", 2) from exc
    if len(data) > PYPROJECT_MAX_BYTES:
        raise BuildError(f"{sdist.name}: its pyproject.toml is over {PYPROJECT_MAX_BYTES} bytes; not read, nothing "
                         "built", 2)
    return data


def build_requires(sdist: Path) -> list[str]:
    """The canonical names of what the sdist's [build-system] requires here (markers evaluated, versions dropped)."""
    data = read_pyproject(sdist)
    if data is None:
        return []
    try:
        table = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BuildError(f"{sdist.name}: its pyproject.toml is not TOML: {exc}", 2) from exc
    system = table.get("build-system", {})
    requires = system.get("requires", []) if isinstance(system, dict) else None
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise BuildError(f"{sdist.name}: its pyproject.toml's [build-system] requires is {requires!r}; expected a "
                         "list of requirement strings", 2)
    names = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise BuildError(f"{sdist.name}: its [build-system] requires {text!r}, not a requirement: {exc}",
                             2) from exc
        if requirement.marker is None or requirement.marker.evaluate():
            names.append(canonical(requirement.name))
    return list(dict.fromkeys(names))


def installed_names(env: dict[str, str]) -> set[str]:
    """The distributions the build's Python finds: its own path with the build's PYTHONPATH."""
    probe = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"], env=env,
                           capture_output=True, text=True, check=True, timeout=60)
    paths = [path for path in json.loads(probe.stdout) if path]
    return {canonical(name) for dist in importlib.metadata.distributions(path=paths)
            if (name := dist.metadata.get("Name"))}


def install_build_wheels(args: argparse.Namespace, deps: Path) -> None:
    """The build wheels, into a fresh DIR.build-deps (only the build imports them)."""
    folder = Path(args.build_wheels)
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        raise BuildError(f"--build-wheels {folder}: no wheel files there", 2)
    shutil.rmtree(deps, ignore_errors=True)
    deps.mkdir(parents=True)
    argv = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--quiet",
            "--disable-pip-version-check", "--no-warn-script-location", "--target", str(deps), *map(str, wheels)]
    try:
        done = subprocess.run(argv, env={**os.environ, **args.env}, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
        status, said = str(done.returncode), (done.stdout + done.stderr).strip().splitlines()
    except subprocess.TimeoutExpired:
        status, said = f"stopped after {INSTALL_TIMEOUT_S} s", []
    if status != "0":
        said_tail = " | ".join(line[:300] for line in said[-5:])
        raise BuildError(f"the build wheels {', '.join(w.name for w in wheels)} do not install for {sys.executable} "
                         f"(pip exit {status}): {said_tail}; the item's build_wheels must be built for this node's "
                         f"Python {DOCS}", 3)


def build(args: argparse.Namespace) -> dict:
    out, sdist = Path(args.out), Path(args.sdist)
    done = sorted(out.glob("*.whl")) if out.is_dir() else []
    if done:
        return describe(done[0], built=False)
    if args.check:
        return {"built": False}
    if not sdist.is_file():
        raise BuildError(f"{sdist}: no such source distribution on the node", 2)
    requires = build_requires(sdist)
    deps = out.with_name(out.name + ".build-deps") if args.build_wheels else None
    if deps:
        install_build_wheels(args, deps)
    # Only the build-system table: what a backend asks for on top (get_requires_for_build_wheel) is not known
    # without running it. Names only: the sdist pins its own release's torch, the build is for the node's.
    have = installed_names(python_env(args, deps)) if requires else set()
    absent = [name for name in requires if name not in have]
    env = {**os.environ, **args.env}
    nvcc, nvcc_where = find_nvcc(env)
    cxx, cxx_where = find_cxx(env)
    compilers = ([f"no nvcc (looked in {nvcc_where})"] if not nvcc else []) + (
        [f"no host C++ compiler ({cxx_where})"] if not cxx else [])
    looked = [f"--build-wheels ({deps})"] if deps else []
    looked += [f"--pythonpath ({args.pythonpath})"] if args.pythonpath else []
    looked += [f"{sys.executable}'s path"]
    problems = compilers + ([f"its [build-system] requires {', '.join(absent)}, not installed (looked in "
                             f"{', '.join(looked)})"] if absent else [])
    if problems or nvcc is None:
        fixes = "; ".join([*([COMPILERS_FIX] if compilers else []), *([REQUIRES_FIX] if absent else []), ALTERNATIVE])
        raise BuildError(f"cannot build {args.name} from {sdist.name} on this node: {'; '.join(problems)}. "
                         f"{fixes[0].upper()}{fixes[1:]}", 3)
    partial, log = out.with_name(out.name + ".partial"), out.with_name(out.name + ".log")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
            "--disable-pip-version-check", "--wheel-dir", str(partial), str(sdist)]
    with log.open("w") as fh:
        try:
            status = str(subprocess.run(argv, env=build_env(args, nvcc, deps), stdout=fh, stderr=subprocess.STDOUT,
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
    if deps:
        shutil.rmtree(deps, ignore_errors=True)  # built, never needed again; a failed build keeps them to retry by hand
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
    p.add_argument("--build-wheels", default="", metavar="WHEELS",
                   help="a folder of wheels only the build needs: into DIR.build-deps, first on its PYTHONPATH")
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
