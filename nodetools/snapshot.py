"""Node-side snapshot measurements: restore a started engine instead of starting it.

    python -m nodetools.snapshot gates --mode MODE [--criu criu] [--libdir DIR] [--cuda-checkpoint BIN]
        [--gpus 0] [--tp 1] [--images DIR] [--model M] [--revision R] [--vllm BIN]
    python -m nodetools.snapshot measure --mode MODE --launch launch.json --log server.log --out timings.json
        --images DIR [--criu criu] [--libdir DIR] [--cuda-checkpoint BIN] [--poll-s 0.05] [--timeout-s 1800]
        [--trial ID] [--lease-dir DIR] [--lock-dir DIR]

``gates`` prints ``{"reasons": [...], "facts": {...}}``: every unmet precondition in words a user
can act on (nothing runs when there is one). ``measure`` takes the engine port's lock and writes
its lease as the cold-start timer does (``nodetools.lease``), starts the engine (the cold-start
timer's ``Timer``), times it to its first token, then:

- ``criu``: ``criu dump`` of the engine's process tree (the CUDA plugin suspends GPU state when the
  engine uses a GPU), image size, the port free again, ``criu restore -d``, first token from the
  restored server;
- ``cuda_checkpoint``: ``cuda-checkpoint --action lock|checkpoint|restore|unlock`` on every process
  of the engine that holds a CUDA context (nvidia-smi's compute apps of the engine's process group,
  else, where nvidia-smi lists no PIDs as in some VMs and containers, the group's processes that map
  ``/dev/nvidia*``), locking all before checkpointing any and restoring all before unlocking any;
  seconds per action and per process, GPU memory before/while/after, first token after restore.
  ``--cuda-checkpoint`` may name NVIDIA's binary or ``nodetools/cuda_checkpoint_api.py`` (the same
  command line over the driver's checkpoint API, for nodes without the binary);
- ``vllm_snapshot`` (vLLM in a venv): ``vllm snapshot create`` (its own engine start, time, artefact
  size) with ``HF_HUB_OFFLINE=1`` and ``kernel.io_uring_disabled=2`` for the phase (put back after),
  then ``vllm snapshot restore`` and the first token from the restored server.

A failed dump must leave the engine running or cleanly stopped, never frozen: CRIU resumes the
tree when a dump fails, and this program checks it and stops the engine either way. One snapshot
operation at a time per node: they share /dev/shm, so a lock file there serialises them. A
restored tree (and ``vllm snapshot create``'s own engine) goes into the lease as well, so the
reaper can stop it; the engine of the ``criu`` mode does not inherit the port lock (CRIU refuses
to dump a process holding a file lock), the tool alone holds it.
Exit codes (nodetools.exitcodes): 0 measured; 2 bad input; 3 a tool or the engine failed (see
``error`` and the tool logs); 4 stopped by SIGTERM; 7 the port is locked by another run or already
answers.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.coldstart import Timer, add_claim_options, first_token
from nodetools.gpu import compute_app_pids, driver_major, memory_total_mib, memory_used_mib, persistence_off
from nodetools.lease import PortBusy, claim, default_trial
from nodetools.proc import (
    interrupt_on_term,
    port_open,
    stat_ids,
    state,
    stop_child_group,
    stop_group,
    write_json_atomic,
)

__all__ = ["criu_version", "find_cuda_processes", "gates", "main"]

LOCK = Path("/dev/shm/.gpu-campaign-snapshot.lock")
MIN_CRIU = (4, 1)
IPC_RESTORE_DRIVER = 610  # cuda-checkpoint restores processes that use CUDA IPC (any TP>1 engine) from 610 on
LOCK_ACTION_DRIVER = 570  # the separate lock/checkpoint/restore/unlock actions (and the driver API) from 570 on
# A process that initialised CUDA maps the GPU's device files (/dev/nvidia0, /dev/nvidiactl; with a
# context also /dev/nvidia-uvm); one that only loaded libcuda maps none and cannot be checkpointed.
CUDA_MAPS_PATTERN = r"/dev/nvidia"


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)


def criu_version(criu: str) -> tuple[int, ...] | None:
    if shutil.which(criu) is None:
        return None
    match = re.search(r"Version:\s*([\d.]+)", _run([criu, "--version"], 30).stdout)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


PLUGIN_DIRS = ("/usr/lib/criu", "/usr/local/lib/criu")  # distribution and source builds' PLUGINDIR


def _plugin_dirs(libdir: str) -> list[str]:
    """Where CRIU looks for plugins: --libdir, then CRIU_LIBS_DIR, then the usual PLUGINDIRs."""
    return [d for d in (libdir, os.environ.get("CRIU_LIBS_DIR", ""), *PLUGIN_DIRS) if d]


def cuda_checkpoint_argv(tool: str) -> list[str]:
    """How to run the cuda-checkpoint tool: itself, or a ``.py`` (cuda_checkpoint_api.py) without its
    executable bit (a wheel may drop it) with this Python."""
    if tool.endswith(".py") and Path(tool).is_file() and not os.access(tool, os.X_OK):
        return [sys.executable, tool]
    return [tool]


def _cuda_checkpoint_found(tool: str) -> bool:
    return shutil.which(tool) is not None or (tool.endswith(".py") and Path(tool).is_file())


def _mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def gates(mode: str, criu: str, libdir: str, cuda_checkpoint: str, gpus: list[int], tp: int, model: str,
          revision: str, vllm: str, gpu_memory_fraction: float = 1.0) -> tuple[list[str], dict[str, Any]]:
    reasons: list[str] = []
    facts: dict[str, Any] = {"kernel": os.uname().release, "driver_major": driver_major()}
    on_gpu = bool(gpus)
    if mode in ("criu", "vllm_snapshot"):
        version = criu_version(criu)
        facts["criu_version"] = ".".join(map(str, version)) if version else None
        if version is None:
            reasons.append(f"CRIU not found ({criu}): the criu role builds it from source")
        elif version < MIN_CRIU:
            reasons.append(f"CRIU {facts['criu_version']} is too old (needs >= 4.1: older releases fail "
                           f"'criu check' on kernels >= 6.13)")
        else:
            check = _run([criu, "check"], 120)
            facts["criu_check"] = (check.stdout + check.stderr).strip().splitlines()[-1:]
            if "Looks good" not in check.stdout + check.stderr:
                reasons.append(f"'criu check' fails: {' '.join(facts['criu_check'])}")
        plugin = next((d for d in _plugin_dirs(libdir) if Path(d, "cuda_plugin.so").is_file()), None)
        facts["cuda_plugin_dir"] = plugin
        if on_gpu and plugin is None:
            reasons.append(f"CRIU's CUDA plugin (cuda_plugin.so) is in none of {_plugin_dirs(libdir)}: without it "
                           "GPU mappings cannot be dumped (handle_device_vma plugin failed)")
    if on_gpu or mode == "cuda_checkpoint":
        if not on_gpu or facts["driver_major"] is None:
            reasons.append("no GPU: cuda-checkpoint needs an NVIDIA GPU and driver")
        elif not _cuda_checkpoint_found(cuda_checkpoint):
            reasons.append(f"cuda-checkpoint not found ({cuda_checkpoint}): the cuda_checkpoint role installs it; "
                           "without NVIDIA's binary, give the path of nodetools/cuda_checkpoint_api.py")
        if mode == "cuda_checkpoint" and on_gpu and (facts["driver_major"] or LOCK_ACTION_DRIVER) < LOCK_ACTION_DRIVER:
            reasons.append(f"cuda-checkpoint's lock/checkpoint/restore/unlock actions need driver >= "
                           f"{LOCK_ACTION_DRIVER}; this node has {facts['driver_major']}")
        if on_gpu and tp > 1 and (facts["driver_major"] or 0) < IPC_RESTORE_DRIVER:
            reasons.append(f"TP={tp} uses CUDA IPC, whose checkpoint/restore needs driver >= {IPC_RESTORE_DRIVER}; "
                           f"this node has {facts['driver_major']}")
        if on_gpu and facts["driver_major"] is not None:
            off = persistence_off()
            if off:
                reasons.append(f"persistence mode is off on GPU(s) {', '.join(off)}: cuda-checkpoint restore needs it")
            # vLLM takes gpu-memory-utilization of each GPU (the first H200 run refused a 0.5 engine
            # because this counted the whole 140 GiB card against 125 GiB of RAM).
            need = int(sum(mib for index, mib in memory_total_mib().items() if index in gpus) * 2**20
                       * gpu_memory_fraction)
            facts["host_ram_needed_bytes"] = need
            if need > _mem_available_bytes():
                reasons.append(f"checkpointing moves up to {need / 2**30:.1f} GiB of GPU memory "
                               f"({gpu_memory_fraction:g} of GPU(s) {','.join(map(str, gpus))}) to host RAM, but only "
                               f"{_mem_available_bytes() / 2**30:.1f} GiB is available")
    if mode == "vllm_snapshot":
        if model.startswith("/") or not model:
            reasons.append("snapshot create requires an immutable remote model: give a model id, not a local path")
        if not re.fullmatch(r"[0-9a-f]{40}", revision or ""):
            reasons.append("snapshot create requires a 40-character --revision (the model's commit hash)")
        if tp != 1:
            reasons.append(f"vllm snapshot supports TP1 only (this engine has TP={tp})")
        if _run([vllm, "snapshot", "--help"], 120).returncode != 0 if shutil.which(vllm) else True:
            reasons.append(f"'{vllm} snapshot' is not available (needs vLLM with the snapshot command)")
    return reasons, facts


class _Lock:
    """An exclusive lock on the node's /dev/shm snapshot lock file, waited for up to ``timeout_s``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.fh: Any = None

    def __enter__(self) -> _Lock:
        self.fh = LOCK.open("a")
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError("another snapshot operation holds /dev/shm") from None
                time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


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


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class SnapshotRun:
    def __init__(self, args: argparse.Namespace, launch: dict[str, Any]) -> None:
        self.args = args
        self.timer = Timer(launch, args.log, args.poll_s, args.timeout_s)
        self.out = self.timer.out
        self.images = args.images

    def _criu(self, action: str, extra: list[str]) -> subprocess.CompletedProcess[str]:
        # -W puts the tool's log beside the server log, where the collect phase fetches it.
        argv = [self.args.criu, action, "-D", str(self.images), "-W", str(self.args.log.parent), "-o",
                f"{action}.log", "--tcp-established", *extra]
        if self.args.libdir:
            argv += ["-L", self.args.libdir]
        return _run(argv, self.args.timeout_s)

    def _wait_token(self, event: str, since: float) -> bool:
        deadline = time.time() + 120
        while time.time() < deadline:
            if first_token(self.timer.port, self.timer.model, timeout=30):
                self.out[event] = round(time.time() - since, 4)
                return True
            time.sleep(self.args.poll_s)
        return False

    def criu(self) -> int:
        pid = self.timer.proc.pid if self.timer.proc else 0
        if self.images.exists():
            shutil.rmtree(self.images)
        self.images.mkdir(parents=True)
        started = time.time()
        dump = self._criu("dump", ["-t", str(pid)])
        self.out["dump_s"] = round(time.time() - started, 4)
        if dump.returncode != 0:
            time.sleep(0.2)
            letter = state(pid)
            self.out["after_failed_dump"] = {"T": "frozen", "": "gone", "Z": "gone"}.get(letter, "running")
            if letter == "T":  # never leave it half-frozen
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGCONT)
            self.out["error"] = f"criu dump failed with rc {dump.returncode} (see dump.log)"
            return exitcodes.DIED
        self.timer.proc.wait(timeout=30)  # CRIU killed the dumped tree: reap our child
        # Killed children linger as zombies until PID 1 reaps them, and while any of them still
        # names the engine's PID as its group, the restore cannot have that PID back.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.out["image_bytes"] = _du(self.images)
        self.out["port_free_after_dump"] = not port_open(self.timer.port)
        started = time.time()
        restore = self._criu("restore", ["-d"])
        self.out["restore_s"] = round(time.time() - started, 4)
        if restore.returncode != 0:
            self.out["error"] = f"criu restore failed with rc {restore.returncode} (see restore.log)"
            return exitcodes.DIED
        self.out["restored_pid_same"] = state(pid) not in ("", "Z")
        if self.timer.claim is not None and self.out["restored_pid_same"]:
            self.timer.claim.lease.add_group(pid, "engine restored by criu")  # same pid, a new start time
        if not self._wait_token("restore_to_first_token_s", started):
            self.out["error"] = "the restored engine gave no token within 120 s"
            return exitcodes.DIED
        return exitcodes.OK

    def _gpu_pids(self) -> tuple[list[int], str]:
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
        done = _run([*cuda_checkpoint_argv(self.args.cuda_checkpoint), *op, "--pid", str(pid)], self.args.timeout_s)
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

    def cuda_checkpoint(self) -> int:
        pids, source = self._gpu_pids()
        self.out["gpu_pids_source"] = source
        self.out["cuda_checkpoint_tool"] = self.args.cuda_checkpoint
        # Each process's state first: it checks the tool can reach the process, and times the tool's own
        # start (process start, driver init), which every action's seconds below include.
        per: dict[str, dict[str, float]] = {}
        kept, skipped = [], {}
        for pid in pids:
            done, took = self._tool(pid, "--get-state")
            state = done.stdout.strip() if done.returncode == 0 else (done.stderr or done.stdout).strip()[-200:]
            if source == "proc-maps" and state != "running":
                skipped[str(pid)] = state  # maps the driver but holds no CUDA state the driver can checkpoint
                continue
            if done.returncode != 0:
                self.out["gpu_pids"] = pids
                self.out["error"] = f"cuda-checkpoint --get-state --pid {pid} failed: {state}"
                return exitcodes.DIED
            per[str(pid)] = {"get_state": took}
            kept.append(pid)
        pids = kept
        self.out["gpu_pids"] = pids
        if skipped:
            self.out["gpu_pids_skipped"] = skipped
        if not pids:
            self.out["error"] = "no process of the engine holds a CUDA context (nvidia-smi --query-compute-apps, " \
                                "then /proc/PID/maps of the engine's process group)"
            return exitcodes.DIED
        self.out["tool_start_s"] = sorted(p["get_state"] for p in per.values())[len(per) // 2]
        self.out["per_process_s"] = per
        self.out["gpu_mem_mib_before"] = memory_used_mib(self.timer.gpus)
        restored_at = 0.0
        # NVIDIA's order for a process tree: every process locked before any is checkpointed, every
        # one restored before any is unlocked.
        for action in ("lock", "checkpoint", "restore", "unlock"):
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
        if not self._wait_token("restore_to_first_token_s", restored_at):
            self.out["error"] = "no token within 120 s after cuda-checkpoint restore"
            return exitcodes.DIED
        return exitcodes.OK

    def vllm_snapshot(self) -> int:
        launch = self.timer.launch
        argv = list(launch["argv"])
        if argv[1:2] != ["serve"]:
            self.out["error"] = "vllm_snapshot needs a vLLM process runtime (argv: vllm serve MODEL ...)"
            return exitcodes.BAD_INPUT
        vllm, model, flags = argv[0], argv[2], argv[3:]
        env = {**os.environ, **{k: str(v) for k, v in (launch.get("env") or {}).items()}, "HF_HUB_OFFLINE": "1"}
        if self.args.libdir:
            env["CRIU_CUDA_PLUGIN_DIR"] = self.args.libdir
        sysctl = Path("/proc/sys/kernel/io_uring_disabled")
        before = sysctl.read_text().strip() if sysctl.exists() else None
        try:
            if before is not None:
                sysctl.write_text("2\n")
            if self.images.exists():
                shutil.rmtree(self.images)
            self.images.parent.mkdir(parents=True, exist_ok=True)
            started = time.time()
            create = self._run_in_group([vllm, "snapshot", "create", model, "--snapshot-dir", str(self.images),
                                         "--revision", self.args.revision, *flags], env, "vllm snapshot create")
            self.out["create_s"] = round(time.time() - started, 4)
            (self.args.log.parent / "snapshot-create.log").write_text(create.stdout + create.stderr)
            if create.returncode != 0:
                self.out["error"] = f"vllm snapshot create failed with rc {create.returncode} (see snapshot-create.log)"
                return exitcodes.DIED
            self.out["artifact_bytes"] = _du(self.images)
            started = time.time()
            restore = self._run_in_group([vllm, "snapshot", "restore", str(self.images), "--host", "127.0.0.1",
                                          "--port", str(self.timer.port)], env, "vllm snapshot restore")
            self.out["restore_s"] = round(time.time() - started, 4)
            (self.args.log.parent / "snapshot-restore.log").write_text(restore.stdout + restore.stderr)
            if restore.returncode != 0:
                self.out["error"] = f"vllm snapshot restore failed with rc {restore.returncode} " \
                                    "(see snapshot-restore.log)"
                return exitcodes.DIED
            if self.timer.claim is not None:
                for pgid in self._listener_pgids():
                    self.timer.claim.lease.add_group(pgid, "server restored by vllm snapshot")
            if not self._wait_token("restore_to_first_token_s", started):
                self.out["error"] = "the restored server gave no token within 120 s"
                return exitcodes.DIED
            return exitcodes.OK
        finally:
            if before is not None:
                sysctl.write_text(f"{before}\n")
            self._stop_listener()

    def _run_in_group(self, argv: list[str], env: dict[str, str], what: str) -> subprocess.CompletedProcess[str]:
        """``subprocess.run`` in a process group of its own, recorded in the lease while it runs, so a
        killed tool does not leave it behind unnamed; stopped (the whole group) on a timeout or SIGTERM."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        if self.timer.claim is not None:
            self.timer.claim.lease.add_group(proc.pid, what)
        try:
            stdout, stderr = proc.communicate(timeout=self.args.timeout_s)
        except BaseException:
            stop_child_group(proc, 10)
            raise
        return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)

    def _listener_pgids(self) -> set[int]:
        """The process groups of whatever listens on the engine port (a detached, restored server)."""
        if shutil.which("ss") is None:
            return set()
        out = _run(["ss", "-Hltnp", f"sport = :{self.timer.port}"], 30).stdout
        pgids = set()
        for pid in {int(m) for m in re.findall(r"pid=(\d+)", out)}:
            with contextlib.suppress(ProcessLookupError):
                pgids.add(os.getpgid(pid))
        return pgids - {os.getpgid(0)}  # never this tool's own group

    def _stop_listener(self) -> None:
        """The restored server is detached: find it by its port and stop its process group."""
        for pgid in self._listener_pgids():
            stop_group(pgid)

    def stop(self) -> None:
        if self.timer.proc is not None and self.timer.proc.poll() is not None:
            stop_group(self.timer.proc.pid)  # a restored tree is no longer our child
            self.out["events"]["stopped"] = round(time.time() - self.timer.t0, 4)
        self.timer.stop()


def _main_gates(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.snapshot gates")
    p.add_argument("--mode", required=True, choices=("criu", "cuda_checkpoint", "vllm_snapshot"))
    p.add_argument("--criu", default="criu")
    p.add_argument("--libdir", default="")
    p.add_argument("--cuda-checkpoint", default="cuda-checkpoint")
    p.add_argument("--gpus", default="")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--model", default="")
    p.add_argument("--revision", default="")
    p.add_argument("--vllm", default="vllm")
    p.add_argument("--gpu-memory-fraction", type=float, default=1.0,
                   help="share of each GPU's memory the engine takes (vLLM's --gpu-memory-utilization)")
    a = p.parse_args(argv)
    try:
        gpus = [int(g) for g in a.gpus.split(",") if g.strip()]
    except ValueError:
        sys.stderr.write(f"snapshot gates: --gpus {a.gpus!r} is not a comma-separated list of GPU indices\n")
        return exitcodes.BAD_INPUT
    reasons, facts = gates(a.mode, a.criu, a.libdir, a.cuda_checkpoint, gpus, a.tp, a.model, a.revision, a.vllm,
                           a.gpu_memory_fraction)
    sys.stdout.write(json.dumps({"reasons": reasons, "facts": facts}) + "\n")
    return exitcodes.OK


def _main_measure(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.snapshot measure")
    p.add_argument("--mode", required=True, choices=("criu", "cuda_checkpoint", "vllm_snapshot"))
    p.add_argument("--launch", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--criu", default="criu")
    p.add_argument("--libdir", default="")
    p.add_argument("--cuda-checkpoint", default="cuda-checkpoint")
    p.add_argument("--revision", default="")
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--timeout-s", type=float, default=1800)
    add_claim_options(p)
    args = p.parse_args(argv)
    try:
        launch = json.loads(args.launch.read_text())
        run = SnapshotRun(args, launch)  # reads the port and the model: KeyError when missing
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"snapshot: bad --launch {args.launch}: {exc}\n")
        return exitcodes.BAD_INPUT
    workdir = args.log.parent
    try:
        with claim(f"snapshot measure {args.mode}", args.trial or default_trial(workdir), workdir, [run.timer.port],
                   args.lease_dir, args.lock_dir) as held:
            run.timer.claim = held
            run.timer.inherit_lock = args.mode != "criu"  # CRIU refuses to dump a process holding a file lock
            return _measure(run, args)
    except PortBusy as exc:
        sys.stderr.write(f"snapshot: {exc}\n")
        return exitcodes.BUSY


def _measure(run: SnapshotRun, args: argparse.Namespace) -> int:
    interrupt_on_term()  # Ansible's task timeout, or the reaper, must still stop the engine
    rc = exitcodes.BAD_INPUT
    try:
        with _Lock(args.timeout_s):
            if args.mode == "vllm_snapshot":
                rc = run.vllm_snapshot()
            else:
                run.timer.start()
                rc = run.timer.wait_first_token("first_token")
                if rc == exitcodes.OK:
                    run.out["first_token_s"] = run.out["events"]["first_token"]
                    rc = run.criu() if args.mode == "criu" else run.cuda_checkpoint()
                elif "error" not in run.out:
                    run.out["error"] = "the engine did not start (see server.log)"
    except TimeoutError as exc:
        run.out["error"] = str(exc)
        rc = exitcodes.DIED
    except KeyboardInterrupt:
        run.out["error"] = "interrupted (SIGTERM)"
        rc = exitcodes.TIMEOUT
    finally:
        run.stop()
        run.out["rc"] = rc
        write_json_atomic(args.out, run.out)
    if rc != exitcodes.OK:
        sys.stderr.write(f"snapshot: {run.out.get('error', 'failed')}\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["gates"]:
        return _main_gates(args[1:])
    if args[:1] == ["measure"]:
        return _main_measure(args[1:])
    sys.stderr.write("usage: python -m nodetools.snapshot {gates|measure} ... (see --help of each)\n")
    return exitcodes.BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
