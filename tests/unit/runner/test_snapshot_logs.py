"""Snapshot tool failures are recognised from their logs, with a sentence a user can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.parse.snapshot_logs import classify, explain, last_error_lines

SEED_LINES = {
    # the reference campaign's two routes, as their tools printed them
    "criu_cuda_plugin_failed": "Error (criu/cr-dump.c:1520): handle_device_vma plugin failed: No such file",
    "criu_nonregular_mapping": "Error (criu/proc_parse.c:210): Can't handle non-regular mapping on 4242's map 7f00",
    "vllm_snapshot_plugin_dir": "RuntimeError: CRIU_CUDA_PLUGIN_DIR is required",
    "vllm_snapshot_remote_model": "ValueError: snapshot create requires an immutable remote model and 40-character "
                                  "--revision",
    # seen on this project's CI kernel with CRIU 4.1.1 and a TCP listener
    "criu_sockopt_unsupported": "Error (criu/sockets.c:628): sockets: Can't get 1:16 opt: Operation not supported",
    "criu_too_old_vdso": "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds",
    "criu_plugin_mismatch": "cuda_plugin.so: undefined symbol: check_and_remove_inventory_plugin",
}


@pytest.mark.parametrize(("label", "line"), sorted(SEED_LINES.items()))
def test_each_signature_is_recognised_and_explained(label: str, line: str) -> None:
    assert label in classify(line)
    assert explain([label]).startswith(f"{label}: ")


def test_clean_log_has_no_label() -> None:
    assert classify("(00.052) Dumping finished successfully\nLooks good.") == []


def test_last_error_lines_skip_the_harmless_rlimit_error(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text("Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n"
                   "(00.01) Dumping path\nError (criu/cr-dump.c:2111): Dumping FAILED.\n")
    assert last_error_lines(log) == ["Error (criu/cr-dump.c:2111): Dumping FAILED."]
    assert last_error_lines(tmp_path / "absent.log") == []
