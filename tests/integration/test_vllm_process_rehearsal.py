"""The launch path of the borrowed H200, through the runner on this machine: ``kind: vllm`` with
``runtime: process``, ``engine.python`` plus ``PYTHONPATH`` (vLLM in a --target folder on top of a
Python that has torch) and ``rehearsal_model`` (the model maker writes the model when none is
there). No GPU here, so the ``vllm`` package on that PYTHONPATH is a MOCK whose CLI hands
``serve`` to the engine stand-in; everything around it is the real runner and playbooks."""

from __future__ import annotations

import csv
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main
from tests.support.mock_vllm import mock_vllm_site

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

MOCK_CLI = '''"""MOCK vllm CLI (tests only): `serve MODEL FLAGS` runs the engine stand-in; no GPU here.
Any other subcommand is refused as vLLM 0.24.0's argument parser refused `preload` on the H200."""
import runpy
import sys

if sys.argv[1] != "serve":
    sys.exit(f"main.py: error: argument subparser: invalid choice: {sys.argv[1]!r} (choose from 'serve')")
sys.argv = ["nodetools.standin", *sys.argv[1:]]
runpy.run_module("nodetools.standin", run_name="__main__", alter_sys=True)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mock_site(root: Path) -> Path:
    mock_vllm_site(root, MOCK_CLI)
    # The fastsafetensors loader's package, found (like vLLM) only on the engine's PYTHONPATH.
    (root / "fastsafetensors").mkdir()
    (root / "fastsafetensors" / "__init__.py").write_text('"""MOCK fastsafetensors package for tests."""\n')
    return root


def test_vllm_process_engine_from_a_target_folder_on_a_made_rehearsal_model(
        write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    site = mock_site(tmp_path / "mock-vllm-site")
    model = tmp_path / "models" / "rehearsal"
    path = write_campaign(f"""\
name: vllm-process-rehearsal
inventory: inventory
remote_dir: {tmp_path / 'remote'}
engine:
  kind: vllm
  runtime: process
  python: {sys.executable}
  version: "0.24.0"
  model: {model}
  rehearsal_model: qwen3-tiny
  served_model_name: rehearsal
  port: {free_port()}
  cache_root: {tmp_path / 'cache'}
  args: {{max-model-len: 2048}}
  env: {{PYTHONPATH: "{site}:{REPO}", STANDIN_COMPILE_MISS_S: "1.0", STANDIN_JIT_MISS_S: "0.5"}}
experiments:
  - kind: startup
    modes: [disk_cold]
    repeats: 2
    timeout_s: 180
  - kind: startup
    name: loaders
    modes: [fastsafetensors]
    repeats: 1
    timeout_s: 180
  - kind: startup
    name: nopreload
    modes: [preload]
    repeats: 2
    timeout_s: 180
""")
    results = tmp_path / "results"
    assert main([str(path), "--quiet", "--results", str(results)]) == 0
    # This vLLM has no preload: both repeats are skipped rows, answered from its CLI source without
    # running it (asking imports vLLM: 28 s on the H200), so no answer had to be kept.
    preload = [json.loads((results / f"trials/nopreload.preload.r{r}@localhost/trial.json").read_text())
               for r in (1, 2)]
    assert [t["status"] for t in preload] == ["skipped", "skipped"]
    assert preload[0]["reason"] == preload[1]["reason"]
    said = "vllm.entrypoints.cli.main preload' is not available (this vLLM has no preload command)"
    assert said in preload[0]["reason"]
    cli = site / "vllm" / "entrypoints" / "cli"
    assert f"no 'preload' in its command line's source ({cli})" in preload[0]["reason"]
    assert not list((tmp_path / "remote").rglob(".answers/vllm-preload-*.json"))

    marker = json.loads((model / "rehearsal.json").read_text())
    assert marker["random_weights"] is True and marker["preset"] == "qwen3-tiny"
    with (results / "startup.csv").open() as fh:
        rows = {r["repeat"] if r["trial_id"].startswith("startup.") else r["trial_id"].split(".")[0]: r
                for r in csv.DictReader(fh) if r["mode"] != "preload"}
    assert {r["status"] for r in rows.values()} == {"ok"}, rows
    # The loader's package is beside vLLM, not in the engine's own Python: the preflight looks
    # with the engine's PYTHONPATH (on the H200 a check without it skipped an installed loader).
    loader = rows.pop("loaders")
    assert loader["mode"] == "fastsafetensors" and loader["status"] == "ok", loader
    # Identical arguments twice: the first start fills the persistent cache, the second hits it.
    assert rows["1"]["compile_cache_hit"] == "False" and rows["2"]["compile_cache_hit"] == "True"
    trial = json.loads((results / "trials/startup.disk_cold.r1@localhost/trial.json").read_text())
    assert trial["engine"]["rehearsal_model"] == "qwen3-tiny"
    launch = json.loads(next((results / "trials/startup.disk_cold.r1@localhost").rglob("launch.json")).read_text())
    assert launch["argv"][:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model)]
    assert launch["env"]["PYTHONPATH"] == f"{site}:{REPO}"
    assert launch["env"]["CUDA_CACHE_PATH"] == f"{tmp_path / 'cache'}/cuda"
    report = (results / "report.md").read_text()
    assert "**random weights** (qwen3-tiny, made by nodetools.model_maker)" in report
