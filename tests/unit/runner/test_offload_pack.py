"""The offload collect's one archive: the planned tar, run for real, holds every file the trial wrote
under the name the runner keeps it by, leaves out what the trial did not write, and reads links."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from runner.experiments.base import TrialContext
from runner.experiments.node_plan import NodePaths
from runner.experiments.offload import KIND, MODES
from runner.experiments.offload.node import ARCHIVE, pack_argv

VLLM = {"kind": "vllm", "runtime": "process", "model": "/models/m", "port": 9000, "gpus": [0, 1], "args": {},
        "version": "0.24.0", "cache_root": "/c", "model_cache": "/mc"}


def _fetch(copies: int) -> list[list[str]]:
    params = MODES["native_cpu"].model_validate({"engine_copies": copies}).model_dump(mode="json")
    ctx = TrialContext("native_cpu", params, VLLM, host="h", trial_id="o.native_cpu.r1@h", remote_dir="/w/t",
                       campaign="c")
    return KIND.resources(ctx).as_dict()["offload"]["fetch"]


def test_the_archive_holds_each_file_under_its_planned_name(tmp_path: Path) -> None:
    fetch = _fetch(2)
    work = tmp_path / "trial"
    (work / "copy1").mkdir(parents=True)
    for src, _ in fetch:
        if src not in ("quality.jsonl", "copy1/metrics_after.txt"):  # what a failed trial never wrote
            (work / src).write_text(f"{src}\n")
    (work / "requests.jsonl").unlink()
    (tmp_path / "elsewhere.jsonl").write_text("the link's target\n")
    (work / "requests.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    argv = pack_argv(NodePaths(str(work), "python3", "t"), fetch)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    with tarfile.open(work / ARCHIVE) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert sorted(members) == sorted(dest for src, dest in fetch
                                         if src not in ("quality.jsonl", "copy1/metrics_after.txt"))
        assert all(m.isfile() for m in members.values())  # the link was read, not archived as a link
        assert archive.extractfile(members["server.c1.log"]).read() == b"copy1/server.log\n"  # type: ignore[union-attr]
        assert archive.extractfile(members["requests.jsonl"]).read() == b"the link's target\n"  # type: ignore[union-attr]
    assert ["facts_after.json", "facts_after.json"] in fetch  # the collect writes it there on a remote node


def test_only_the_other_copies_files_are_renamed_and_names_match_literally() -> None:
    argv = pack_argv(NodePaths("/w/t", "python3", "t"), _fetch(3))
    assert argv[:6] == ["tar", "-C", "/w/t", "-chf", f"/w/t/{ARCHIVE}", "--ignore-failed-read"]
    renames = [a for a in argv if a.startswith("--transform=")]
    assert "--transform=s|^copy2/metrics_before\\.txt$|metrics_before.c2.txt|" in renames
    assert len(renames) == 2 * 3  # three files of each of copies 1 and 2
    assert argv[argv.index("--") + 1:][:2] == ["server.log", "requests.jsonl"]
