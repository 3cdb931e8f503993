"""Snapshot tool failures are recognised from their logs, with a sentence a user can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.experiments.snapshot import STAGES, _stages
from runner.parse.snapshot_logs import (
    classify,
    cuda_plugin_use,
    explain,
    last_error_lines,
    lazy_pages_stats,
    restore_phases,
)

REAL_LINES = {
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
    # the first dump of a live vLLM 0.24.0 engine on the H200, tries 1 and 2, as CRIU 4.2.1 printed them
    "criu_io_uring": "Error (criu/proc_parse.c:502): Unknown shit 600 (anon_inode:[io_uring])",
    "criu_tcp_lock": "Error (criu/sk-tcp.c:81): tcp: Failed to lock TCP connection 2b61",
    # what CRIU 4.2.1 says on this machine without the flags of DEFAULT_FLAGS, and for a pid still taken
    "criu_tcp_established": "Error (criu/sk-inet.c:200): inet: Connected TCP socket, consider using "
                            "--tcp-established option.",
    "criu_external_unix_socket": "Error (criu/sk-unix.c:874): unix: External socket is used. Consider using "
                                 "--ext-unix-sk option.",
    "criu_link_remap": "Error (criu/files-reg.c:1122): Can't create link remap for /dev/shm/sem.mp-x. "
                       "Use --link-remap option.",
    "criu_shell_job": "Error (criu/pstree.c:304): The root process 77 is not a session leader. Consider using "
                      "--shell-job option",
    "criu_file_locks": "Error (criu/file-lock.c:110): Some file locks are hold by dumping tasks! You can try "
                       "--file-locks to dump them.",
    "criu_pid_taken": "Error (criu/cr-restore.c:1237): Can't fork for 5829: File exists",
    "criu_userfaultfd": "Error (criu/uffd.c:349): uffd: connect to lazy-pages.socket failed: No such file or "
                        "directory",
    "criu_no_cuda_checkpoint": "(00.01) Warn  (cuda_plugin.c:585): cuda_plugin: check that cuda-checkpoint is "
                               "present in $PATH",
}


@pytest.mark.parametrize(("label", "line"), sorted(REAL_LINES.items()))
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


def test_the_iptables_line_alone_is_the_tcp_lock_too() -> None:
    assert classify("Error (criu/netfilter.c:105): Iptables configuration failed") == ["criu_tcp_lock"]


def test_the_plugins_harmless_restore_thread_line_is_not_an_error_tail(tmp_path: Path) -> None:
    log = tmp_path / "restore.log"
    log.write_text("(18.934247) Error (cuda_plugin.c:221): cuda_plugin: Failed to launch cuda-checkpoint to "
                   "retrieve restore tid: Could not find restore thread for process ID 1843\n"
                   "(19.0) Restore finished successfully. Tasks resumed.\n")
    assert last_error_lines(log) == ["(19.0) Restore finished successfully. Tasks resumed."]


# The 20 GiB holder's restore on the H200 (CRIU 4.2.1, its CUDA plugin, NVIDIA's cuda-checkpoint 580)
H200_RESTORE = """\
(00.065673) Plugin "cuda_plugin" (version 512 hooks 13)
(00.130157) cuda_plugin: initialized: cuda_plugin stage 2
(14.026847) plugin: `cuda_plugin' hook 9 -> 0x7fdc0845988d
(14.259779) cuda_plugin: resuming devices on pid 649
(14.259809) cuda_plugin: Restore thread pid 711 found for real pid 649
(17.941025) cuda_plugin: finished cuda_plugin stage 2 err 0
(17.950000) Restore finished successfully. Tasks resumed.
"""


def test_a_restore_log_splits_into_memory_and_gpu() -> None:
    assert restore_phases(H200_RESTORE) == {"restore_gpu_s": 3.681, "restore_log_s": 17.95}
    assert restore_phases("(00.07) Restore finished successfully.\n") == {"restore_log_s": 0.07}


# From the H200's 0.30 restore from tmpfs (2026-12-02), two of its 31 reads cut out: 2 GiB a call.
H200_RESTORE_PAGES = """\
(00.142685) pie: 10488: Preadv 0x7f2a1c000000:4096... (3 iovs)
(00.143001) pie: 10488: `- returned 12288
(02.296559) pie: 10553: Preadv 0x7fb5d72ed000:751915008... (15 iovs)
(03.632885) pie: 10553: `- returned 2147479552
(03.632900) pie: 10553: Preadv 0x7fb657200000:-1395548160... (15 iovs)
(04.990000) pie: 10553: `- returned 2147479552
(05.100000) Restore finished successfully. Tasks resumed.
"""


def test_a_restore_log_says_how_fast_criu_read_the_pages_in() -> None:
    out = restore_phases(H200_RESTORE_PAGES)
    assert out["restore_pages_gib"] == 4.0  # 2 x (2 GiB - 4 KiB) + 12 KiB
    # The seconds inside the calls (1.336 + 1.357 + 0.0003), not first call to last return: the
    # restorer does other work between them (the memfds, below).
    assert out["restore_pages_s"] == 2.694 and out["restore_pages_gb_s"] == 1.594
    assert "restore_pages_gib" not in restore_phases(H200_RESTORE)  # no -v4 page lines: no figure


# From the H200's quiesced 8B-class restore from tmpfs (2026-12-03): the sleep's pinned weights
# restored as memfds by CRIU's page reader, 162 of them, the first and the last two kept here; two
# processes' reads overlapping in time count once.
H200_RESTORE_MEMFDS = """\
(00.105741)  10148: Restoring memfd id=394
(00.105742) pie: 10147: \tmmap(0x7ff306cf6000 -> 0x7ff306cfb000, 0x5 0x12 8)
(00.105800)  10148: pr7530-2 Read 0 262144 pages
(00.105900)  10148: \tpr7530-2 Read page from self 0/0
(05.900000)  10148: Restoring memfd id=559
(05.900100)  10148: pr7530-163 Read 0 262144 pages
(05.900200)  10148: \tpr7530-163 Read page from self 0/0
(11.850483)  10148: Restoring memfd id=560
(11.850524)  10148: pr7530-164 Read 0 256 pages
(11.851114)  10148: \tpr7530-164 Read page from self 100000/100000
(12.152007) pie: 10148: Preadv 0x56da0000:8192... (1023 iovs)
(12.600000) pie: 10079: Preadv 0x22be5000:8097792... (1023 iovs)
(13.183069) pie: 10148: `- returned 2147479552
(13.200000) pie: 10079: `- returned 674693120
"""


def test_a_restore_log_says_how_long_criu_spent_on_the_memfds_apart_from_the_pages() -> None:
    out = restore_phases(H200_RESTORE_MEMFDS)
    assert out["restore_memfd_gib"] == 2.001 and out["restore_memfd_s"] == 11.745  # (2 x 262144 + 256) pages
    assert out["restore_memfd_gb_s"] == 0.183
    assert out["restore_pages_s"] == 1.048  # 12.152 -> 13.2, the two processes' reads overlapping
    assert "restore_memfd_s" not in restore_phases(H200_RESTORE_PAGES)  # an unquiesced engine: no memfd


# The same stage with the parallel shmem restore patch (roles/criu/files/patches): a small memfd still read
# serially (its two lines per chunk), the large ones one line each once all their pages are in.
PARALLEL_MEMFDS = """\
(00.034019)   4929: Restoring memfd id=25
(00.034100)   4929: pr12-2 Read 0 256 pages
(00.034200)   4929: \tpr12-2 Read page from self 0/0
(00.040000)   4929: Restoring memfd id=26
(00.569560)   4929: Restored shmem 0x1920 in parallel: 1073741824 bytes, 8 threads, 32 chunks, 0.529 s
(00.570000)   4929: Restoring memfd id=27
(01.100000)   4929: Restored shmem 0x1921 in parallel: 1073741824 bytes, 4 threads, 16 chunks, 0.530 s
(01.200000) pie: 4929: Preadv 0x56da0000:8192... (3 iovs)
(01.300000) pie: 4929: `- returned 8192
"""


def test_a_parallel_memfd_restore_counts_its_bytes_and_ends_at_its_last_object() -> None:
    out = restore_phases(PARALLEL_MEMFDS)
    assert out["restore_memfd_gib"] == 2.001  # 2 x 1 GiB in parallel + 256 pages serially
    assert out["restore_memfd_s"] == 1.066  # 0.034019 -> 1.1, the last parallel object's line
    assert out["restore_memfd_gb_s"] == 2.016
    assert out["restore_memfd_threads"] == 8
    assert "restore_memfd_threads" not in restore_phases(H200_RESTORE_MEMFDS)  # stock CRIU: serial only


# CRIU with cuda-overlapped-resume.patch (roles/criu/files/patches), its CUDA plugin driving a stand-in
# cuda-checkpoint that takes 0.5 s per restore and unlock (tests/support/criu_cuda_resume_check.py): the
# per-process lines come together, then one line for all of them.
OVERLAPPED_RESUME = """\
(00.036775) Plugin "cuda_plugin" (version 512 hooks 14)
(00.038667) cuda_plugin: initialized: cuda_plugin stage 2
(00.080684) cuda_plugin: resuming devices on pid 13105
(00.080710) cuda_plugin: Restore thread pid 13108 found for real pid 13105
(00.080738) cuda_plugin: resuming devices on pid 13107
(00.080740) cuda_plugin: Restore thread pid 13109 found for real pid 13107
(00.080748) cuda_plugin: resuming devices on pid 13106
(00.080749) cuda_plugin: Restore thread pid 13110 found for real pid 13106
(01.100365) cuda_plugin: resumed 3 processes together in 1.028 s (restore tids 0.009 s, restore 0.510 s, \
unlock 0.510 s, 0 failed)
(01.101091) Restore finished successfully. Tasks resumed.
(01.101161) cuda_plugin: finished cuda_plugin stage 2 err 0
"""


def test_a_patched_plugins_resume_summary_gives_its_seconds_and_processes() -> None:
    out = restore_phases(OVERLAPPED_RESUME)
    assert out["restore_gpu_resume_s"] == 1.028 and out["restore_gpu_processes"] == 3
    assert out["restore_gpu_s"] == 1.02  # "resuming devices" to "finished ... stage 2", as for stock CRIU
    # The same build with CRIU_CUDA_SERIAL_RESUME=1 sums up upstream's order the same way.
    serial = restore_phases("(00.087544) cuda_plugin: resuming devices on pid 13222\n"
                            "(03.140056) cuda_plugin: resumed 3 processes one at a time in 3.059 s\n")
    assert (serial["restore_gpu_resume_s"], serial["restore_gpu_processes"]) == (3.059, 3)
    assert "restore_gpu_resume_s" not in restore_phases(H200_RESTORE)  # stock CRIU: no summary line


def test_lazy_pages_stats_count_faults_and_pages() -> None:
    text = ("(00.3) uffd: 3252-12: #PF at 0x7f51b11b7000\n(00.31) uffd: 3252-12: #PF at 0x7f51b11c1000\n"
            "(00.40) uffd: 3252-12: UFFD transferred pages: (7838/7838)\n"
            "(00.41) uffd: 3262-13: UFFD transferred pages: (10/12)\n")
    assert lazy_pages_stats(text) == {"lazy_page_faults": 2, "lazy_pages_copied": 7848, "lazy_pages_total": 7850}


def test_what_the_cuda_plugin_did_in_a_dump() -> None:
    assert cuda_plugin_use("(00.105106) cuda_plugin: No GPU device found; CUDA plugin is disabled") == \
        "disabled: No GPU device found"
    assert cuda_plugin_use("(01.2) cuda_plugin: pausing devices on pid 1843\n") == "acted"
    assert cuda_plugin_use("(00.1) Plugin \"cuda_plugin\" (version 512 hooks 13)\n") == "idle"
    assert cuda_plugin_use("(00.1) Dumping finished successfully\n") is None


def test_a_file_written_after_the_dump_and_a_format_vllm_cannot_reload_are_named() -> None:
    # The H200's second restore from one image, by hand (issue #30), and vLLM 0.24.0's answer for dummy weights.
    restore = ("(00.081) Error (criu/files-reg.c:2140): File tmp/run/server.log has bad size 18781 (expect 18073)\n"
               "(00.081) Error (criu/cr-restore.c:2521): Restoring FAILED.\n")
    assert classify(restore) == ["criu_file_size_changed", "criu_restore_failed"]
    assert "cuts the files the tree held open for writing back" in explain(["criu_file_size_changed"])
    reload = ("weights reload after the level-2 wake: POST /collective_rpc answered HTTP 500: "
              '{"error":{"message":"Model reloading with `dummy` format"}} (see server.log)')
    assert classify(reload) == ["weights_reload_unsupported"]


def test_a_quiesced_restores_stages_put_the_memfds_apart_from_the_pages_and_the_rest() -> None:
    record = {"restore_s": 17.744, "restore_to_first_token_s": 18.834, "wake_s": 0.757, "stage_s": 16.529}
    stages = _stages(record, restore_phases(H200_RESTORE_MEMFDS) | {"restore_gpu_s": 2.772})
    assert list(stages) == list(STAGES)
    assert (stages["CRIU memfds"], stages["CRIU pages"], stages["GPU restore"]) == (11.745, 1.048, 2.772)
    assert stages["CRIU rest"] == 2.179 and stages["first answer"] == 0.333  # 17.744 - 15.565; 18.834 - 18.501
