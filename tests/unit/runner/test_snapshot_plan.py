"""The snapshot kind's plan: a quiesced engine's launch and node options, the staging folder, and what
the campaign's own settings refuse before anything starts (with the arithmetic, from cached facts)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.errors import SpecError
from runner.plan import Trial, expand
from runner.spec import load_campaign

# The borrowed H200 as its facts say it (docs/measurements.md): one 143,771 MiB card, 125 GiB of RAM,
# 40 GiB free where the work folder lies, /dev/shm half the RAM.
H200_FACTS: dict[str, Any] = {
    "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771}],
    "memory": {"total_bytes": 125 * 2**30},
    "mounts": [{"mountpoint": "/", "fstype": "ext4", "available_bytes": 40 * 2**30}],
    "shm": {"path": "/dev/shm", "free_bytes": 62 * 2**30},
}


def campaign(modes: str, args: str = "{gpu-memory-utilization: 0.9}", engine: str = "") -> str:
    return f"""
name: restore
inventory: inventory
remote_dir: /opt/gpu-campaign/work
engine: {{kind: vllm, runtime: process, python: /opt/torch/.venv/bin/python3, model: /models/q, port: 8000,
         gpus: [0], cache_root: /opt/cache, env: {{PYTHONPATH: /opt/vllm/site}}, args: {args}{engine}}}
experiments:
  - kind: snapshot
    modes:
{modes}
"""


def trials(write_campaign: Callable[[str], Path], text: str, facts: dict[str, Any] | None = None) -> dict[str, Trial]:
    plan = expand(load_campaign(write_campaign(text)), {"localhost": facts} if facts else None)
    return {t.mode: t for t in plan.trials}


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_quiesced_engine_starts_with_sleep_mode_and_the_node_tools_sleep_and_stage_it(
        write_campaign: Callable[[str], Path]) -> None:
    planned = trials(write_campaign, campaign("      criu: {quiesce: sleep, image_source: tmpfs}\n"
                                              "      cuda_checkpoint: {quiesce: sleep}"))
    criu, cuda = planned["criu"], planned["cuda_checkpoint"]
    launch = dict(criu.node.launch or {})
    assert "--enable-sleep-mode" in launch["argv"] and launch["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert launch["env"]["PYTHONPATH"] == "/opt/vllm/site"  # the campaign's own environment kept
    gates, measure = list(criu.node.commands["gates"]), list(criu.node.commands["measure"])
    assert option(gates, "--quiesce") == option(measure, "--quiesce") == "sleep"
    stage = option(measure, "--stage-dir")
    assert stage == option(gates, "--stage-dir") and stage == "/dev/shm/gpu-campaign-snapshot.criu.r1-localhost-stage"
    assert option(list(cuda.node.commands["measure"]), "--quiesce") == "sleep"
    assert "--stage-dir" not in cuda.node.commands["measure"]
    assert not criu.refusals and not cuda.refusals


def test_an_unquiesced_engine_keeps_todays_launch(write_campaign: Callable[[str], Path]) -> None:
    criu = trials(write_campaign, campaign("      criu:"))["criu"]
    launch = dict(criu.node.launch or {})
    assert "--enable-sleep-mode" not in launch["argv"] and "VLLM_SERVER_DEV_MODE" not in launch["env"]
    assert "--quiesce" not in criu.node.commands["measure"] and "--stage-dir" not in criu.node.commands["measure"]


def test_an_unquiesced_image_the_node_cannot_hold_is_refused_with_the_arithmetic(
        write_campaign: Callable[[str], Path]) -> None:
    planned = trials(write_campaign, campaign("      criu:\n      cuda_checkpoint:"), H200_FACTS)
    # The node's totals (runner/experiments/snapshot_checks.py): its 125 GiB of RAM, its root filesystem.
    for mode in ("criu", "cuda_checkpoint"):
        refusals = planned[mode].refusals
        assert refusals and all(r.startswith("quiesce none: ") and r.endswith("quiesce the engine first (quiesce: "
                                                                              "sleep)") for r in refusals), mode
        assert any("126.4 GiB" in r and "125.0 GiB" in r for r in refusals), refusals
    # Images on tmpfs (RAM twice over): tests/unit/runner/test_plan_checks.py.


def test_what_fits_or_is_quiesced_or_has_no_facts_is_planned(write_campaign: Callable[[str], Path]) -> None:
    assert not trials(write_campaign, campaign("      criu:", "{gpu-memory-utilization: 0.15}"),
                      H200_FACTS)["criu"].refusals
    assert not trials(write_campaign, campaign("      criu: {quiesce: sleep}"), H200_FACTS)["criu"].refusals
    assert not trials(write_campaign, campaign("      criu:"))["criu"].refusals  # the node's gates check it


def test_a_level_2_sleep_is_refused_where_vllm_cannot_reload_the_weights(write_campaign: Callable[[str], Path]) -> None:
    dummy = trials(write_campaign, campaign("      criu: {quiesce: sleep2}",
                                            "{gpu-memory-utilization: 0.9, load-format: dummy}"))["criu"]
    assert dummy.refusals == (
        "quiesce sleep2 drops the weights and reads them back after the wake (POST /collective_rpc {\"method\": "
        "\"reload_weights\"}), which vLLM 0.24.0 does only through its default model loader: load-format dummy has "
        "no get_all_weights ('Model reloading with `dummy` format'); use quiesce sleep",)
    files = trials(write_campaign, campaign("      criu: {quiesce: sleep2}"))["criu"]
    assert not files.refusals and option(list(files.node.commands["measure"]), "--quiesce") == "sleep2"


def test_a_stage_dir_needs_the_tmpfs_source_and_vllm_snapshot_has_no_quiesce(
        write_campaign: Callable[[str], Path]) -> None:
    with pytest.raises(SpecError, match="stage_dir is where image_source tmpfs copies the images"):
        trials(write_campaign, campaign("      criu: {stage_dir: /dev/shm/x}"))
    with pytest.raises(SpecError, match="quiesce"):
        trials(write_campaign, campaign("      vllm_snapshot: {quiesce: sleep}"))
    staged = trials(write_campaign, campaign("      criu: {image_source: tmpfs, stage_dir: /dev/shm/mine}"))["criu"]
    assert option(list(staged.node.commands["measure"]), "--stage-dir") == "/dev/shm/mine"
