"""The ``vllm_snapshot`` mode: vLLM's own ``vllm snapshot create`` and ``vllm snapshot restore``.

``create`` starts its own engine, dumps it with CRIU and its CUDA plugin and leaves a snapshot
folder (time, size); ``restore`` brings it back detached and returns after its HTTP check; then the
first token. ``HF_HUB_OFFLINE=1`` and ``kernel.io_uring_disabled=2`` for the phase (put back
after, ``io_uring.IoUringOff``). Needs a vLLM with the ``snapshot`` command run as a process on the
node (the gate says exactly why not otherwise).

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time

from nodetools import exitcodes
from nodetools.proc import launch_env, run_captured, stop_child_group, stop_group
from nodetools.snapshot import cuda_tool, images
from nodetools.snapshot.engine_run import EngineRun
from nodetools.snapshot.io_uring import IoUringOff
from nodetools.vllm_cli import serve_split

__all__ = ["VllmSnapshotRun"]


class VllmSnapshotRun(EngineRun):
    def measure(self) -> int:
        launch = self.timer.launch
        vllm, rest, why = serve_split(launch, "vllm_snapshot")
        if why:
            self.out["error"] = why
            return exitcodes.BAD_INPUT
        model, flags = rest[0], rest[1:]
        env = {**launch_env(launch, self.timer.secrets), "HF_HUB_OFFLINE": "1"}
        if self.args.libdir:
            env["CRIU_CUDA_PLUGIN_DIR"] = self.args.libdir
        self.out["cuda_checkpoint_tool"] = cuda_tool.identify(cuda_tool.PLUGIN_RUNS)
        guard = IoUringOff(self.timer.claim.lease if self.timer.claim else None)
        self.out["io_uring"] = guard.record
        try:
            refused = guard.disable()
            if refused:
                self.out["error"] = refused
                return exitcodes.DIED
            if self.args.images.exists():
                shutil.rmtree(self.args.images)
            self.args.images.parent.mkdir(parents=True, exist_ok=True)
            started = time.time()
            create = self._run_in_group([*vllm, "snapshot", "create", model, "--snapshot-dir", str(self.args.images),
                                         "--revision", self.args.revision, *flags], env, "vllm snapshot create")
            self.out["create_s"] = round(time.time() - started, 4)
            (self.args.log.parent / "snapshot-create.log").write_text(create.stdout + create.stderr)
            if create.returncode != 0:
                self.out["error"] = f"vllm snapshot create failed with rc {create.returncode} (see snapshot-create.log)"
                return exitcodes.DIED
            self.out["artifact_bytes"] = images.size_bytes(self.args.images)
            started = time.time()
            restore = self._run_in_group([*vllm, "snapshot", "restore", str(self.args.images), "--host", "127.0.0.1",
                                          "--port", str(self.timer.port)], env, "vllm snapshot restore")
            self.out["restore_s"] = round(time.time() - started, 4)
            (self.args.log.parent / "snapshot-restore.log").write_text(restore.stdout + restore.stderr)
            if restore.returncode != 0:
                self.out["error"] = f"vllm snapshot restore failed with rc {restore.returncode} " \
                                    "(see snapshot-restore.log)"
                return exitcodes.DIED
            for pgid in self._listener_pgids():
                self.lease_group(pgid, "server restored by vllm snapshot")
            if not self.wait_token("restore_to_first_token_s", started):
                self.out["error"] = "the restored server gave no token within 120 s"
                return exitcodes.DIED
            return exitcodes.OK
        finally:
            self._stop_listener()
            guard.restore()

    def _run_in_group(self, argv: list[str], env: dict[str, str], what: str) -> subprocess.CompletedProcess[str]:
        """``subprocess.run`` in a process group of its own, recorded in the lease while it runs, so a
        killed tool does not leave it behind unnamed; stopped (the whole group) on a timeout or SIGTERM."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.lease_group(proc.pid, what)
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
        out = run_captured(["ss", "-Hltnp", f"sport = :{self.timer.port}"], 30).stdout
        pgids = set()
        for pid in {int(m) for m in re.findall(r"pid=(\d+)", out)}:
            with contextlib.suppress(ProcessLookupError):
                pgids.add(os.getpgid(pid))
        return pgids - {os.getpgid(0)}  # never this tool's own group

    def _stop_listener(self) -> None:
        """The restored server is detached: find it by its port and stop its process group."""
        for pgid in self._listener_pgids():
            stop_group(pgid)
