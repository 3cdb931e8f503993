"""Every engine command planned in Python: what --plan shows is what the node will exec."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main
from runner.experiments import KINDS
from runner.plan import expand
from runner.spec import load_campaign

REPO = Path(__file__).resolve().parents[3]
LOCAL_CAMPAIGNS = sorted((REPO / "campaigns").glob("*local*.yaml"))


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("path", LOCAL_CAMPAIGNS, ids=lambda p: p.name)
def test_every_engine_trial_of_every_local_campaign_shows_its_launch(path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(path), "--plan", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for trial in plan["trials"]:
        if not KINDS[trial["kind"]].needs_engine:
            assert trial["launch"] is None, trial["id"]
            continue
        if trial["node"]["skip"]:  # skipped before anything starts: no engine, a reason
            assert trial["launch"] is None and trial["node"]["commands"]["cleanup"], trial["id"]
            continue
        launch = trial["launch"]
        assert launch["argv"] and all(isinstance(a, str) for a in launch["argv"]), trial["id"]
        assert isinstance(launch["env"], dict), trial["id"]
        assert launch["argv"][:3] == [sys.executable, "-m", "nodetools.standin"], trial["id"]  # the stand-in
        assert _option(launch["argv"], "--port") == str(launch["port"])


def test_the_startup_program_carries_the_planned_launch_and_every_option() -> None:
    loaded = load_campaign(REPO / "campaigns/startup-local.yaml")
    trials = {t.mode: t for t in expand(loaded).trials if t.kind == "startup" and t.repeat == 1}
    first = trials["first_start"]
    argv = list(first.node.commands["trial"])
    assert argv[:4] == [sys.executable, "-m", "nodetools.coldstart", "trial"]
    # The launch file the program writes is the planned launch, byte for byte of its JSON.
    assert json.loads(_option(argv, "--launch-json")) == dict(first.node.launch or {})
    assert "--empty-cache" in argv and _option(argv, "--fresh-cache") == ""  # first_start: the persistent cache
    assert float(_option(argv, "--timeout-s")) == first.timeout_s - 30  # the node's wait ends before the phase's
    assert _option(argv, "--bytecode-packages") == "nodetools,aiohttp"
    # The marker the runner watches (Phase.overlap_marker) is in the trial's folder; where the
    # packages are is kept across trials in the campaign's answers folder beside it.
    assert _option(argv, "--window-marker") == f"{first.remote_dir}/{KINDS['startup'].phases[0].overlap_marker}"
    assert _option(argv, "--answers-dir") == f"{first.remote_dir.rsplit('/', 1)[0]}/.answers"
    fresh = trials["fresh_container"].node
    assert _option(list(fresh.commands["trial"]), "--fresh-cache").endswith("/fresh-cache")
    assert (fresh.launch or {})["env"]["VLLM_CACHE_ROOT"].startswith(_option(list(fresh.commands["trial"]),
                                                                              "--fresh-cache"))
    assert "--sleep-wake" in trials["sleep_wake"].node.commands["trial"]
    assert trials["sleep_wake"].node.launch["env"]["VLLM_SERVER_DEV_MODE"] == "1"  # type: ignore[index]
    assert trials["preload"].node.skip.startswith("the stand-in does not model vllm preload")


def test_a_vllm_process_trial_plans_vllms_own_checks(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign("""
name: vllm-plan
inventory: inventory
engine: {kind: vllm, runtime: process, python: /opt/torch/bin/python3, model: /models/q, port: 8123,
         env: {PYTHONPATH: /opt/vllm/site}, env_from_controller: [HF_TOKEN],
         args: {max-model-len: 4096, tensor-parallel-size: 2}, gpus: [0, 1]}
experiments:
  - kind: startup
    modes: [preload, runai_streamer]
  - kind: snapshot
    modes: [criu, cuda_checkpoint]
""")
    trials = {f"{t.kind}.{t.mode}": t for t in expand(load_campaign(path)).trials}
    preload = list(trials["startup.preload"].node.commands["trial"])
    assert preload[preload.index("--vllm-subcommand") + 1:preload.index("--vllm-subcommand") + 3][0] == "preload"
    assert _option(preload, "--engine-python") == "/opt/torch/bin/python3"
    assert _option(preload, "--bytecode-packages") == "vllm,torch,transformers,triton,flashinfer"
    assert preload.count("--answers-dir") == 1  # the subcommand's answer and the packages' place: one folder
    launch = trials["startup.preload"].node.launch or {}
    assert launch["argv"][:4] == ["/opt/torch/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve"]
    assert launch["preload_port"] == 8001 and launch["secret_env"] == ["HF_TOKEN"]
    assert "HF_TOKEN" not in launch["env"]  # a secret travels by name, never by value
    assert _option(list(trials["startup.runai_streamer"].node.commands["trial"]), "--python-module") == \
        "runai_model_streamer"
    criu = list(trials["snapshot.criu"].node.commands["gates"])
    assert _option(criu, "--tp") == "2" and _option(criu, "--gpus") == "0,1"
    assert _option(criu, "--gpu-memory-fraction") == "0.9"  # vLLM's default: the campaign left it out
    assert _option(criu, "--criu") == "criu" and _option(criu, "--network-lock") == "auto"  # the mode's defaults
    measure = list(trials["snapshot.criu"].node.commands["measure"])
    assert _option(measure, "--restore-cache") == "dropped" and _option(measure, "--answers") == "3"
    cuda = list(trials["snapshot.cuda_checkpoint"].node.commands["gates"])
    assert "--criu" not in cuda and "--network-lock" not in cuda  # no CRIU in that mode


def test_show_launch_prints_the_engines_shell_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(REPO / "campaigns/offload-local.yaml"), "--plan", "--show-launch"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  launch: ")]
    assert len(lines) == 5  # every rung: hbm_only, native_cpu (lines[1]), tiered, lmcache_cpu, lmcache_disk
    words = shlex.split(lines[1].removeprefix("  launch: "))
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.isascii()
               and w.split("=", 1)[0].isupper())
    assert env["VLLM_CACHE_ROOT"] == "/tmp/gpu-campaign-cache/vllm"
    argv = [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]
    assert argv[:3] == [sys.executable, "-m", "nodetools.standin"]
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"


def test_the_import_remedies_plan_their_changes_and_both_at_once_plans_both() -> None:
    loaded = load_campaign(REPO / "campaigns/borrowed-h200-imports.yaml")
    trials = {t.mode: t for t in expand(loaded).trials if t.kind == "startup" and t.repeat == 1}
    env = {mode: dict((trials[mode].node.launch or {})["env"]) for mode in
           ("page_cache_warm", "bytecode_persisted", "engine_fork", "bytecode_and_fork")}
    prefix = "/opt/gpu-campaign/cache/pycache"
    assert "PYTHONPYCACHEPREFIX" not in env["page_cache_warm"] and "VLLM_WORKER_MULTIPROC_METHOD" not in env[
        "page_cache_warm"]
    assert env["bytecode_persisted"]["PYTHONPYCACHEPREFIX"] == prefix
    assert env["engine_fork"]["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert env["bytecode_and_fork"]["PYTHONPYCACHEPREFIX"] == prefix
    assert env["bytecode_and_fork"]["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    # Its program compiles into the prefix before the start, as bytecode_persisted's does.
    persisted, both = (list(trials[m].node.commands["trial"]) for m in ("bytecode_persisted", "bytecode_and_fork"))
    assert "--compile-bytecode" in persisted and "--compile-bytecode" in both
    assert "--compile-bytecode" not in trials["engine_fork"].node.commands["trial"]
