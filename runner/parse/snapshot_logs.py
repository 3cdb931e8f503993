"""Recognise why CRIU, cuda-checkpoint or ``vllm snapshot`` failed, from their own logs.

Each signature maps to a label and a sentence a user can act on; the snapshot experiment puts
them in the trial's reason, so a failed snapshot mode is a row that explains itself (the reference campaign's
two routes both stopped at messages like these).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["SIGNATURES", "classify", "explain", "last_error_lines"]

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
        ("criu_io_uring", r"io_uring",
         "the process uses io_uring, which CRIU cannot dump: set kernel.io_uring_disabled=2 for the phase"),
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


# Logged on every run where CAP_SYS_RESOURCE is missing (containers, this CI); harmless.
_BENIGN = ("Can't setup RLIMIT_NOFILE",)


def last_error_lines(path: Path, count: int = 3) -> list[str]:
    """The last ``count`` lines of a tool log that say Error (or its last lines when none do)."""
    if not path.is_file():
        return []
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines()
             if line.strip() and not any(b in line for b in _BENIGN)]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines)[-count:]
