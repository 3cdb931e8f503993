"""The offload trial's plan-time setup: what the playbooks carry, the sizing, and dummy weights."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodetools.loadgen.workload import QUESTION_TOKENS, QualitySpec, Workload
from nodetools.model_shapes import PRESETS
from runner.errors import SpecError
from runner.experiments.base import TrialContext
from runner.experiments.offload import KIND, MODES
from runner.experiments.offload.params import QualityParams, WorkloadParams
from runner.plan import expand
from runner.spec import load_campaign

REPO = Path(__file__).resolve().parents[3]
VLLM = {"kind": "vllm", "runtime": "process", "model": "/models/m", "port": 9000, "gpus": [4, 5], "args": {},
        "env": {"PYTHONPATH": "/opt/vllm/site"}, "python": "/opt/py/bin/python3", "version": "0.24.0"}


def setup(mode: str, engine: dict[str, Any], **params: Any) -> dict[str, Any]:
    dumped = MODES[mode].model_validate(params).model_dump(mode="json")
    ctx = TrialContext(mode, dumped, engine, host="h", trial_id=f"offload.{mode}.r1@h", remote_dir="/work/t",
                       campaign="c")
    return KIND.resources(ctx).as_dict()["offload"]


def test_workload_and_quality_defaults_are_the_node_dataclasses() -> None:
    shared = {f.name for f in dataclasses.fields(Workload)} - {"exchange_tokens"}
    assert {k: v for k, v in WorkloadParams().model_dump().items() if k in shared} == {
        name: getattr(Workload(), name) for name in shared}
    assert WorkloadParams().workload() == Workload()
    assert QualityParams().spec() == QualitySpec() and QualityParams(enabled=False).spec() is None
    assert WorkloadParams(history_tokens=8000, turns=4, turn_tokens=400, output_tokens=48).workload() \
        .context_tokens() == 8000 + 4 * 448


def test_two_copies_of_a_tiered_trial_get_their_ports_gpus_folder_and_files() -> None:
    s = setup("tiered", VLLM, engine_copies=2, offload_gib=2, fs_dir="/mnt/kv/", fs_gib=40)
    assert s["skip"] == ""
    assert s["copies"] == [{"index": 0, "port": 9000, "gpus": [4], "container_suffix": ""},
                           {"index": 1, "port": 9001, "gpus": [5], "container_suffix": "-c1"}]
    assert s["fs_dir"] == "/mnt/kv/c.offload.tiered.r1-h"  # the trial's own folder: '@' is no path character
    tier = s["args"]["kv-transfer-config"]["kv_connector_extra_config"]["secondary_tiers"][0]
    assert tier["root_dir"] == s["fs_dir"]
    assert s["env"] == {"PYTHONPATH": "/opt/vllm/site"} and s["served_model"] == "/models/m"
    need = s["need"]
    assert (need["ports"], need["gpus"], need["copies"], need["fs_dir"], need["fs_gib"]) == (
        [9000, 9001], [4, 5], 2, s["fs_dir"], 40.0)
    assert need["uses_shm"] is True and need["python_module"] == "" and need["exists"] == []
    assert ["copy1/server.log", "server.c1.log"] in s["fetch"] and ["run.json", "run.json"] in s["fetch"]
    assert ["copy1/metrics_after.txt", "metrics_after.c1.txt"] in s["fetch"]


def test_the_fs_tier_defaults_to_the_trials_work_folder_and_lmcache_is_looked_for() -> None:
    s = setup("lmcache_disk", {**VLLM, "gpus": [0]}, offload_gib=2, fs_gib=10)
    assert s["fs_dir"] == "/work/t/kv-fs"
    assert s["env"]["LMCACHE_LOCAL_DISK"] == "file:///work/t/kv-fs/"
    # The import check runs with the engine's Python and PYTHONPATH (vLLM installed with --target).
    assert (s["need"]["python"], s["need"]["python_module"], s["need"]["pythonpath"]) == (
        "/opt/py/bin/python3", "lmcache", "/opt/vllm/site")
    # ... and so is its compiled CUDA extension, unless the mode allows the torch-ops fallback.
    assert s["need"]["refuse_torch_ops"] is True
    allowed = setup("lmcache_disk", {**VLLM, "gpus": [0]}, offload_gib=2, fs_gib=10, allow_torch_fallback=True)
    assert allowed["need"]["refuse_torch_ops"] is False
    assert setup("native_cpu", {**VLLM, "gpus": [0]}, offload_gib=2)["need"]["refuse_torch_ops"] is False


@pytest.mark.parametrize(("mode", "engine", "params", "reason"), [
    ("tiered", {**VLLM, "version": "0.21.3"}, {}, "vLLM 0.21.3 predates mode tiered (OffloadingConnector"),
    ("hbm_only", {**VLLM, "gpus": [0, 1, 2]}, {"engine_copies": 2}, "3 GPUs cannot be split evenly between 2"),
])
def test_a_trial_that_cannot_run_says_why(mode: str, engine: dict[str, Any], params: dict[str, Any],
                                          reason: str) -> None:
    assert setup(mode, engine, **params)["skip"].startswith(reason)
    assert setup("tiered", {**VLLM, "version": "0.22.0rc1"})["skip"] == ""  # the release counts, not the suffix
    # The stand-in rehearses every mode, LMCache's disk too (a file-system tier below its RAM).
    assert setup("lmcache_disk", {"kind": "stand-in", "model": "/m"}, offload_gib=2, fs_gib=10)["skip"] == ""


def test_the_preflight_gets_the_longest_request_of_the_load_or_the_quality_check() -> None:
    load = {"history_tokens": 1000, "turns": 2, "turn_tokens": 100, "output_tokens": 50}
    quality = {"doc_tokens": 6000, "turns": 3, "max_tokens": 256}
    need = setup("hbm_only", {**VLLM, "args": {"max_model_len": "32k"}}, workload=load, quality=quality)["need"]
    assert need["context_tokens"] == 6000 + 3 * (QUESTION_TOKENS + 256) and need["max_model_len"] == "32k"
    off = setup("hbm_only", VLLM, workload=load, quality={**quality, "enabled": False})["need"]
    assert off["context_tokens"] == 1000 + 2 * 150


def test_dummy_weights_ask_the_model_maker_for_a_config_only_folder() -> None:
    dummy = {**VLLM, "rehearsal_model": "qwen3-0.8b", "args": {"load-format": "dummy"}}
    s = setup("hbm_only", dummy)
    assert s["model_maker_args"] == ["--config-only"] and s["weights"].startswith("dummy (--load-format dummy")
    assert setup("hbm_only", {**dummy, "rehearsal_model": "qwen3-32b"})["model_maker_args"] == []  # implied
    assert setup("hbm_only", {**VLLM, "rehearsal_model": "qwen3-0.8b"})["weights"].startswith("random (qwen3-0.8b")


def test_sizing_prices_the_tiers_with_the_presets_kv_bytes() -> None:
    engine = {**VLLM, "gpus": [0], "rehearsal_model": "qwen3-32b",
              "args": {"load-format": "dummy", "num-gpu-blocks-override": 5280}}
    load = {"sessions": 8, "history_tokens": 12000, "turns": 4, "turn_tokens": 400, "output_tokens": 32}
    sizing = setup("tiered", engine, workload=load, offload_gib=2, fs_gib=32)["sizing"]
    assert sizing["kv_bytes_per_token"] == 2 * 64 * 8 * 128 * 2 == PRESETS["qwen3-32b"].kv_bytes_per_token()
    assert (sizing["pool_tokens"], sizing["working_set_tokens"]) == (5280 * 16, 8 * (12000 + 4 * 432))
    assert (sizing["host_tier_tokens"], sizing["fs_tier_tokens"]) == (8192, 131072)
    assert sizing["ws_over_pool"] == 1.3 and sizing["ws_over_pool_plus_host"] > 1  # the fs tier is read
    assert sizing["note"].startswith("KV 256 KiB a token (the qwen3-32b preset's config); GPU pool 84,480 tokens "
                                     "(20.6 GiB); working set 109,824 tokens (26.8 GiB, 1.30x the pool)")
    fp8 = setup("hbm_only", {**engine, "args": {**engine["args"], "kv-cache-dtype": "fp8"}})["sizing"]
    assert fp8["kv_bytes_per_token"] == 128 * 1024


def test_the_h200_32b_campaign_plans_every_tier_past_what_sits_above_it() -> None:
    loaded = load_campaign(REPO / "campaigns/borrowed-h200-offload-32b.yaml")
    trials = [t for t in expand(loaded).trials if t.kind == "offload"]
    assert sorted({t.mode for t in trials}) == sorted(MODES) and {t.repeat for t in trials} == {1, 2}
    for trial in trials:
        offload = trial.resources.as_dict()["offload"]
        sizing = offload["sizing"]
        assert offload["skip"] == "", trial.id
        assert trial.engine is not None and trial.engine["args"]["load-format"] == "dummy"
        if trial.mode in ("tiered", "lmcache_disk"):  # past GPU + RAM, and within the disk tier
            assert sizing["pool_tokens"] + sizing["host_tier_tokens"] < sizing["working_set_tokens"] \
                <= sizing["fs_tier_tokens"], trial.id
        else:  # the reference campaign's 1.3x the GPU pool
            assert sizing["ws_over_pool"] == 1.3, trial.id


def test_a_ram_tier_too_small_to_stage_the_requests_in_flight_is_refused_before_the_lease() -> None:
    """The H200's 2026-12-02 tiered run: a 2 GiB RAM tier under 4 requests of 13,728 tokens logged
    "cannot store blocks" 934 times and its file-system tier never got a block."""
    engine = {**VLLM, "gpus": [0], "rehearsal_model": "qwen3-32b",
              "args": {"load-format": "dummy", "num-gpu-blocks-override": 5280}}
    load = {"sessions": 8, "concurrency": 4, "history_tokens": 12000, "turns": 4, "turn_tokens": 400,
            "output_tokens": 32}
    # 13,728 tokens a session, 13,897 with the chat template: 869 blocks of 16 = 13,904 tokens.
    assert setup("tiered", engine, workload=load, offload_gib=2, fs_gib=32)["skip"] == (
        "the 2 GiB RAM tier (8,192 tokens) cannot stage the 4 requests in flight on an engine copy (4 x 13,904 "
        "tokens = 13.6 GiB): vLLM writes the file-system tier through it, refuses to store ('cannot store "
        "blocks') and the file-system tier is never reached; give offload_gib >= 13.6, or fewer requests in flight")
    assert setup("tiered", engine, workload=load, offload_gib=13.6, fs_gib=32)["skip"] == ""  # the figure given
    assert setup("tiered", engine, workload=load, offload_gib=13.5, fs_gib=32)["skip"] != ""
    assert setup("tiered", engine, workload={**load, "concurrency": 1}, offload_gib=4, fs_gib=32)["skip"] == ""
    # Sessions go to copies round-robin and the workers share one queue: a copy can hold as many
    # requests as it has sessions (up to the concurrency), not an even share of the concurrency.
    two = {**engine, "gpus": [0, 1]}
    assert "4 requests in flight on an engine copy" in setup(
        "tiered", two, workload=load, offload_gib=7, fs_gib=32, engine_copies=2)["skip"]
    assert setup("tiered", two, workload={**load, "sessions": 4}, offload_gib=7, fs_gib=32,
                 engine_copies=2)["skip"] == ""  # 2 sessions a copy: 2 x 13,904 tokens = 6.8 GiB
    # A RAM-only tier stages nothing below it; an unknown KV size cannot be judged before the run.
    assert setup("native_cpu", engine, workload=load, offload_gib=2)["skip"] == ""
    assert setup("tiered", {**VLLM, "gpus": [0]}, workload=load, offload_gib=2)["skip"] == ""


def _campaign(engine: str, experiments: str) -> str:
    return f"name: t\ninventory: inventory\nengine: {engine}\nexperiments:\n{experiments}"


def test_dummy_weights_are_refused_where_they_would_fake_the_weights_phase(
        write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(_campaign("{kind: vllm, model: /m, args: {load-format: dummy}}",
                                    "  - kind: offload\n  - kind: startup\n    modes: [disk_cold]\n"))
    with pytest.raises(SpecError) as info:
        load_campaign(path, check_hosts=False)
    assert info.value.lines == [f"{path}:6: experiments[1].kind: kind startup cannot run with engine.args "
                                "load-format dummy: it times reading the weights, which --load-format dummy skips "
                                "(use a rehearsal model with weights, or another kind)"]


def test_a_config_only_preset_needs_dummy_weights(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(_campaign("{kind: vllm, model: /m, rehearsal_model: qwen3-32b}",
                                    "  - kind: offload\n  - kind: offload\n    name: dummy\n"
                                    "    engine_args: {load-format: dummy}\n"))
    with pytest.raises(SpecError) as info:
        load_campaign(path, check_hosts=False)
    assert info.value.lines == [f"{path}:3: engine.rehearsal_model: preset qwen3-32b is written without weights "
                                "(config and tokenizer only): experiment offload needs engine.args load-format: dummy"]
    typo = write_campaign(_campaign("{kind: vllm, model: /m, rehearsal_model: qwen3-32B}", "  - kind: offload\n"))
    with pytest.raises(SpecError, match=r"unknown preset 'qwen3-32B' .*did you mean 'qwen3-32b'"):
        load_campaign(typo, check_hosts=False)
