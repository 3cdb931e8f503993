"""Python's import profile of every process of an engine, kept apart from its log: real processes
(a parent that spawns one interpreter and forks another), the real sitecustomize, the real gather."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nodetools.import_profile import PROFILE_FILE, SITE_DIR, gather, profile_env, start_file
from runner.parse.importtime import parse_importtime

ENGINE = textwrap.dedent("""
    import os, subprocess, sys
    import json, email.parser                      # profiled imports of the parent
    sys.stderr.write("parent: python's own stderr\\n")
    os.write(2, b"parent: written by C code to fd 2\\n")
    child = subprocess.run([sys.executable, "-c", "import csv, sys; sys.stderr.write('spawned: stderr\\\\n')"])
    pid = os.fork()
    if pid == 0:
        import difflib                              # a forked child's own import
        os._exit(0)
    os.waitpid(pid, 0)
    print(json.dumps({"parent": os.getpid(), "fork": pid}))
""")


def _run(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, int], str]:
    log = tmp_path / "server.log"
    folder = tmp_path / "imports"
    folder.mkdir()
    # As the timer starts an engine: descriptor 2 on the start file, the log named for Python's stderr.
    with start_file(folder).open("ab") as early:
        done = subprocess.run([sys.executable, "-c", ENGINE], env=profile_env(env, folder, log), stdout=subprocess.PIPE,
                              stderr=early, check=True, text=True, timeout=60)
    return json.loads(done.stdout), log.read_text()


def test_each_process_gets_its_profile_and_python_stderr_stays_in_the_log(tmp_path: Path) -> None:
    pids, log_before = _run(tmp_path, dict(os.environ))
    files = {p.name for p in (tmp_path / "imports").iterdir()}
    assert f"stderr-{pids['parent']}.txt" in files and f"stderr-{pids['fork']}.txt" in files
    assert len(files) == 3  # the parent (its start file renamed), the spawned interpreter, the forked child
    # Python's own stderr is the log's; what C code writes to fd 2 is held apart until the gather.
    assert "parent: python's own stderr" in log_before and "spawned: stderr" in log_before
    assert "written by C code" not in log_before and "import time:" not in log_before

    summary = gather(tmp_path / "imports", {pids["parent"]: "api_server", pids["fork"]: "engine_core"},
                     tmp_path / PROFILE_FILE, tmp_path / "server.log")
    assert summary["processes"] == 3 and summary["stderr_lines"] == 1
    assert not list((tmp_path / "imports").iterdir())
    log_after = (tmp_path / "server.log").read_text()
    assert "parent: written by C code to fd 2" in log_after and "import time:" not in log_after
    profiles = parse_importtime((tmp_path / PROFILE_FILE).read_text())
    by_role = {p.role: p for p in profiles}
    assert [p.role for p in profiles][:2] == ["api_server", "engine_core"]  # the main processes first
    parent_section = (tmp_path / PROFILE_FILE).read_text().split("# process ")[1]
    assert parent_section.startswith(f"{pids['parent']} api_server") and "| json\n" in parent_section
    assert "email.parser" in parent_section and "| difflib" not in parent_section  # the fork's is its own
    assert by_role["api_server"].modules > 20 and by_role["api_server"].skipped_lines == 1
    assert by_role["engine_core"].modules >= 1  # the fork's own import (difflib), its own file
    assert by_role["other"].modules > 0  # the spawned interpreter (csv)


def test_a_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env = profile_env({**os.environ, "PYTHONPATH": str(theirs)}, tmp_path, tmp_path / "log")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(SITE_DIR), str(theirs)]
    done = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('THEIRS_RAN'))"], env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "1"


def test_without_the_variables_the_module_changes_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SITE_DIR)}
    done = subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('plain\\n')"], env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stderr == "plain\n" and not list(tmp_path.iterdir())
