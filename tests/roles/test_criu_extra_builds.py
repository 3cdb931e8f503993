"""The criu role's extra builds: the checks of ``criu_extra_builds`` (roles/criu/tasks/validate.yml,
run by ansible-playbook on the controller as playbooks/provision/preflight.yml runs them), the
per-build names the role derives (vars/main.yml), and the commit a git-archive tarball names
(roles/criu/files/criu_tarball_commit.py). The builds themselves run in the criu molecule scenario."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMMIT_SCRIPT = REPO / "roles" / "criu" / "files" / "criu_tarball_commit.py"
SHA = "ab" * 32
# The role's input checks, as preflight runs them (include_role, tasks_from: validate); public, so that a
# task after them sees the role's vars.
VALIDATE = {"ansible.builtin.include_role": {"name": "criu", "tasks_from": "validate", "public": True}}
# What vars/main.yml derives for each build, as tasks/main.yml's loop sees it (no host contacted).
DERIVE = [
    {"ansible.builtin.set_fact": {"derived": (
        "{{ derived | default([]) + [{'name': __criu_build_name, 'extra': __criu_build_extra, 'bin': __criu_bin,"
        " 'plugin_dir': __criu_build_plugin_dir, 'work_dir': __criu_build_work_dir,"
        " 'checksum': __criu_build_checksum, 'stamp': __criu_stamp, 'tarball': __criu_tarball}] }}")},
     "loop": "{{ __criu_builds }}", "loop_control": {"loop_var": "criu_build_item"}},
    {"ansible.builtin.copy": {"content": "{{ derived | to_json }}", "dest": "{{ out }}", "mode": "0644"}},
]


def _play(tmp_path: Path, tasks: list[dict[str, object]], extra: dict[str, object]) -> subprocess.CompletedProcess[str]:
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    return subprocess.run([ansible_playbook, "-i", "localhost,", str(tmp_path / "play.yml"), "-e", json.dumps(extra)],
                          capture_output=True, text=True, env=env, timeout=180, check=False)


def _tarball(tmp_path: Path) -> str:
    path = tmp_path / "criu-dev.tar.gz"
    path.write_bytes(b"")
    return str(path)


def test_two_good_builds_pass_and_get_folders_of_their_own(tmp_path: Path) -> None:
    builds = [{"name": "dev", "version": "4.2", "sha256": SHA, "source_path": _tarball(tmp_path)},
              {"name": "dev2", "version": "4.2.1", "sha256": SHA, "source_url": "https://example.org/c.tar.xz",
               "prefix": "/opt/other/"}]
    result = _play(tmp_path, [VALIDATE, *DERIVE], {"criu_extra_builds": builds, "out": str(tmp_path / "derived.json")})
    assert result.returncode == 0, result.stdout + result.stderr
    default, dev, dev2 = json.loads((tmp_path / "derived.json").read_text())
    # The default build as it always was: same paths, same stamp (so the same build-cache key).
    assert default == {"name": "default", "extra": False, "bin": "/usr/local/sbin/criu",
                       "plugin_dir": "/usr/local/lib/criu", "work_dir": "/usr/local/src/criu",
                       "checksum": "sha256:29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9",
                       "stamp": "version=4.2.1 prefix=/usr/local plugindir=/usr/local/lib/criu cuda_plugin=True\n",
                       "tarball": "/usr/local/src/criu/criu-4.2.1.tar.xz"}
    assert dev["bin"] == "/opt/criu-dev/sbin/criu" and dev["plugin_dir"] == "/opt/criu-dev/lib/criu"
    assert dev["work_dir"] == "/usr/local/src/criu/extra/dev" and dev["tarball"].endswith("/extra/dev/criu-4.2.tar.gz")
    assert dev["checksum"] == f"sha256:{SHA}" and dev["stamp"].endswith(f" sha256={SHA}\n")
    assert dev2["bin"] == "/opt/other/sbin/criu" and dev2["plugin_dir"] == "/opt/other/lib/criu"


@pytest.mark.parametrize(("builds", "said"), [
    ({"name": "dev"}, "criu: criu_extra_builds is {"),
    ([{"name": "dev", "version": "4.2", "sha256": SHA, "source_url": "https://x/c.tar.gz", "sha_256": SHA}],
     'has the keys ["name", "version", "sha256", "source_url", "sha_256"]'),
    ([{"name": "../etc", "version": "4.2", "sha256": SHA, "source_url": "https://x/c.tar.gz"}],
     'criu_extra_builds[0] is named "../etc"'),
    ([{"name": "dev", "version": 4.2, "sha256": SHA, "source_url": "https://x/c.tar.gz"}], "version 4.2 and"),
    ([{"name": "dev", "version": "4.0", "sha256": SHA, "source_url": "https://x/c.tar.gz"}], 'version "4.0"'),
    ([{"name": "dev", "version": "4.2", "sha256": "abc", "source_url": "https://x/c.tar.gz"}], 'sha256 "abc"'),
    ([{"name": "dev", "version": "4.2", "sha256": SHA}], '(dev) has source_url "" and source_path ""'),
    ([{"name": "dev", "version": "4.2", "sha256": SHA, "source_url": "https://user:token@x/c.zip"}],
     'source_url "https://***@x/c.zip"'),
    ([{"name": "dev", "version": "4.2", "sha256": SHA, "source_path": "/nonexistent/criu-dev.tar.gz"}],
     'source_path "/nonexistent/criu-dev.tar.gz"; expected'),
    ([{"name": "dev", "version": "4.2", "sha256": SHA, "source_url": "https://x/c.tar.gz", "prefix": "/usr/local/"}],
     'the prefixes ["/usr/local"]'),
    ([{"name": "a", "version": "4.2", "sha256": SHA, "source_url": "https://x/c.tar.gz", "prefix": "/opt/criu-b"},
      {"name": "b", "version": "4.2", "sha256": SHA, "source_url": "https://x/c.tar.gz"}],
     'the prefixes ["/opt/criu-b", "/opt/criu-b"]'),
    ([{"name": "dev", "version": "4.2", "sha256": SHA, "source_url": "https://x/c.tar.gz", "prefix": "opt/dev"}],
     'the prefixes ["opt/dev"]'),
])
def test_a_bad_extra_build_stops_with_its_name(tmp_path: Path, builds: object, said: str) -> None:
    result = _play(tmp_path, [VALIDATE], {"criu_extra_builds": builds})
    assert result.returncode != 0 and said in result.stdout, result.stdout + result.stderr
    assert "token" not in result.stdout


SHIPPED = REPO / "roles" / "criu" / "files" / "patches" / "parallel-shmem-restore.patch"


def test_a_patched_build_names_its_patches_in_its_stamp_and_gitid(tmp_path: Path) -> None:
    own = tmp_path / "own.patch"
    own.write_text("--- a/x\n+++ b/x\n")
    build = {"name": "par", "version": "4.2.1", "sha256": SHA, "source_url": "https://x/c.tar.xz",
             "patches": ["parallel-shmem-restore.patch", str(own)]}
    # probe.yml's checksums of the patches on the controller, then what vars/main.yml derives from them.
    tasks = [VALIDATE,
             {"ansible.builtin.include_role": {"name": "criu", "tasks_from": "probe"},
              "vars": {"criu_build_item": build}},
             {"ansible.builtin.copy": {"content": "{{ {'stamp': __criu_stamp, 'gitid': __criu_gitid,"
                                                  " 'patches': __criu_build_patches} | to_json }}",
                                       "dest": "{{ out }}", "mode": "0644"},
              # Outside the role: its role_path given, as the role's own tasks see it.
              "vars": {"criu_build_item": build, "__criu_tarball_commit": {"stdout": ""},
                       "role_path": str(REPO / "roles" / "criu")}}]
    result = _play(tmp_path, tasks, {"criu_extra_builds": [build], "out": str(tmp_path / "derived.json")})
    assert result.returncode == 0, result.stdout + result.stderr
    derived = json.loads((tmp_path / "derived.json").read_text())
    sums = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (SHIPPED, own)]
    assert derived["patches"] == [str(SHIPPED), str(own)]  # a bare name is the role's own
    assert derived["stamp"].endswith(f" sha256={SHA} patches={sums[0]},{sums[1]}\n")
    assert derived["gitid"] == f"v4.2.1+patch.{sums[0][:8]}.{sums[1][:8]}"  # a release: no commit to name


@pytest.mark.parametrize(("patches", "said"), [
    ("parallel-shmem-restore.patch", 'has patches "parallel-shmem-restore.patch"; expected a list'),
    ([1], "has patches [1]; expected"),
    (["nonexistent.patch"], 'not on the controller: ["'),
    (["/nonexistent/x.patch"], 'not on the controller: ["/nonexistent/x.patch"]'),
    (["parallel-shmem-restore.patch"] * 9, "at most 8 patch files"),
])
def test_a_bad_patch_list_stops_with_the_build_and_the_value(tmp_path: Path, patches: object, said: str) -> None:
    build = {"name": "par", "version": "4.2.1", "sha256": SHA, "source_url": "https://x/c.tar.xz", "patches": patches}
    result = _play(tmp_path, [VALIDATE], {"criu_extra_builds": [build]})
    assert result.returncode != 0 and "criu_extra_builds[0] (par) has patches" in result.stdout, result.stdout
    assert said in result.stdout and "parallel-shmem-restore.patch)" in result.stdout, result.stdout


def _git_archive(tmp_path: Path, fmt: str) -> tuple[Path, str]:
    repo = tmp_path / "src"
    repo.mkdir(exist_ok=True)
    (repo / "Makefile.versions").write_text("CRIU_VERSION_MAJOR := 4\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "criu-dev"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    out = tmp_path / f"criu-dev.{fmt}"
    subprocess.run([*git, "archive", f"--format={fmt}", "--prefix=criu-dev/", "-o", str(out), "HEAD"], check=True)
    return out, commit


def _commit_of(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(COMMIT_SCRIPT), str(path)], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("fmt", ["tar", "tar.gz"])
def test_a_git_archive_names_its_commit(tmp_path: Path, fmt: str) -> None:
    path, commit = _git_archive(tmp_path, fmt)
    done = _commit_of(path)
    assert (done.returncode, done.stdout) == (0, commit + "\n"), done.stderr


@pytest.mark.skipif(shutil.which("xz") is None, reason="no xz here")
def test_a_git_archive_recompressed_with_xz_still_names_it(tmp_path: Path) -> None:
    path, commit = _git_archive(tmp_path, "tar")
    subprocess.run(["xz", "-k", str(path)], check=True)
    assert _commit_of(path.with_name(path.name + ".xz")).stdout == commit + "\n"


def test_a_plain_tarball_names_none_and_a_broken_one_fails(tmp_path: Path) -> None:
    (tmp_path / "Makefile").write_text("all:\n")
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz", format=tarfile.GNU_FORMAT) as tar:
        tar.add(tmp_path / "Makefile", arcname="criu/Makefile")
    done = _commit_of(plain)
    assert (done.returncode, done.stdout) == (0, "")
    (tmp_path / "broken.tar.gz").write_bytes(b"not a tarball")
    done = _commit_of(tmp_path / "broken.tar.gz")
    assert done.returncode == 1 and "broken.tar.gz is not a readable tarball" in done.stderr
