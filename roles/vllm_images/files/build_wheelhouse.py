# SPDX-License-Identifier: MIT
"""Build, on the controller, the wheels a node lacks for pinned requirements (vLLM and its needs).

    build_wheelhouse.py --node NODE.json --dest DIR [--platform TAG ...] [--override NAME==VER ...]
                        [--exclude NAME ...] [--no-deps] [--pip-arg ARG ...] [--sdist NAME==VER ...]
                        REQUIREMENT...

NODE.json is what ``installed_distributions.py`` printed on the node: its Python, glibc and the
packages it already has. A GPU node's Python usually holds torch and CUDA libraries of the right
build; reinstalling them from an index is gigabytes and can break the node's CUDA. So the
requirements are resolved by pip for the node's Python and platform with the node's packages
*seen as installed* (stub metadata on an otherwise empty path), then the dependency graph is walked
from the requirements with the node's markers, stopping at every package the node has: a node
version that does not satisfy a requirement is reported, never replaced. ``--override`` pins a
version pip's resolution got wrong (vLLM 0.24's xgrammar needs apache-tvm-ffi newer than the
flashinfer pin); ``--exclude`` leaves out what a model does not need. Only what is left is
downloaded (``pip download --no-deps``), and ``wheelhouse.json`` says what each wheel is and why.

A wheelhouse already built for the same inputs is left as it is (prints ``wheelhouse: unchanged``);
otherwise it prints ``wheelhouse: built``. Stale wheels of an earlier build are removed. It then
prints where the vllm_images role looks for this wheelhouse (``role looks in: DIR``, under
``--role-dir``, the role's ``vllm_images_controller_wheelhouse_dir``): one folder per node Python,
platform and requirement set, so a wheelhouse built by hand and carried to another controller is
found there, and nowhere else (a role that finds none builds one, which fails offline).

``--sdist NAME==VERSION`` also puts that package's source distribution into ``--dest``
(``fetch_sdist.py``: found as pip would, never built here) and prints ``sdist: PATH``: what a node
compiles against its own torch (the role's ``vllm_images_build_from_source``), carried with the wheels.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fetch_sdist import SdistError, fetch  # beside this file: a script's folder is on sys.path
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

MANIFEST = "wheelhouse.json"
ROLE_DIR = "/var/tmp/gpu-campaign-wheelhouse"  # the role's vllm_images_controller_wheelhouse_dir default
DEFAULT_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


class WheelhouseError(Exception):
    """A problem the user must fix: the message names what and where."""


def load_node(path: Path) -> dict:
    try:
        node = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WheelhouseError(f"{path}: not the JSON of installed_distributions.py: {exc}") from exc
    for key in ("python", "python_full", "platform", "packages"):
        if key not in node:
            raise WheelhouseError(f"{path}: missing key {key!r} (made by installed_distributions.py?)")
    return node


def platform_tags(node: dict, wanted: list[str]) -> list[str]:
    """manylinux tags the node's glibc can load (pip matches each tag exactly, so list them all)."""
    if wanted:
        return wanted
    match = re.search(r"(\d+)\.(\d+)", node.get("glibc") or "")
    machine = node["platform"].split("-")[-1]
    if not match:
        return [t for t in DEFAULT_PLATFORMS if t.endswith(machine)]
    top = int(match.group(2))
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(top, 16, -1)]
    return [*tags, f"manylinux2014_{machine}", f"linux_{machine}"]


def marker_env(node: dict) -> dict[str, str]:
    machine = node["platform"].split("-")[-1]
    return {
        "python_version": node["python"], "python_full_version": node["python_full"],
        "platform_machine": machine, "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "implementation_version": node["python_full"], "platform_release": "", "platform_version": "",
    }


def cache_key(args: argparse.Namespace, node: dict, platforms: list[str]) -> str:
    blob = json.dumps({
        "requirements": args.requirements, "override": sorted(args.override), "exclude": sorted(args.exclude),
        "no_deps": args.no_deps, "pip_args": args.pip_arg, "platforms": platforms,
        "python": node["python_full"], "packages": node["packages"],
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def unchanged(dest: Path, key: str) -> bool:
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("key") == key and all((dest / w["file"]).is_file() for w in manifest["wheels"].values())


def pip_target_args(node: dict, platforms: list[str]) -> list[str]:
    nodot = node["python"].replace(".", "")
    return ["--only-binary=:all:", "--python-version", node["python"], "--implementation", "cp",
            "--abi", f"cp{nodot}", "--abi", "abi3", "--abi", "none",
            *(f"--platform={tag}" for tag in [*platforms, "any"])]


def _pip_errors(stderr: str) -> str:
    """pip's last lines, without the noise of find-links folders that do not exist."""
    return "\n".join([ln for ln in stderr.splitlines() if "is ignored" not in ln][-15:])


def write_stubs(root: Path, packages: dict[str, str]) -> None:
    """A dist-info per node package: pip then sees the node's packages as installed."""
    for name, version in packages.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def resolve(node: dict, platforms: list[str], requirements: list[str], pip_args: list[str], tmp: Path) -> dict:
    """pip's own resolution (metadata only, nothing installed) as {name: report item}."""
    stubs, pipsrc, report = tmp / "stubs", tmp / "pipsrc", tmp / "report.json"
    write_stubs(stubs, {n: v for n, v in node["packages"].items() if canonicalize_name(n) != "pip"})
    import pip  # only to find the copy the controller runs

    # A private copy of pip on an otherwise empty sys.path (-S: no site-packages), so the
    # controller's own packages never count as the node's.
    shutil.copytree(Path(pip.__file__).parent, pipsrc / "pip")
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; from pip._internal.cli.main import main; "
            "sys.exit(main(sys.argv[3:]))")
    argv = [sys.executable, "-S", "-c", code, str(pipsrc), str(stubs), "install", "--dry-run", "--quiet",
            "--disable-pip-version-check", "--no-warn-script-location", "--report", str(report),
            *pip_target_args(node, platforms), *pip_args, *requirements]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise WheelhouseError("pip could not resolve " + " ".join(requirements) + f" for Python {node['python']} "
                              f"on {platforms[0]}:\n" + _pip_errors(done.stderr))
    items = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): i for i in items}


def walk(requirements: list[str], resolved: dict, node: dict, overrides: dict[str, str], excludes: set[str],
         env: dict[str, str]) -> tuple[dict, dict, list[str], list[str]]:
    """Follow the requirements for the node's markers; stop at what the node has or excludes."""
    have = {canonicalize_name(n): v for n, v in node["packages"].items()}
    take: dict[str, dict] = {}
    from_node: dict[str, str] = {}
    mismatches: list[str] = []
    missing: list[str] = []
    queue = [(Requirement(r), "requested") for r in requirements]

    def follow(name: str, extras: set[str]) -> None:
        """Queue what ``name`` needs with these extras (the empty extra is the package itself)."""
        for line in resolved[name]["metadata"].get("requires_dist") or []:
            try:
                dep = Requirement(line)
            except InvalidRequirement:
                continue
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in extras):
                queue.append((dep, f"{name} {take[name]['version']}"))

    while queue:
        req, parent = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in excludes:
            continue
        if name in have:
            try:
                ok = req.specifier.contains(Version(have[name]), prereleases=True)
            except InvalidVersion:
                ok = False
            if parent != "requested" or ok:  # a requested version the node lacks is installed
                from_node[name] = have[name]
                said = f"{name} {have[name]} on the node; {parent} asks {name}{req.specifier}"
                if not ok and said not in mismatches:  # a package reached by many paths is said once
                    mismatches.append(said)
                continue
        if name in take:  # seen before: only extras it was not asked with yet add anything
            extras = set(req.extras) - take[name]["extras"]
            take[name]["extras"] |= extras
            follow(name, extras)
            continue
        if name not in resolved:
            missing.append(f"{name} (needed by {parent})")
            continue
        take[name] = {"version": overrides.get(name, resolved[name]["metadata"]["version"]),
                      "extras": set(req.extras), "needed_by": parent}
        follow(name, {"", *req.extras})
    return take, from_node, mismatches, missing


def download(node: dict, platforms: list[str], take: dict, pip_args: list[str], dest: Path) -> dict[str, str]:
    """pip download --no-deps of exactly the chosen versions; returns name -> wheel file."""
    pins = [f"{name}=={info['version']}" for name, info in sorted(take.items())]
    if not pins:  # the node has everything
        return {}
    with tempfile.TemporaryDirectory(prefix="wheelhouse-dl-") as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                "--dest", tmp, *pip_target_args(node, platforms), *pip_args, *pins]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise WheelhouseError("pip could not download the wheels:\n" + _pip_errors(done.stderr))
        files: dict[str, str] = {}
        for wheel in Path(tmp).glob("*.whl"):
            files[canonicalize_name(wheel.name.split("-")[0])] = wheel.name
            wheel.replace(dest / wheel.name)
    lost = sorted(set(take) - set(files))
    if lost:
        raise WheelhouseError(f"pip downloaded no wheel for: {', '.join(lost)}")
    return files


def parse_pins(values: list[str], what: str) -> dict[str, str]:
    pins = {}
    for value in values:
        name, sep, version = value.partition("==")
        if not sep or not name or not version:
            raise WheelhouseError(f"--{what} {value!r}: write NAME==VERSION")
        pins[canonicalize_name(name)] = version
    return pins


def build(args: argparse.Namespace) -> str:
    node = load_node(Path(args.node))
    for req in args.requirements:
        try:
            Requirement(req)
        except InvalidRequirement as exc:
            raise WheelhouseError(f"requirement {req!r}: {exc}") from exc
    platforms = platform_tags(node, args.platform)
    dest = Path(args.dest)
    key = cache_key(args, node, platforms)
    if unchanged(dest, key):
        return "wheelhouse: unchanged"
    dest.mkdir(parents=True, exist_ok=True)
    overrides = parse_pins(args.override, "override")
    excludes = {canonicalize_name(n) for n in args.exclude}
    if args.no_deps:
        pinned = [Requirement(r) for r in args.requirements]
        take = {canonicalize_name(r.name): {"version": next(iter(r.specifier)).version, "needed_by": "requested"}
                for r in pinned}
        from_node, mismatches, missing = {}, [], []
    else:
        with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
            resolved = resolve(node, platforms, args.requirements, args.pip_arg, Path(tmp))
        take, from_node, mismatches, missing = walk(args.requirements, resolved, node, overrides, excludes,
                                                    marker_env(node))
    if missing:
        raise WheelhouseError("not in pip's resolution for the node (resolve on a controller whose Python is "
                              f"{node['python']}): " + "; ".join(missing))
    files = download(node, platforms, take, args.pip_arg, dest)
    manifest = {
        "key": key, "requirements": args.requirements, "python": node["python_full"], "platforms": platforms,
        "node_executable": node.get("executable"),
        "wheels": {n: {"version": take[n]["version"], "file": files[n], "needed_by": take[n]["needed_by"],
                       "bytes": (dest / files[n]).stat().st_size} for n in sorted(take)},
        "from_node": dict(sorted(from_node.items())), "node_version_mismatches": mismatches,
        "overrides": overrides, "excluded": sorted(excludes),
    }
    keep = {w["file"] for w in manifest["wheels"].values()}
    for stale in dest.glob("*.whl"):
        if stale.name not in keep:
            stale.unlink()
    tmp_manifest = dest / f".{MANIFEST}.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp_manifest.replace(dest / MANIFEST)
    size = sum(w["bytes"] for w in manifest["wheels"].values())
    lines = [f"wheelhouse: built {len(keep)} wheels ({size / 1e6:.0f} MB) in {dest} for Python {node['python']} "
             f"({platforms[0]}); the node has {len(from_node)} of the needed packages"]
    lines += [f"  node version kept: {m}" for m in mismatches]
    return "\n".join(lines)


def role_folder(role_dir: str, node: dict, requirements: list[str], no_deps: bool) -> str:
    """The folder the vllm_images role reads (its vars/main.yml ``__vllm_images_local``, same formula)."""
    # sha1 as the role's Jinja hash('sha1'): it names a folder, it guards nothing.
    key = hashlib.sha1(",".join([*requirements, str(no_deps)]).encode()).hexdigest()[:12]
    return f"{role_dir.rstrip('/')}/cp{str(node['python']).replace('.', '')}-{node['platform']}-{key}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("requirements", nargs="+", metavar="REQUIREMENT", help="pinned, e.g. vllm==0.24.0")
    p.add_argument("--node", required=True, help="the node's installed_distributions.py JSON")
    p.add_argument("--dest", required=True, help="the wheelhouse folder")
    p.add_argument("--platform", action="append", default=[], help="platform tag (default: from the node's glibc)")
    p.add_argument("--override", action="append", default=[], metavar="NAME==VERSION")
    p.add_argument("--exclude", action="append", default=[], metavar="NAME")
    p.add_argument("--no-deps", action="store_true", help="only the listed requirements, nothing they need")
    p.add_argument("--pip-arg", action="append", default=[], help="extra pip argument (an index mirror, ...)")
    p.add_argument("--sdist", action="append", default=[], metavar="NAME==VERSION",
                   help="also fetch this package's source distribution into --dest (for a build on the node)")
    p.add_argument("--role-dir", default=ROLE_DIR,
                   help=f"the role's vllm_images_controller_wheelhouse_dir (default {ROLE_DIR})")
    args = p.parse_args(argv)
    try:
        print(build(args))
        node = load_node(Path(args.node))
        for pin in args.sdist:
            print(fetch(pin, Path(args.dest), args.pip_arg))
        print(f"role looks in: {role_folder(args.role_dir, node, args.requirements, args.no_deps)}")
    except (WheelhouseError, SdistError) as exc:
        print(f"build_wheelhouse: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
