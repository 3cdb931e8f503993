"""The vllm_images role's controller-side wheelhouse builder, offline against wheels made here."""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import json
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BUILDER = Path(__file__).resolve().parents[2] / "roles/vllm_images/files/build_wheelhouse.py"
PROBE = BUILDER.with_name("installed_distributions.py")


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    mod = name.replace("-", "_")
    dist = f"{mod}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Provides-Extra: {e}\n" for e in sorted({r.split('extra == "')[1].rstrip('"')
                                                              for r in requires if 'extra == "' in r}))
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{mod}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{mod}/__init__.py", f"VERSION = {version!r}\n")
        whl.writestr(f"{dist}/METADATA", meta)
        whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}/RECORD", "")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """whtest-app needs lib>=1 (the node has 0.5), mid (which needs leaf; the node has leaf 2.0) and,
    only on Python 2, old; heavy only for its extra."""
    folder = tmp_path / "index"
    folder.mkdir()
    make_wheel(folder, "whtest-app", "1.0", ("whtest-lib>=1", "whtest-mid", 'whtest-old; python_version < "3"',
                                             'whtest-heavy; extra == "gpu"'))
    make_wheel(folder, "whtest-mid", "1.0", ("whtest-leaf",))
    make_wheel(folder, "whtest-leaf", "2.0")
    make_wheel(folder, "whtest-lib", "0.5")
    make_wheel(folder, "whtest-lib", "1.0")
    make_wheel(folder, "whtest-old", "1.0")
    make_wheel(folder, "whtest-heavy", "1.0")
    return folder


def node_json(tmp_path: Path, packages: dict[str, str]) -> Path:
    probe = json.loads(subprocess.run([sys.executable, "-I", str(PROBE)], capture_output=True, text=True,
                                      check=True).stdout)
    probe["packages"] = packages
    path = tmp_path / "node.json"
    path.write_text(json.dumps(probe))
    return path


def build(tmp_path: Path, index: Path, *extra: str, node: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(BUILDER), "--node", str(node_json(tmp_path, node or {})), "--dest",
            str(tmp_path / "wh"), "--pip-arg=--no-index", f"--pip-arg=--find-links={index}", *extra]
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"}  # no site pip config: offline and exact
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=env)


def manifest(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "wh" / "wheelhouse.json").read_text())


def test_only_what_the_node_lacks_is_downloaded_and_node_versions_are_kept(tmp_path: Path, index: Path) -> None:
    done = build(tmp_path, index, "whtest-app==1.0", node={"whtest-lib": "0.5", "whtest-leaf": "2.0"})
    assert done.returncode == 0, done.stderr
    assert "wheelhouse: built 2 wheels" in done.stdout
    assert "whtest-lib 0.5 on the node; whtest-app 1.0 asks whtest-lib>=1" in done.stdout
    m = manifest(tmp_path)
    assert {n: w["version"] for n, w in m["wheels"].items()} == {"whtest-app": "1.0", "whtest-mid": "1.0"}
    assert m["wheels"]["whtest-mid"]["needed_by"] == "whtest-app 1.0"
    assert m["from_node"] == {"whtest-lib": "0.5", "whtest-leaf": "2.0"}
    assert sorted(p.name for p in (tmp_path / "wh").glob("*.whl")) == [
        "whtest_app-1.0-py3-none-any.whl", "whtest_mid-1.0-py3-none-any.whl"]


def test_same_inputs_are_unchanged_and_an_exclude_drops_a_subtree_and_its_stale_wheel(tmp_path: Path,
                                                                                    index: Path) -> None:
    assert build(tmp_path, index, "whtest-app==1.0").returncode == 0
    assert set(manifest(tmp_path)["wheels"]) == {"whtest-app", "whtest-lib", "whtest-mid", "whtest-leaf"}
    again = build(tmp_path, index, "whtest-app==1.0")
    assert again.stdout.splitlines()[0] == "wheelhouse: unchanged"
    dropped = build(tmp_path, index, "whtest-app==1.0", "--exclude", "whtest-mid")
    assert dropped.returncode == 0, dropped.stderr
    assert set(manifest(tmp_path)["wheels"]) == {"whtest-app", "whtest-lib"}  # leaf only came through mid
    assert not list((tmp_path / "wh").glob("whtest_mid*")) and not list((tmp_path / "wh").glob("whtest_leaf*"))


def test_override_replaces_the_resolved_version(tmp_path: Path, index: Path) -> None:
    done = build(tmp_path, index, "whtest-app==1.0", "--override", "whtest-lib==0.5")
    assert done.returncode == 0, done.stderr
    assert manifest(tmp_path)["wheels"]["whtest-lib"]["version"] == "0.5"


def test_unresolvable_and_malformed_inputs_say_what(tmp_path: Path, index: Path) -> None:
    missing = build(tmp_path, index, "whtest-nothing==1.0")
    assert missing.returncode == 2
    assert "pip could not resolve whtest-nothing==1.0" in missing.stderr
    bad = build(tmp_path, index, "whtest-app==1.0", "--override", "whtest-lib")
    assert bad.returncode == 2 and "--override 'whtest-lib': write NAME==VERSION" in bad.stderr
    (tmp_path / "broken.json").write_text("{}")
    done = subprocess.run([sys.executable, str(BUILDER), "--node", str(tmp_path / "broken.json"), "--dest",
                           str(tmp_path / "wh"), "x==1"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "missing key 'python'" in done.stderr


def test_a_node_that_has_everything_gets_an_empty_wheelhouse(tmp_path: Path, index: Path) -> None:
    node = {"whtest-app": "1.0", "whtest-lib": "1.0", "whtest-mid": "1.0", "whtest-leaf": "2.0"}
    done = build(tmp_path, index, "whtest-app==1.0", node=node)
    assert done.returncode == 0, done.stderr
    assert "wheelhouse: built 0 wheels" in done.stdout
    assert manifest(tmp_path)["wheels"] == {} and manifest(tmp_path)["from_node"]["whtest-app"] == "1.0"


def test_an_extra_asked_for_later_still_brings_its_dependencies(tmp_path: Path, index: Path) -> None:
    done = build(tmp_path, index, "whtest-app==1.0", "whtest-app[gpu]==1.0")
    assert done.returncode == 0, done.stderr
    assert manifest(tmp_path)["wheels"]["whtest-heavy"]["needed_by"] == "whtest-app 1.0"


def test_a_kept_node_version_reached_again_is_reported_once(tmp_path: Path) -> None:
    """LMCache beside vLLM on the H200: a package walked again for a new extra said the same
    "node version kept" line each time (protobuf, eight times)."""
    folder = tmp_path / "index"
    folder.mkdir()
    make_wheel(folder, "whtest-mid", "1.0", ("whtest-leaf>=3", 'whtest-a; extra == "a"', 'whtest-b; extra == "b"'))
    make_wheel(folder, "whtest-app", "1.0", ("whtest-mid[b]",))
    for name in ("whtest-a", "whtest-b"):
        make_wheel(folder, name, "1.0")
    make_wheel(folder, "whtest-leaf", "3.0")
    done = build(tmp_path, folder, "whtest-mid[a]==1.0", "whtest-app==1.0", node={"whtest-leaf": "2.0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("node version kept: whtest-leaf 2.0 on the node") == 1, done.stdout
    assert sorted(manifest(tmp_path)["wheels"]) == ["whtest-a", "whtest-app", "whtest-b", "whtest-mid"]


def test_it_prints_the_folder_the_role_looks_in_by_the_roles_own_formula(tmp_path: Path, index: Path) -> None:
    done = build(tmp_path, index, "whtest-app==1.0", "--role-dir", "/srv/wh", node={"whtest-lib": "1.0"})
    assert done.returncode == 0, done.stderr
    printed = done.stdout.strip().splitlines()[-1].removeprefix("role looks in: ")
    # The role's vars/main.yml, rendered by Ansible itself with the same inputs.
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = BUILDER.parents[1]
    loader = DataLoader()
    role_vars = {k: trust_as_template(v) if isinstance(v, str) else v
                 for k, v in loader.load_from_file(str(role / "vars" / "main.yml")).items()}
    variables = {**role_vars, "vllm_images_controller_wheelhouse_dir": "/srv/wh",
                 "vllm_images_pip_requirements": ["whtest-app==1.0"], "vllm_images_pip_no_deps": False,
                 "__vllm_images_node_python": {"stdout": (tmp_path / "node.json").read_text()}}
    rendered = Templar(loader=loader, variables=variables).template(variables["__vllm_images_local"])
    assert printed == str(rendered).strip()
    assert printed.startswith("/srv/wh/cp3")


# --- --sdist: a package's source distribution carried in the wheelhouse, for a build on the node ---

def test_sdist_from_a_find_links_folder_lands_in_the_wheelhouse_once(tmp_path: Path, index: Path) -> None:
    (index / "whtest_app-1.0.tar.gz").write_bytes(b"MOCK sdist")
    (index / "whtest_app-1.1.tar.gz").write_bytes(b"another version")
    done = build(tmp_path, index, "--sdist", "whtest-app==1.0", "whtest-app==1.0")
    assert done.returncode == 0, done.stderr
    wanted = tmp_path / "wh" / "whtest_app-1.0.tar.gz"
    digest = hashlib.sha256(b"MOCK sdist").hexdigest()
    assert f"sdist: {wanted} (from {index}; sha256 {digest})" in done.stdout.splitlines()
    assert wanted.read_bytes() == b"MOCK sdist" and not (tmp_path / "wh" / "whtest_app-1.1.tar.gz").exists()
    assert done.stdout.splitlines()[-1].startswith("role looks in: ")  # still the last line
    again = build(tmp_path, index, "--sdist", "whtest-app==1.0", "whtest-app==1.0")
    assert f"sdist: {wanted} (already there; sha256 {digest})" in again.stdout.splitlines()


def test_sdist_missing_or_malformed_says_where_it_looked(tmp_path: Path, index: Path) -> None:
    missing = build(tmp_path, index, "--sdist", "whtest-app==1.0", "whtest-app==1.0")
    assert missing.returncode == 2
    assert f"build_wheelhouse: no source distribution of whtest-app==1.0 in {index}" in missing.stderr
    bad = build(tmp_path, index, "--sdist", "whtest-app", "whtest-app==1.0")
    assert bad.returncode == 2 and "--sdist 'whtest-app': write NAME==VERSION" in bad.stderr


def _fetch_sdist() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_sdist", BUILDER.with_name("fetch_sdist.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def simple_index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A PEP 503 index over real HTTP on this machine: /simple/whtest-src/ links to a wheel, another
    version's sdist and whtest_src-2.0.tar.gz (a relative link, with its sha256)."""
    root = tmp_path / "served"
    (root / "files").mkdir(parents=True)
    (root / "files" / "whtest_src-2.0.tar.gz").write_bytes(b"MOCK sdist 2.0")
    digest = hashlib.sha256(b"MOCK sdist 2.0").hexdigest()
    page = root / "simple" / "whtest-src"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        '<html><body><a href="../../files/whtest_src-2.0-py3-none-any.whl">w</a>'
        '<a href="../../files/whtest_src-1.0.tar.gz">old</a>'
        f'<a href="../../files/whtest_src-2.0.tar.gz#sha256={digest}">whtest_src-2.0.tar.gz</a></body></html>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *_: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/", root
    finally:
        server.shutdown()
        server.server_close()


def test_sdist_from_an_index_is_fetched_and_checked_against_its_sha256(tmp_path: Path,
                                                                       simple_index: tuple[str, Path]) -> None:
    fetch_sdist = _fetch_sdist()
    url, root = simple_index
    said = fetch_sdist.fetch("whtest_src==2.0", tmp_path / "wh", ["--index-url", url])
    assert said.startswith(f"sdist: {tmp_path / 'wh' / 'whtest_src-2.0.tar.gz'} (from {url}whtest-src/; sha256 ")
    assert (tmp_path / "wh" / "whtest_src-2.0.tar.gz").read_bytes() == b"MOCK sdist 2.0"
    (root / "files" / "whtest_src-2.0.tar.gz").write_bytes(b"tampered")
    tampered = r"whtest_src-2[.]0[.]tar[.]gz: sha256 [0-9a-f]{64}, the index says"
    with pytest.raises(fetch_sdist.SdistError, match=tampered):
        fetch_sdist.fetch("whtest-src==2.0", tmp_path / "wh2", [f"--index-url={url}"])
    assert not list((tmp_path / "wh2").iterdir())
    with pytest.raises(fetch_sdist.SdistError, match="nowhere"):
        fetch_sdist.fetch("whtest-src==2.0", tmp_path / "wh3", ["--no-index", "--index-url", url])
