"""The snapshot kind's metrics from a trial's raw files, and its report section: the restore against the
node's rates, and every path back to a serving engine side by side.

The numbers are the H200's by hand (vLLM 0.24.0 at 0.15 of the card: a 24 GB image with 22,243 MiB
of GPU memory, restored in 19.1 s from a 1.75 GB/s disk; the in-place cuda-checkpoint restore of
22,239 MiB in 4.48 s), so the expectation here is what the report would say of that run.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from runner.experiments.base import TrialContext
from runner.experiments.snapshot import KIND
from runner.report import build_report

H200_RESTORE_LOG = """\
(00.065673) Plugin "cuda_plugin" (version 512 hooks 13)
(14.861) cuda_plugin: resuming devices on pid 1778
(18.934247) Error (cuda_plugin.c:221): cuda_plugin: Failed to launch cuda-checkpoint to retrieve restore tid: \
Could not find restore thread for process ID 1843
(19.061) cuda_plugin: finished cuda_plugin stage 2 err 0
(19.07) Restore finished successfully. Tasks resumed.
"""
TOOL = {"asked": "cuda-checkpoint", "path": "/usr/local/bin/cuda-checkpoint", "sha256": "ab" * 32, "tool": "nvidia",
        "version": "580.159.04", "source": "marker", "marker": "/usr/local/bin/cuda-checkpoint.json"}


def criu_timings(**extra: Any) -> dict[str, Any]:
    return {"first_token_s": 39.61, "dump_s": 22.92, "image_bytes": int(22.4 * 2**30), "port_free_after_dump": True,
            "gpu_mem_mib_before": [22243], "gpu_mem_mib_after_dump": [0], "answers_before_dump_s": [0.31, 0.3, 0.29],
            "images_dir": {"path": "/opt/img", "fs_type": "ext4", "mount": "/", "free_bytes": 1, "in_ram": False},
            "network_lock": {"asked": "auto", "method": "skip", "why": "neither ..."},
            "io_uring": {"sysctl": "kernel.io_uring_disabled", "available": True, "previous": "0",
                         "during_engine": "2", "restored": "0"},
            "cuda_checkpoint_tool": TOOL, "lazy_pages": False, "restored_pid_same": True,
            "restores": [{"cache": "dropped", "image_resident_fraction": 0.0, "restore_s": 19.09,
                          "restore_to_first_token_s": 19.43, "answers_s": [0.306, 0.31, 0.3]},
                         {"cache": "warm", "image_resident_fraction": 1.0, "restore_s": 8.1,
                          "restore_to_first_token_s": 8.4, "answers_s": [0.3]}],
            "restore_s": 19.09, "restore_to_first_token_s": 19.43, **extra}


def raw_folder(tmp_path: Path, timings: dict[str, Any], logs: dict[str, str]) -> TrialContext:
    raw = tmp_path / "trial" / "raw" / "h200"
    raw.mkdir(parents=True)
    (raw / "timings.json").write_text(json.dumps(timings))
    for name, text in logs.items():
        (raw / name).write_text(text)
    return TrialContext(mode="criu", params={}, engine={}, trial_dir=tmp_path / "trial", host="h200")


def test_criu_metrics_from_the_raw_files(tmp_path: Path) -> None:
    ctx = raw_folder(tmp_path, criu_timings(), {"restore-dropped.log": H200_RESTORE_LOG,
                                                "restore-warm.log": "(00.10) pie: 7: Preadv 0x7f00:0... (9 iovs)\n"
                                                                    "(01.10) pie: 7: `- returned 2000000000\n",
                                                "dump.log": "(01.2) cuda_plugin: pausing devices on pid 1843\n"})
    metrics = KIND.collect(ctx)
    assert metrics["restore_warm_pages_gb_s"] == 2.0 and "restore_dropped_pages_gb_s" not in metrics
    assert {k: metrics[k] for k in ("restore_s", "restore_dropped_s", "restore_warm_s", "restore_cache",
                                    "restore_dropped_to_first_token_s", "restore_warm_to_first_token_s")} == {
        "restore_s": 19.09, "restore_dropped_s": 19.09, "restore_warm_s": 8.1, "restore_cache": "dropped",
        "restore_dropped_to_first_token_s": 19.43, "restore_warm_to_first_token_s": 8.4}
    assert metrics["restore_gpu_s"] == 4.2 and metrics["gpu_gib"] == 21.722 and metrics["image_gib"] == 22.4
    assert metrics["cuda_plugin"] == "acted" and metrics["cuda_checkpoint_tool"] == "nvidia 580.159.04"
    assert metrics["network_lock"] == "skip" and metrics["io_uring_disabled"] == "2"
    assert metrics["answer_before_dump_s"] == 0.3 and metrics["first_answer_after_restore_s"] == 0.306
    assert metrics["speedup_vs_start"] == 2.0 and metrics["images_fs"] == "ext4"


def test_a_plugin_that_did_nothing_means_no_cuda_checkpoint_acted(tmp_path: Path) -> None:
    ctx = raw_folder(tmp_path, criu_timings(), {"dump.log": "(00.1) cuda_plugin: No GPU device found; CUDA plugin "
                                                            "is disabled\n"})
    metrics = KIND.collect(ctx)
    assert metrics["cuda_plugin"] == "disabled: No GPU device found" and metrics["cuda_checkpoint_tool"] == "none acted"


def test_the_failed_steps_log_explains_the_failure(tmp_path: Path) -> None:
    timings = {"error": "criu dump failed with rc 1 (see dump.log)", "first_token_s": 40.0}
    ctx = raw_folder(tmp_path, timings, {
        "dump.log": "Error (criu/proc_parse.c:502): Unknown shit 600 (anon_inode:[io_uring])\n"
                    "Error (criu/cr-dump.c:1975): Dumping FAILED.\n",
        "restore-warm.log": "Error (criu/netfilter.c:105): Iptables configuration failed\n"})  # an older attempt's
    why = KIND.diagnose(ctx)
    assert why.startswith("criu_dump_failed: criu dump failed; criu_io_uring: a process of the engine maps an io_uring")
    assert "criu_tcp_lock" not in why
    assert why.endswith("dump.log tail: Error (criu/proc_parse.c:502): Unknown shit 600 (anon_inode:[io_uring]) | "
                        "Error (criu/cr-dump.c:1975): Dumping FAILED.")


def record(tid: str, kind: str, mode: str, metrics: dict[str, Any], params: dict[str, Any] | None = None,
           gmu: float = 0.15) -> dict[str, Any]:
    experiment, _, rest = tid.partition(".")
    return {"id": tid, "host": "h200", "experiment": experiment, "kind": kind, "mode": mode,
            "repeat": int(rest.split(".r")[1].split("@")[0]), "params": params or {}, "timeout_s": 900,
            "engine": {"kind": "vllm", "model": "/m", "args": {"gpu-memory-utilization": gmu}},
            "engine_label": "vllm", "status": "ok", "reason": "", "duration_s": 100.0, "metrics": metrics}


def write_results(root: Path, records: list[dict[str, Any]], raws: dict[str, dict[str, Any]] | None = None) -> None:
    """A results folder: each record's trial.json, the raw timings.json of those in ``raws``, the plan."""
    for rec in records:
        folder = root / "trials" / rec["id"]
        folder.mkdir(parents=True)
        (folder / "trial.json").write_text(json.dumps(rec))
        if rec["id"] in (raws or {}):
            (folder / "raw" / "h200").mkdir(parents=True)
            (folder / "raw" / "h200" / "timings.json").write_text(json.dumps(raws[rec["id"]]))  # type: ignore[index]
    plan = [{k: v for k, v in r.items() if k not in ("status", "reason", "metrics", "duration_s", "engine_label")}
            for r in records]
    (root / "plan.json").write_text(json.dumps({"campaign": "borrowed-h200-snapshot", "trials": plan}))


def test_the_section_puts_the_restore_against_the_nodes_rates_and_every_path_side_by_side(tmp_path: Path) -> None:
    root = tmp_path / "results"
    records = [
        record("startup.first_start.r1@h200", "startup", "first_start", {"first_token_s": 145.1}),
        record("startup.disk_cold.r1@h200", "startup", "disk_cold", {"first_token_s": 39.6}),
        record("startup.sleep_wake.r1@h200", "startup", "sleep_wake", {"first_token_s": 41.0,
                                                                       "wake_to_first_token_s": 0.18}),
        record("gmu015.criu.r1@h200", "snapshot", "criu", {}, {"disk_read_gb_s": 1.75, "h2d_gb_s": 5.206}),
        record("gmu015.cuda_checkpoint.r1@h200", "snapshot", "cuda_checkpoint",
               {"first_token_s": 98.69, "restore_s": 4.4794, "restore_to_first_token_s": 4.6094,
                "gpu_mem_mib_before": 22239, "gpu_mem_mib_while": 0, "gpu_mem_mib_after": 22239}),
    ]
    write_results(root, records, {"gmu015.criu.r1@h200": criu_timings()})
    raw = root / "trials" / "gmu015.criu.r1@h200" / "raw" / "h200"
    (raw / "restore-dropped.log").write_text(H200_RESTORE_LOG + "(00.50) pie: 7: Preadv 0x7f00:0... (9 iovs)\n"
                                             "(14.60) pie: 7: `- returned 23970000000\n")
    _, report_path = build_report(root)
    report = report_path.read_text()
    with (root / "snapshot.csv").open() as fh:
        rows = {r["trial_id"]: r for r in csv.DictReader(fh)}
    row = rows["gmu015.criu.r1@h200"]
    assert row["gpu_memory_utilization"] == "0.15" and row["quiesce"] == "none" and row["model"] == "m"
    # 22.4 GiB / 1.75 GB/s + 21.722 GiB / 5.206 GB/s = 13.74 + 4.48 s; the log accounts for 14.1 s of
    # pages read in + 4.2 s of GPU = 18.3 s of the 19.09 measured, 19.43 to the first token
    assert row["limit_s"] == "18.224" and row["limit_read_from"] == "mode parameter"
    line = next(li for li in report.splitlines() if li.startswith("| gmu015 | m | none | disk |"))
    assert line == ("| gmu015 | m | none | disk | 22.4 | 21.722 | 1.75 | mode parameter | 5.206 | mode parameter | "
                    "18.224 |  | 19.09 |  | 19.43 | 1.07 | 39.6 | 2.0 | 4.2 |  |  | 14.1 | 1.7 | 18.3 |")  # no memfd
    for line in ("| cold start (empty caches) | startup | 145.1 | 1 |",
                 "| start with persisted caches | startup | 39.6 | 1 |",
                 "| wake from sleep | startup | 0.18 | 1 |",
                 "| in-place cuda-checkpoint restore (GPU state kept in host RAM) | gmu015 | 4.609 | 1 |",
                 "| CRIU restore from disk, page cache dropped | gmu015 | 19.43 | 1 |",
                 "| CRIU restore, image in page cache | gmu015 | 8.4 | 1 |"):
        assert line in report, line
    assert (root / "snapshot_restore.png").is_file() and "![every restore by stage](snapshot_restore.png)" in report


def quiesced_timings(staged: bool) -> dict[str, Any]:
    """The H200 by hand (issue #30): the 0.8B engine at 0.9 with CUDA graphs, put to sleep (1.1 s, 1.3 GiB
    left on the GPU, 1.65 GiB of weights to host), a 5.8 GB image; restore 6.9 s, wake 0.6 s, first token
    7.8 s after the restore began (7.4 s with the image staged in tmpfs, the copy 2.4 s)."""
    restore = {"cache": "dropped", "image_resident_fraction": 0.0, "image_source": "tmpfs" if staged else "disk",
               "restore_s": 6.5 if staged else 6.9, "wake_s": 0.6, "restore_to_first_token_s": 7.4 if staged else 7.8,
               "answers_s": [0.05]}
    if staged:
        restore.update(stage_s=2.4, staged_bytes=5_800_000_000, stage_dir={"path": "/dev/shm/s", "in_ram": True})
    return {**criu_timings(), "image_bytes": 5_800_000_000, "gpu_mem_mib_before": [1331], "restores": [restore],
            "restore_s": restore["restore_s"], "restore_to_first_token_s": restore["restore_to_first_token_s"],
            "criu": {"path": "/usr/local/sbin/criu", "version": "4.2.1"},
            "quiesce": {"asked": "sleep", "level": 1, "sleep_s": 1.1, "sleep_host_bytes": int(1.65 * 2**30),
                        "gpu_mem_mib_awake": [128900], "gpu_mem_mib_asleep": [1331]}}


def test_every_restore_stands_beside_its_limit_the_warm_start_and_the_reference_figures(tmp_path: Path) -> None:
    root = tmp_path / "results"
    engine = {"kind": "vllm", "model": "/m/qwen3-0.8b-random", "rehearsal_model": "qwen3-0.8b",
              "args": {"gpu-memory-utilization": 0.9}}
    records = [
        record("limits.h2d_copy.r1@h200", "storage", "h2d_copy", {"h2d_pinned_gb_s": 55.0, "gpu": 0,
                                                                  "gpu_name": "NVIDIA H200", "pci_bus_id": "0:19"}),
        record("limits.buffered_read.r1@h200", "storage", "buffered_read", {"gb_s": 1.75}, {"target": "/opt/fio"}),
        {**record("shm.buffered_read.r1@h200", "storage", "buffered_read", {"gb_s": 10.0}, {"target": "/dev/shm/f"}),
         "host_facts": {"mounts": [{"mountpoint": "/dev/shm", "fstype": "tmpfs"}]}},
        {**record("startup.page_cache_warm.r1@h200", "startup", "page_cache_warm", {"first_token_s": 30.0}),
         "engine": engine},
        {**record("restore.criu.r1@h200", "snapshot", "criu", {}, {"quiesce": "sleep"}), "engine": engine},
        {**record("staged.criu.r1@h200", "snapshot", "criu", {}, {"quiesce": "sleep", "image_source": "tmpfs"}),
         "engine": engine},
    ]
    write_results(root, records, {"restore.criu.r1@h200": quiesced_timings(False),
                                  "staged.criu.r1@h200": quiesced_timings(True)})
    _, report_path = build_report(root)
    report = report_path.read_text()
    with (root / "snapshot.csv").open() as fh:
        rows = {r["trial_id"]: r for r in csv.DictReader(fh)}
    disk, staged = rows["restore.criu.r1@h200"], rows["staged.criu.r1@h200"]
    assert {k: disk[k] for k in ("model", "quiesce", "criu_version", "image_gib", "image_source",
                                 "restore_to_first_token_s", "wake_s", "limit_s")} == {
        "model": "qwen3-0.8b", "quiesce": "sleep", "criu_version": "4.2.1", "image_gib": "5.402",
        "image_source": "disk", "restore_to_first_token_s": "7.8", "wake_s": "0.6", "limit_s": "3.372"}
    # 5.402 GiB / 1.75 GB/s from the disk, or / 10 GB/s from tmpfs; + (1.3 GiB on the GPU + 1.65 GiB of
    # weights the wake copies back) / 55 GB/s pinned
    assert staged["limit_s"] == "0.638" and staged["limit_read_from"] == "storage: fio buffered_read /dev/shm/f"
    assert disk["limit_read_from"] == "storage: fio buffered_read /opt/fio" and disk["sleep_host_gib"] == "1.65"
    assert disk["gpu_mem_mib_awake"] == "128900" and disk["gpu_mem_mib_asleep"] == "1331"
    assert "| restore | qwen3-0.8b | sleep | disk | 5.402 | 2.95 | 1.75 |" in report
    assert "| 3.372 |  | 6.9 | 0.6 | 7.8 | 2.31 | 30.0 | 3.8 |" in report
    assert "| staged | qwen3-0.8b | sleep | tmpfs | 5.402 | 2.95 | 10.0 |" in report
    assert ("NVIDIA Dynamo Snapshot (the public `ai-dynamo/snapshot` repository, `docs/development/benchmarks.md`; "
            "vLLM 0.20 on a B200, images on NFS) restores Qwen3 0.6B to its first token in 3.5 s and Qwen3 8B to "
            "its first token in 8.1 s.") in report
    assert "| Qwen3 0.6B | 3.5 | qwen3-0.8b | 7.4 | quiesce sleep, images from tmpfs | 2.4 | 2.11 |" in report
    assert "Qwen3 8B | 8.1 | qwen3-8b" not in report  # no 8B engine here: no row, never a made-up one
    assert "| CRIU restore from tmpfs, engine asleep (sleep) | staged | 7.4 | 1 |" in report
    assert "| CRIU restore from disk, engine asleep (sleep), page cache dropped | restore | 7.8 | 1 |" in report
    assert (root / "snapshot_restore.png").stat().st_size > 1000


def test_a_rebuilt_report_keeps_what_logs_left_behind_told_the_run(tmp_path: Path) -> None:
    # A results folder fetched without its 20-40 MB dump.log: the rebuild recomputes what the files
    # it has give (the restore's page rate) and keeps what only the run could read (the plugin).
    root = tmp_path / "results"
    rec = record("gmu015.criu.r1@h200", "snapshot", "criu", {"cuda_plugin": "acted", "restore_s": 1.0})
    raw = root / "trials" / rec["id"] / "raw" / "h200"
    raw.mkdir(parents=True)
    (root / "trials" / rec["id"] / "trial.json").write_text(json.dumps(rec))
    (raw / "timings.json").write_text(json.dumps(criu_timings()))
    (raw / "restore-dropped.log").write_text("(00.5) pie: 7: Preadv 0x7f00:0... (9 iovs)\n"
                                             "(02.5) pie: 7: `- returned 3000000000\n")
    plan = [{k: v for k, v in rec.items() if k not in ("status", "reason", "metrics", "duration_s", "engine_label")}]
    (root / "plan.json").write_text(json.dumps({"campaign": "c", "trials": plan}))
    build_report(root)
    with (root / "snapshot.csv").open() as fh:
        row = next(csv.DictReader(fh))
    assert row["cuda_plugin"] == "acted" and row["restore_dropped_pages_gb_s"] == "1.5"
    assert row["restore_s"] == "19.09"  # recomputed from timings.json, not the stored 1.0


def test_a_sleeping_engine_crius_dump_refused_names_the_step_and_crius_line(tmp_path: Path) -> None:
    timings = {"error": "criu dump of the engine asleep (quiesce sleep) failed with rc 1 (see dump.log)",
               "first_token_s": 40.0, "quiesce": {"asked": "sleep", "level": 1, "sleep_s": 1.1}}
    ctx = raw_folder(tmp_path, timings, {
        "dump.log": "(04.1) Error (criu/cr-dump.c:1680): Can't handle non-regular mapping on 1843's map 7f00\n"
                    "(04.2) Error (criu/cr-dump.c:1975): Dumping FAILED.\n"})
    why = KIND.diagnose(ctx)
    assert why.startswith("criu_dump_failed: criu dump failed; criu_nonregular_mapping: a device mapping")
    assert why.endswith("dump.log tail: (04.1) Error (criu/cr-dump.c:1680): Can't handle non-regular mapping on "
                        "1843's map 7f00 | (04.2) Error (criu/cr-dump.c:1975): Dumping FAILED.")
