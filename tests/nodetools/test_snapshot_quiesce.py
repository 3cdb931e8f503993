"""A quiesced engine through CRIU for real: put to sleep before the dump, restored (from tmpfs when
staged), woken, answering; a level-2 sleep leaving its weights out of the image and reloading them;
and a log written without O_APPEND put back to its dumped size so one dump restores twice.

``nodetools.snapshot measure --mode criu`` against ``snapshot_engine.py`` (the stand-in with sleep
mode: a level-1 sleep keeps its weight files in a memfd, as vLLM keeps its weights in host buffers).
Needs root and CRIU >= 4.2 (``CRIU_BIN``), as the other CRIU tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodetools.snapshot.criu_node import criu_version
from tests.nodetools.test_snapshot_criu_lessons import CRIU, REPO, Trial

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or (criu_version(CRIU) or (0,)) < (4, 2),
                                reason=f"needs root and CRIU >= 4.2 at {CRIU}")

MODEL_MIB = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    subprocess.run([sys.executable, "-m", "nodetools.standin", "make-model", str(path), "--size-mib", str(MODEL_MIB)],
                   check=True, capture_output=True, cwd=REPO)
    return path


@pytest.fixture
def stage_dir() -> Iterator[Path]:
    path = Path("/dev/shm") / f"gpu-campaign-test-stage-{os.getpid()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def weights(model: Path) -> int:
    return sum(p.stat().st_size for p in model.glob("*.safetensors"))


def asleep_trial(tmp: Path, model: Path, *engine: str) -> Trial:
    """The planned launch of a quiesced trial: sleep mode and vLLM's development routes."""
    tmp.mkdir(exist_ok=True)
    trial = Trial(tmp, model, *engine)
    launch = json.loads((trial.dir / "launch.json").read_text())
    launch["argv"].append("--enable-sleep-mode")
    launch["env"] = {**launch["env"], "VLLM_SERVER_DEV_MODE": "1"}
    (trial.dir / "launch.json").write_text(json.dumps(launch))
    return trial


def measured(trial: Trial, *options: str) -> dict[str, Any]:
    rc, out = trial.measure(*options)
    assert rc == 0, (out.get("error"), trial.log("server.log")[-2000:])
    return out


def test_a_sleeping_engine_is_dumped_staged_in_tmpfs_restored_and_woken(tmp_path: Path, model: Path,
                                                                        stage_dir: Path) -> None:
    trial = asleep_trial(tmp_path, model)
    out = measured(trial, "--quiesce", "sleep", "--restore-cache", "dropped,warm", "--stage-dir", str(stage_dir))
    quiesce = out["quiesce"]
    assert quiesce["asked"] == "sleep" and quiesce["level"] == 1 and quiesce["sleep_s"] > 0
    # The stand-in's weights went to a memfd: its group's resident memory grew by them, and the image holds them.
    assert quiesce["sleep_host_bytes"] >= 0.9 * weights(model)
    assert quiesce["host_memory_asleep"]["RssShmem"] - quiesce["host_memory_awake"]["RssShmem"] >= 0.9 * weights(model)
    assert out["image_bytes"] > weights(model)
    assert out["criu"]["version"] == ".".join(map(str, criu_version(CRIU) or ()))
    for record in out["restores"]:  # each restore from the staged copy, then woken, then answering
        assert record["image_source"] == "tmpfs" and record["stage_dir"]["in_ram"] is True
        assert record["stage_s"] > 0 and record["staged_bytes"] == out["image_bytes"]
        assert record["wake_s"] > 0 and "reload_s" not in record
        assert record["restore_to_first_token_s"] > record["restore_s"] and record["answers_s"][0]
    assert out["staged_removed"] is True and not stage_dir.exists()
    log = trial.log("server.log")
    assert log.count("It took") >= 1 and log.count("wake up the engine with tags: None") == 2


def test_a_level_2_sleep_leaves_the_weights_out_of_the_image_and_reloads_them(tmp_path: Path, model: Path) -> None:
    level_1 = measured(asleep_trial(tmp_path / "one", model), "--quiesce", "sleep")
    trial = asleep_trial(tmp_path / "two", model)
    level_2 = measured(trial, "--quiesce", "sleep2")
    assert level_1["image_bytes"] - level_2["image_bytes"] >= 0.9 * weights(model)
    assert level_2["quiesce"]["sleep_host_bytes"] < 0.1 * weights(model)
    restore = level_2["restores"][0]
    assert restore["reload_s"] > 0 and restore["wake_s"] > 0 and restore["image_source"] == "disk"
    log = trial.log("server.log")
    assert "wake up the engine with tags: ['weights']" in log and "Reloading and processing weights took" in log
    assert "wake up the engine with tags: ['kv_cache']" in log


def test_a_log_written_without_append_is_put_back_so_one_dump_restores_twice(tmp_path: Path, model: Path) -> None:
    """The H200's second restore from one image: ``File tmp/run/server.log has bad size 18781 (expect 18073)``."""
    trial = Trial(tmp_path, model, "--log-without-append")
    out = measured(trial, "--restore-cache", "dropped,warm")
    log = str(trial.dir / "server.log")
    assert f"log without O_APPEND: {log}" in trial.log("server.log")
    assert log in out["written_files"]["files"]
    put_back = out["written_files"]["put_back"]
    assert len(put_back) == 1 and put_back[0]["path"] == log
    assert put_back[0]["grew_to"] > put_back[0]["dumped"] == out["written_files"]["files"][log]
    assert Path(put_back[0]["kept"]).stat().st_size == put_back[0]["grew_to"] - put_back[0]["dumped"]  # kept
    assert [r["cache"] for r in out["restores"]] == ["dropped", "warm"]
    assert all(r["restore_to_first_token_s"] > 0 for r in out["restores"])
