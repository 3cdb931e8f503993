"""Recognise why CRIU, cuda-checkpoint or ``vllm snapshot`` failed, and how long a restore's parts took,
from their own logs.

Each signature maps to a label and a sentence a user can act on; the snapshot experiment puts
them in the trial's reason, so a failed snapshot mode is a row that explains itself (the reference
campaign's two routes both stopped at messages like these, and the first dump of a live vLLM
engine on an H200 at three more: io_uring, the TCP lock, and then a pid still taken).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["SIGNATURES", "classify", "cuda_plugin_use", "explain", "last_error_lines", "lazy_pages_stats",
           "restore_phases"]

# (label, pattern, what it means / what to do)
SIGNATURES: tuple[tuple[str, re.Pattern[str], str], ...] = tuple(
    (label, re.compile(pattern), why) for label, pattern, why in (
        ("criu_cuda_plugin_failed", r"handle_device_vma plugin failed",
         "CRIU has no working CUDA plugin for the GPU mappings: build CRIU with its CUDA plugin (criu role)"),
        ("criu_nonregular_mapping", r"Can't handle non-regular mapping",
         "a device mapping (GPU memory) that CRIU cannot dump without its CUDA plugin"),
        ("criu_plugin_mismatch", r"undefined symbol: check_and_remove_inventory_plugin",
         "the CUDA plugin and CRIU are from different versions: install both from one build"),
        ("criu_too_old_vdso", r"Unexpected rt vDSO area bounds|kerndat_vdso_fill_symtable failed",
         "CRIU older than 4.1 cannot run on kernels >= 6.13: use CRIU >= 4.1"),
        ("criu_sockopt_unsupported", r"Can't get \d+:\d+ opt: Operation not supported",
         "this kernel refuses a socket option CRIU reads (SO_PASSCRED/SO_PASSSEC on TCP sockets, restricted "
         "in recent kernels): use CRIU >= 4.2"),
        ("criu_io_uring", r"anon_inode:\[io_uring\]",
         "a process of the engine maps an io_uring, which CRIU cannot dump (\"Unknown shit 600 "
         "(anon_inode:[io_uring])\"): kernel.io_uring_disabled=2 must be set before the engine starts (the criu "
         "mode does unless disable_io_uring is false; kernels before 6.6 lack the setting)"),
        ("criu_tcp_lock", r"Failed to lock TCP connection|Iptables configuration failed",
         "CRIU could not lock an established TCP connection with its network-lock method (iptables by default, "
         "'Iptables configuration failed' where it is missing): network_lock auto takes what the node has, or "
         "nftables, or skip"),
        ("criu_tcp_established", r"Connected TCP socket, consider using --tcp-established",
         "an established TCP connection inside the tree: criu_flags needs --tcp-established (in the default)"),
        ("criu_external_unix_socket", r"External socket is used",
         "a unix socket whose peer is outside the tree: criu_flags needs --ext-unix-sk (in the default)"),
        ("criu_link_remap", r"Can't create link remap for .*--link-remap",
         "an open file that was deleted (vLLM's POSIX semaphores in /dev/shm): criu_flags needs --link-remap "
         "(in the default)"),
        ("criu_shell_job", r"is not a session leader\. Consider using --shell-job",
         "the engine is not a session leader: criu_flags needs --shell-job (in the default)"),
        ("criu_file_locks", r"Some file locks are hold by dumping tasks",
         "the engine holds file locks: criu_flags needs --file-locks (in the default)"),
        ("criu_pid_taken", r"Can't fork for \d+: File exists",
         "the pid the image needs is taken (a process of the dumped tree not yet reaped, or another process): "
         "a restore brings the same pids back"),
        ("criu_userfaultfd", r"Unable to open an userfaultfd descriptor|connect to \S*lazy-pages\.socket failed",
         "lazy restore needs userfaultfd (root, or vm.unprivileged_userfaultfd=1) and its lazy-pages daemon"),
        ("criu_no_cuda_checkpoint", r"check that cuda-checkpoint is present in \$PATH",
         "CRIU's CUDA plugin found no cuda-checkpoint on CRIU's PATH and disabled itself: install it (the "
         "cuda_checkpoint role) or give its path as the mode's cuda_checkpoint"),
        ("criu_file_size_changed", r"has bad size \d+ \(expect \d+\)",
         "a regular file the engine holds open changed size since the dump (a log written without O_APPEND): "
         "CRIU refuses it; the criu mode cuts the files the tree held open for writing back to their dumped size "
         "before each later restore, so this one was opened after the dump's listing or by another process"),
        ("weights_reload_unsupported", r"Model reloading with `\w+` format",
         "vLLM cannot read the weights back after a level-2 sleep with this load format (only its default loader "
         "can): use quiesce sleep"),
        ("criu_dump_failed", r"Dumping FAILED", "criu dump failed"),
        ("criu_restore_failed", r"Restoring FAILED|Restore failed", "criu restore failed"),
        ("vllm_snapshot_plugin_dir", r"CRIU_CUDA_PLUGIN_DIR is required",
         "vllm snapshot needs CRIU_CUDA_PLUGIN_DIR: the folder holding CRIU's cuda_plugin.so"),
        ("vllm_snapshot_remote_model", r"snapshot create requires an immutable remote model",
         "vllm snapshot create needs a remote model id and a 40-character --revision, not a local folder"),
        ("cuda_checkpoint_unsupported", r"r555 or higher|--action.*(not supported|unrecognized)",
         "this driver's cuda-checkpoint has no --action: a driver >= 555 is needed"),
        ("cuda_checkpoint_failed", r"cuda-checkpoint --action \w+ --pid \d+ failed", "cuda-checkpoint failed"),
    )
)


def classify(text: str) -> list[str]:
    """Sorted labels of every known failure signature in ``text``."""
    return sorted({label for label, pattern, _ in SIGNATURES if pattern.search(text)})


def explain(labels: Iterable[str]) -> str:
    meaning = {label: why for label, _, why in SIGNATURES}
    return "; ".join(f"{label}: {meaning[label]}" for label in labels if label in meaning)


# Logged on runs that went well: missing CAP_SYS_RESOURCE (containers, this CI), and the CUDA
# plugin asking cuda-checkpoint for the restore thread of a process without CUDA (vLLM's helper).
_BENIGN = ("Can't setup RLIMIT_NOFILE", "Could not find restore thread for process ID")


def last_error_lines(path: Path, count: int = 3) -> list[str]:
    """The last ``count`` lines of a tool log that say Error (or its last lines when none do)."""
    if not path.is_file():
        return []
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()
             if line.strip() and not any(b in line for b in _BENIGN)]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines)[-count:]


_STAMP = r"^\((\d+\.\d+)\)"


def _stamp(text: str, marker: str, last: bool = False) -> float | None:
    found = re.findall(_STAMP + r".*" + marker, text, flags=re.MULTILINE)
    return float(found[-1 if last else 0]) if found else None


_PREAD_LINE = re.compile(_STAMP + r" pie: (\d+): (?:Preadv |`- returned (\d+))", re.MULTILINE)
# memfds and shared memory (vLLM's sleep puts the weights in pinned host buffers CRIU dumps as
# memfds) are read by CRIU's own page reader, one memfd after another: "Restoring memfd id=N", then
# "prN-N Read <offset> <pages> pages" per chunk and a "Read page from self" line as it is copied.
_MEMFD = re.compile(_STAMP + r" +\d+: Restoring memfd id=", re.MULTILINE)
_MEMFD_READ = re.compile(r"^\(\d+\.\d+\) +\d+: pr\d+-\d+ Read [0-9a-f]+ (\d+) pages$", re.MULTILINE)
_SELF_READ = re.compile(_STAMP + r" +\d+: \tpr\d+-\d+ Read page from self ", re.MULTILINE)
# CRIU with roles/criu/files/patches/parallel-shmem-restore.patch reads a large memfd with several threads and
# logs one line per object when all its pages are in, instead of the two lines per chunk above.
_PARALLEL = re.compile(_STAMP + r" +\d+: Restored shmem 0x[0-9a-f]+ in parallel: (\d+) bytes, (\d+) threads, ",
                       re.MULTILINE)
PAGE_BYTES = 4096  # x86_64: CRIU's page reader counts in the kernel's pages
# CRIU with roles/criu/files/patches/cuda-overlapped-resume.patch sums up its CUDA plugin's resume of all the
# processes in one line: "together" (their cuda-checkpoint runs overlapped), or "one at a time" where
# CRIU_CUDA_SERIAL_RESUME kept upstream's order.
_GPU_RESUME = re.compile(_STAMP + r" cuda_plugin: resumed (\d+) processes (?:together|one at a time) in ([0-9.]+) s",
                         re.MULTILINE)


def restore_phases(text: str) -> dict[str, float]:
    """From a ``criu restore -v4`` log: ``restore_gpu_s``, the CUDA plugin's GPU part ("resuming
    devices" to "finished cuda_plugin stage 2"); the pages CRIU's restorer read into the processes'
    memory (its ``Preadv`` calls: ``restore_pages_gib`` returned, ``restore_pages_s`` the seconds
    inside those calls, each from its line to its return, overlaps counted once;
    ``restore_pages_gb_s``, decimal); the memfds and shared memory its page
    reader copied (``restore_memfd_gib``, ``restore_memfd_s`` from the first "Restoring memfd" to the
    last copy, ``restore_memfd_gb_s``; ``restore_memfd_threads``, the most threads one object was read
    with, where a patched CRIU read any in parallel); where a patched CRIU's plugin summed up its resume,
    ``restore_gpu_resume_s`` (its seconds, restore thread lookups to the last interrupt) and
    ``restore_gpu_processes`` (the processes it resumed); and ``restore_log_s``, CRIU's own clock at its last
    line. Absent lines, absent keys."""
    out: dict[str, float] = {}
    resumed, finished = _stamp(text, "cuda_plugin: resuming devices"), _stamp(text, "finished cuda_plugin stage 2")
    if resumed is not None and finished is not None and finished >= resumed:
        out["restore_gpu_s"] = round(finished - resumed, 3)
    summary = _GPU_RESUME.search(text)
    if summary:
        out["restore_gpu_processes"] = int(summary.group(2))
        out["restore_gpu_resume_s"] = float(summary.group(3))
    reads = _preadv_intervals(text)
    if reads:
        read = sum(n for _, _, n in reads)
        span = _union_seconds([(a, b) for a, b, _ in reads])
        out["restore_pages_gib"] = round(read / 2**30, 3)
        out["restore_pages_s"] = round(span, 3)
        if span > 0:
            out["restore_pages_gb_s"] = round(read / 1e9 / span, 3)
    out.update(_memfd_phase(text))
    stamps = re.findall(_STAMP, text, flags=re.MULTILINE)
    if stamps:
        out["restore_log_s"] = float(stamps[-1])
    return out


def _preadv_intervals(text: str) -> list[tuple[float, float, int]]:
    """Each restorer's ``Preadv`` line paired with its process's next return: (start, end, bytes)."""
    open_at: dict[str, float] = {}
    out = []
    for stamp, pid, returned in _PREAD_LINE.findall(text):
        if not returned:
            open_at[pid] = float(stamp)
        elif pid in open_at:
            out.append((open_at.pop(pid), float(stamp), int(returned)))
    return out


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _memfd_phase(text: str) -> dict[str, float]:
    first = _MEMFD.search(text)
    parallel = _PARALLEL.findall(text)
    copies = [float(s) for s in _SELF_READ.findall(text)] + [float(s) for s, _, _ in parallel]
    if not first or not copies:
        return {}
    read = sum(int(n) for n in _MEMFD_READ.findall(text)) * PAGE_BYTES + sum(int(b) for _, b, _ in parallel)
    span = max(0.0, max(copies) - float(first.group(1)))
    out = {"restore_memfd_gib": round(read / 2**30, 3), "restore_memfd_s": round(span, 3)}
    if span > 0:
        out["restore_memfd_gb_s"] = round(read / 1e9 / span, 3)
    if parallel:
        out["restore_memfd_threads"] = max(int(t) for _, _, t in parallel)
    return out


def lazy_pages_stats(text: str) -> dict[str, int]:
    """From a ``criu lazy-pages -v4`` log: page faults it served (``lazy_page_faults``) and the pages
    it copied of those it had (``lazy_pages_copied``, ``lazy_pages_total``, summed over processes)."""
    out = {"lazy_page_faults": len(re.findall(r"#PF at 0x", text))}
    pairs = re.findall(r"UFFD transferred pages: \((\d+)/(\d+)\)", text)
    if pairs:
        out["lazy_pages_copied"] = sum(int(a) for a, _ in pairs)
        out["lazy_pages_total"] = sum(int(b) for _, b in pairs)
    return out


_PLUGIN_DISABLED = re.compile(r"cuda_plugin: (No GPU device found|check that \S+ is present in \$PATH|"
                              r"cuda-checkpoint --action flag not supported)")


def cuda_plugin_use(text: str) -> str | None:
    """What CRIU's CUDA plugin did in a dump log: ``acted`` (it paused or checkpointed a process's CUDA
    state), ``disabled: <why>``, ``idle`` (loaded, nothing of CUDA in the tree); None: not loaded."""
    if re.search(r"cuda_plugin: (pausing devices|Checkpointing CUDA devices) on pid", text):
        return "acted"
    disabled = _PLUGIN_DISABLED.search(text)
    if disabled:
        return f"disabled: {disabled.group(1)}"
    return "idle" if "cuda_plugin" in text else None
