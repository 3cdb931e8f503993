"""The ``cuda_checkpoint`` mode: the engine's GPU state to host RAM and back, in place.

``cuda-checkpoint --action lock|checkpoint|restore|unlock`` on every process of the engine that
holds a CUDA context: nvidia-smi's compute apps of the engine's process group or session, else
(where nvidia-smi lists no PIDs, as in some VMs and containers) the group's processes that map
``/dev/nvidia*``. All are locked before any is checkpointed and restored before any is unlocked
(NVIDIA's order for a process tree); seconds per action and per process, GPU memory before /
while / after, the first token after the restore. With ``quiesce`` the engine sleeps before the
lock and is woken after the unlock (``quiesce.py``), so only what the sleep left on the GPU moves.
``--cuda-checkpoint`` names NVIDIA's binary or ``nodetools/cuda_checkpoint_api.py``; which one
acted is recorded (``cuda_tool.identify``).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path

from nodetools import exitcodes
from nodetools.gpu import compute_app_pids, memory_used_mib
from nodetools.proc import run_captured, stat_ids
from nodetools.snapshot import cuda_tool
from nodetools.snapshot.engine_run import EngineRun

__all__ = ["CUDA_MAPS_PATTERN", "CudaCheckpointRun", "find_cuda_processes"]

# A process that initialised CUDA maps the GPU's device files (/dev/nvidia0, /dev/nvidiactl; with a
# context also /dev/nvidia-uvm); one that only loaded libcuda maps none and cannot be checkpointed.
CUDA_MAPS_PATTERN = r"/dev/nvidia"
ACTIONS = ("lock", "checkpoint", "restore", "unlock")


def find_cuda_processes(pgid: int, proc_root: Path = Path("/proc"), pattern: str = CUDA_MAPS_PATTERN) -> list[int]:
    """The processes of process group or session ``pgid`` whose memory maps name a file matching
    ``pattern`` (by default the GPU device files a process that initialised CUDA maps): for nodes
    where nvidia-smi lists no PIDs (VMs, containers with their own PID namespace)."""
    found = []
    regex = re.compile(pattern)
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if pgid not in stat_ids((entry / "stat").read_text()):
                continue
            maps = (entry / "maps").read_text()
        except (OSError, IndexError, ValueError):
            continue  # gone, a kernel thread, or not ours to read
        paths = (fields[5] for fields in (line.split(maxsplit=5) for line in maps.splitlines()) if len(fields) == 6)
        if any(regex.search(path) for path in paths):
            found.append(int(entry.name))
    return sorted(found)


class CudaCheckpointRun(EngineRun):
    def gpu_pids(self) -> tuple[list[int], str]:
        """The engine's processes that hold a CUDA context, and where they were found."""
        pgid = self.timer.proc.pid if self.timer.proc else 0
        pids = []
        for pid in compute_app_pids():
            with contextlib.suppress(OSError):  # gone
                if pgid in (os.getpgid(pid), os.getsid(pid)):
                    pids.append(pid)
        if pids:
            return sorted(set(pids)), "nvidia-smi"
        return find_cuda_processes(pgid), "proc-maps"

    def _tool(self, pid: int, *op: str) -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.time()
        done = run_captured([*cuda_tool.argv(self.args.cuda_checkpoint), *op, "--pid", str(pid)], self.args.timeout_s)
        took = round(time.time() - started, 4)
        self.out.setdefault("cuda_checkpoint_calls", []).append(
            {"pid": pid, "op": " ".join(op), "s": took, "rc": done.returncode,
             "output": (done.stdout + done.stderr).strip()[-300:]})
        return done, took

    def _bring_back(self, pids: list[int]) -> None:
        """After a failed action: restore and unlock whatever is checkpointed or locked, so the engine can
        stop cleanly, and record the states it was left in."""
        states = {}
        for pid in pids:
            state = self._tool(pid, "--get-state")[0].stdout.strip()
            if state == "checkpointed":
                self._tool(pid, "--action", "restore")
                state = self._tool(pid, "--get-state")[0].stdout.strip()
            if state == "locked":
                self._tool(pid, "--action", "unlock")
                state = self._tool(pid, "--get-state")[0].stdout.strip()
            states[str(pid)] = state or "unknown"
        self.out["after_failed_cuda_checkpoint"] = states

    def _reachable(self, pids: list[int], source: str) -> tuple[list[int], dict[str, dict[str, float]], str]:
        """Each process's state first: it checks the tool can reach it, and times the tool's own start
        (process start, driver init), which every action's seconds include. (kept, per-process, error)"""
        per: dict[str, dict[str, float]] = {}
        kept, skipped = [], {}
        for pid in pids:
            done, took = self._tool(pid, "--get-state")
            state = done.stdout.strip() if done.returncode == 0 else (done.stderr or done.stdout).strip()[-200:]
            if source == "proc-maps" and state != "running":
                skipped[str(pid)] = state  # maps the driver but holds no CUDA state the driver can checkpoint
                continue
            if done.returncode != 0:
                return kept, per, f"cuda-checkpoint --get-state --pid {pid} failed: {state}"
            per[str(pid)] = {"get_state": took}
            kept.append(pid)
        if skipped:
            self.out["gpu_pids_skipped"] = skipped
        return kept, per, ""

    def after_first_token(self) -> int:
        self.out["cuda_checkpoint_tool"] = cuda_tool.identify(self.args.cuda_checkpoint)
        error = self.sleep_engine()
        if error:
            self.out["error"] = error
            return exitcodes.DIED
        candidates, source = self.gpu_pids()
        self.out["gpu_pids_source"] = source
        pids, per, error = self._reachable(candidates, source)
        self.out["gpu_pids"] = pids if not error else candidates
        if error:
            self.out["error"] = error
            return exitcodes.DIED
        if not pids:
            self.out["error"] = "no process of the engine holds a CUDA context (nvidia-smi --query-compute-apps, " \
                                "then /proc/PID/maps of the engine's process group)"
            return exitcodes.DIED
        self.out["tool_start_s"] = sorted(p["get_state"] for p in per.values())[len(per) // 2]
        self.out["per_process_s"] = per
        self.out["gpu_mem_mib_before"] = memory_used_mib(self.timer.gpus)
        restored_at = 0.0
        for action in ACTIONS:
            started = time.time()
            for pid in pids:
                done, took = self._tool(pid, "--action", action)
                per[str(pid)][action] = took
                if done.returncode != 0:
                    self.out["error"] = f"cuda-checkpoint --action {action} --pid {pid} failed: " \
                                        f"{(done.stderr or done.stdout).strip()[-300:]}"
                    self._bring_back(pids)
                    return exitcodes.DIED
            self.out[f"{action}_s"] = round(time.time() - started, 4)
            if action == "checkpoint":
                self.out["gpu_mem_mib_while"] = memory_used_mib(self.timer.gpus)
            if action == "restore":
                restored_at = started
        self.out["gpu_mem_mib_after"] = memory_used_mib(self.timer.gpus)
        error = self.wake_engine(self.out)
        if error:
            self.out["error"] = error
            return exitcodes.DIED
        if not self.wait_token("restore_to_first_token_s", restored_at):
            self.out["error"] = "no token within 120 s after cuda-checkpoint restore"
            return exitcodes.DIED
        return exitcodes.OK
