"""After an offload trial (always, even when it failed): leave the node as it was found.

Stops whatever a killed run left (what the trial's leases name, each copy's recorded group and
container), removes the ``vllm_offload_*`` files created since the engine started (a dead engine
leaves its buffer behind) and the trial's file-system tier, and keeps the kernel log lines written
since the trial began (``dmesg.txt``: the OOM killer's evidence). Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from nodetools.engine_cleanup import cleanup
from nodetools.lease import default_lease_dir, default_trial
from nodetools.offload.layout import copy_dir
from nodetools.offload.leftovers import gib

__all__ = ["cleanup_trial", "remove_trial_files"]


def remove_trial_files(shm: Path, since: float, fs_dir: str) -> list[str]:
    """The ``vllm_offload_*`` files created since ``since`` (a dead engine leaves its buffer behind)
    and the trial's own file-system tier folder."""
    removed = []
    for path in sorted(shm.glob("vllm_offload_*")):
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            if stat.st_mtime >= since - 1:
                path.unlink()
                removed.append(f"{path} ({gib(stat.st_size)})")
    if fs_dir and Path(fs_dir).is_dir():
        shutil.rmtree(fs_dir, ignore_errors=True)
        removed.append(f"file-system tier {fs_dir}")
    return removed


def _kernel_log_since(since: float) -> str:
    """Kernel log lines stamped after ``since`` (unix seconds), or why they cannot be read."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        done = subprocess.run(["dmesg"], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"# kernel log not readable: {exc}\n"
    if done.returncode != 0:
        return f"# kernel log not readable: {done.stderr.strip()[:200]}\n"
    boot = time.time() - uptime
    keep = []
    for line in done.stdout.splitlines():
        stamp, _, _ = line.lstrip("[ ").partition("]")
        with contextlib.suppress(ValueError):
            if boot + float(stamp) >= since - 1:
                keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def cleanup_trial(workdir: Path, port: int, shm: Path, trial: str = "", lease_dir: Path | None = None
                  ) -> dict[str, Any]:
    """Stop every copy's leftovers (its recorded group, its container, what the trial's leases name),
    then remove the trial's offload files and keep the kernel log; ``port`` is checked when no launch
    was written."""
    launch_file = workdir / "launch.json"
    launch = json.loads(launch_file.read_text()) if launch_file.is_file() else {}
    copies = launch.get("copies") or []
    stopped: list[str] = []
    free = True
    trial, lease_dir = trial or default_trial(workdir), lease_dir or default_lease_dir(workdir)
    for i, spec in enumerate(copies or [{"port": port}]):
        result = cleanup(copy_dir(workdir, i), int(spec["port"]), str(spec.get("container") or ""), trial,
                         lease_dir)
        stopped += result["stopped"]
        free = free and result["port_free"]
    # An engine was started iff a timer wrote its group id: only then can there be files to remove.
    starts = [p.stat().st_mtime for i in range(max(1, len(copies)))
              if (p := copy_dir(workdir, i) / "engine.pgid").is_file()]
    removed: list[str] = []
    if starts:
        removed = remove_trial_files(shm, min(starts), str(launch.get("fs_dir") or ""))
        (workdir / "dmesg.txt").write_text(_kernel_log_since(min(starts)))
    return {"stopped": stopped, "ports_free": free, "removed": removed}
