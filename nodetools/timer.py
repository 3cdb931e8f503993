"""The engine timer: start an engine in its own process group, time it to its first real token, stop it.

Every tool that starts an engine uses it (``coldstart measure``, the snapshot modes, every offload
engine copy). The engine runs with its output in the log; its group id and its leader's start time
go to ``engine.pgid`` beside the log and into the tool's lease, so a cleanup or ``nodetools.reap``
can stop it even if the tool is killed. While it waits for the first token, each poll also looks at
what the node shows of the start (:mod:`nodetools.procwatch`). ``out`` is the record the tool
writes (``timings.json``): ``events`` in seconds after the start command, ``clock``, ``processes``,
and what the stop left on the node. A launch with ``import_profile`` gets Python's import profile of
every engine process (:mod:`nodetools.import_profile`: ``importtime.txt`` beside the log after the
stop; ``import_profile`` in the record). Stdlib only: this runs on the node.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.gpu import memory_used_mib
from nodetools.http_probe import first_token, post
from nodetools.import_profile import PROFILE_FILE, gather, profile_env, start_file
from nodetools.lease import Claim
from nodetools.node_state import node_state
from nodetools.proc import launch_env, port_open, start_time, stop_child_group
from nodetools.procwatch import GroupWatcher, clock_sample
from nodetools.vllm_cli import serve_split

__all__ = ["Timer"]


class Timer:
    """One engine: start it in its own process group, time it to a token, stop the whole group.

    ``claim`` (set by the caller that took the port lock and the lease) gets every group the timer
    starts; with ``inherit_lock`` the engine inherits the port lock, so it holds it as long as it
    lives (off for a tree CRIU dumps: a held file lock would fail the dump)."""

    def __init__(self, launch: dict[str, Any], log: Path, poll_s: float, timeout_s: float) -> None:
        self.launch = launch
        self.log = log
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.port = int(launch["port"])
        self.model = str(launch["model"])
        self.gpus = [int(g) for g in launch.get("gpus") or []]
        self.proc: subprocess.Popen[bytes] | None = None
        self.pre: subprocess.Popen[bytes] | None = None
        self.claim: Claim | None = None
        self.secrets: dict[str, str] = {}  # launch["secret_env"]'s values (nodetools.secret_env): the engine's only
        self.inherit_lock = True
        self.t0 = 0.0
        self.watch: GroupWatcher | None = None
        self._log_size_at_start = 0
        # Where each engine process's import profile grows while it runs (a launch that asks for it).
        self.profile_dir = log.parent / "imports" if launch.get("import_profile") else None
        self.out: dict[str, Any] = {"poll_s": poll_s, "events": {}}
        self.began = time.time()  # the timer's own time before the start command is overhead too

    def mark(self, event: str) -> float:
        t = time.time() - self.t0
        self.out["events"][event] = round(t, 4)
        return t

    def _spawn(self, argv: list[str], log_path: Path, pass_fds: tuple[int, ...] = (),
               profile: bool = False) -> subprocess.Popen[bytes]:
        env = launch_env(self.launch, self.secrets)
        with contextlib.ExitStack() as files:
            log = files.enter_context(log_path.open("ab"))
            stderr: Any = subprocess.STDOUT
            if profile and self.profile_dir is not None:  # CPython's profile lines: a file apart from the log
                self.profile_dir.mkdir(parents=True, exist_ok=True)
                env = profile_env(env, self.profile_dir, log_path)
                stderr = files.enter_context(start_file(self.profile_dir).open("ab"))
            return subprocess.Popen(argv, env=env, stdout=log, stderr=stderr, stdin=subprocess.DEVNULL,
                                    start_new_session=True, pass_fds=pass_fds)

    def _record(self, proc: subprocess.Popen[bytes], name: str, what: str, container: str = "") -> None:
        """``<name>.pgid`` beside the log ("PGID START"), and the group in the lease."""
        (self.log.parent / name).write_text(f"{proc.pid} {start_time(proc.pid) or ''}".strip() + "\n")
        if self.claim is not None:
            self.claim.lease.add_group(proc.pid, what, container)

    def start_preload(self) -> int:
        """``vllm preload``: the weights daemon must be ready before the engine's clock starts. It is
        the launch's own vLLM command (``python -m vllm.entrypoints.cli.main`` for a --target install)."""
        vllm, rest, why = serve_split(self.launch, "preload")
        if why:
            self.out["error"] = why
            return exitcodes.BAD_INPUT
        port = int(self.launch["preload_port"])
        argv = [*vllm, "preload", "--model", rest[0], "--weight-cache-health-port", str(port)]
        self.pre = self._spawn(argv, self.log.parent / "preload.log")
        self._record(self.pre, "preload.pgid", "vllm preload")
        started = time.time()
        while time.time() - started < self.timeout_s:
            if self.pre.poll() is not None:
                self.out["error"] = f"vllm preload exited with rc {self.pre.returncode} (see preload.log)"
                return exitcodes.DIED
            if port_open(port):
                self.out["preload_ready_s"] = round(time.time() - started, 3)
                return exitcodes.OK
            time.sleep(self.poll_s)
        self.out["error"] = f"vllm preload not ready within {self.timeout_s:.0f} s"
        return exitcodes.TIMEOUT

    def start(self) -> None:
        fds = self.claim.lock_fds(self.port) if self.claim is not None and self.inherit_lock else ()
        with contextlib.suppress(OSError):
            self._log_size_at_start = self.log.stat().st_size
        clock = clock_sample()
        self.t0 = clock["wall"]
        self.out["started_at"] = self.t0
        self.out["clock"] = clock
        self.out["argv"] = [str(a) for a in self.launch["argv"]]  # what ran: --plan showed the same (launch.argv)
        self.proc = self._spawn(self.launch["argv"], self.log, fds, profile=True)
        self._record(self.proc, "engine.pgid", f"engine on port {self.port}", str(self.launch.get("container") or ""))
        self.watch = GroupWatcher(self.proc.pid, clock, profile_dir=self.profile_dir)
        self.watch_once()

    def watch_once(self) -> None:
        """One look at what the timer can see on the node: the group's processes, the log's first byte."""
        if self.watch is not None:
            self.watch.poll()
        if "log_first_byte" not in self.out["events"]:
            with contextlib.suppress(OSError):
                if self.log.stat().st_size > self._log_size_at_start:
                    self.mark("log_first_byte")
                    if self.watch is not None:
                        self.watch.sample(force=True)  # where the API server's imports end

    def _keep_processes(self) -> None:
        if self.watch is not None:
            self.watch_once()
            self.out["processes"] = self.watch.records()
            if self.watch.dropped:
                self.out["processes_dropped"] = self.watch.dropped

    def wait_first_token(self, event: str) -> int:
        """Poll until a real token; returns an exit code."""
        assert self.proc is not None
        deadline = self.t0 + self.timeout_s
        try:
            while time.time() < deadline:
                tick = time.monotonic()
                self.watch_once()
                if self.proc.poll() is not None:
                    self.out["engine_rc"] = self.proc.returncode
                    self.mark("engine_exited")
                    return exitcodes.DIED
                if "port_open" not in self.out["events"] and port_open(self.port):
                    self.mark("port_open")
                if "port_open" in self.out["events"] and first_token(self.port, self.model, timeout=30):
                    self.mark(event)
                    return exitcodes.OK
                time.sleep(max(0.0, self.poll_s - (time.monotonic() - tick)))
            self.mark("timed_out")
            return exitcodes.TIMEOUT
        finally:
            self._keep_processes()

    def _timed_post(self, path: str, requested: str, done: str, key: str) -> float | None:
        """POST ``path`` between the events ``requested`` and ``done``, its seconds in ``out[key]``; the
        time it was requested, or None (the error recorded) when it did not answer HTTP 200."""
        t = self.mark(requested)
        status, _ = post(self.port, path, None, timeout=600)
        self.out[key] = round(self.mark(done) - t, 4)
        if status != 200:
            self.out["error"] = f"{path.partition('?')[0]} answered HTTP {status}"
            return None
        return t

    def sleep_wake(self) -> int:
        self.out["gpu_mem_mib_awake"] = memory_used_mib(self.gpus)
        if self._timed_post("/sleep?level=1", "sleep_requested", "asleep", "sleep_http_s") is None:
            return exitcodes.DIED
        self.out["gpu_mem_mib_asleep"] = memory_used_mib(self.gpus)
        t = self._timed_post("/wake_up", "wake_requested", "awake", "wake_http_s")
        if t is None:
            return exitcodes.DIED
        deadline = time.time() + 120
        while time.time() < deadline:
            if first_token(self.port, self.model, timeout=30):
                self.out["wake_to_first_token_s"] = round(self.mark("first_token_after_wake") - t, 4)
                self.out["gpu_mem_mib_after_wake"] = memory_used_mib(self.gpus)
                return exitcodes.OK
            time.sleep(self.poll_s)
        self.out["error"] = "no token within 120 s after wake"
        return exitcodes.TIMEOUT

    def stop(self) -> None:
        """Stop the whole engine group (a lone API process can leave its EngineCore on the GPU)."""
        if self.proc is None and self.pre is None:
            return
        self.mark("stop_requested")
        if self.launch.get("stop_argv"):
            subprocess.run(self.launch["stop_argv"], check=False, capture_output=True, timeout=120)
        for proc, grace in ((self.proc, 60), (self.pre, 30)):
            if proc is not None:
                stop_child_group(proc, grace)
        self.mark("stopped")
        deadline = time.monotonic() + 30
        while port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.out["port_free_after_stop"] = not port_open(self.port)
        self.out["gpu_mem_mib_after_stop"] = memory_used_mib(self.gpus)
        self.out["node_after_stop"] = node_state()
        if self.profile_dir is not None and self.profile_dir.is_dir():
            roles = self.watch.roles() if self.watch is not None else {}
            try:
                self.out["import_profile"] = gather(self.profile_dir, roles, self.log.parent / PROFILE_FILE, self.log)
            except OSError as exc:  # the profile is diagnostic: its loss must not fail the trial
                self.out["import_profile"] = {"error": str(exc)}

    def own_steps(self) -> dict[str, float]:
        """The timer's seconds outside the measured windows (benchmarks/bench_trial_overhead.py):
        from its start to the start command, and from the engine's stop to now (port, GPU memory)."""
        steps = {"before_start_s": round(self.t0 - self.began, 3)} if self.t0 else {}
        stopped = self.out["events"].get("stopped")
        if stopped is not None:
            steps["after_stop_s"] = round(time.time() - self.t0 - stopped, 3)
        return steps
