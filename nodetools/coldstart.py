"""The node-side cold-start timer: start an engine, time it to the first real token, stop it.

    python -m nodetools.coldstart measure --launch launch.json --log server.log --out timings.json
        [--poll-s 0.05] [--timeout-s 1800] [--sleep-wake] [--residency PATH ...]
        [--trial ID] [--lease-dir DIR] [--lock-dir DIR]
    python -m nodetools.coldstart prepare --dir WORKDIR --launch-json JSON [--fresh-cache DIR] [--empty-cache]
        [--page-cache drop|warm|keep] [--drop-scope global|files] [--model PATH]
        [--engine-python PY --bytecode-packages vllm,torch] [--reap-leases DIR] [--make-model ARGV_JSON]
        [--check [--python-module MOD] [--exists PATH ...] [--docker-image IMG]
                 [--vllm-subcommand NAME [--answers-dir DIR]]]
    python -m nodetools.coldstart trial [prepare's options] [measure's options but --launch, --log, --out]
    python -m nodetools.coldstart cleanup --dir WORKDIR --port N [--container NAME] [--trial ID] [--lease-dir DIR]

``launch.json`` holds ``argv``, ``env``, ``stop_argv``, ``port`` and ``model`` (what the playbook
rendered with the ``engine_launch`` filter). The engine runs in its own process group with its
output in ``--log``; its group id and its leader's start time go to ``engine.pgid`` beside the log
and into the timer's lease (``nodetools.lease``: ``--lease-dir``, by default ``.leases`` beside the
trial folder; ``--trial``, by default the folder's name), so a cleanup or ``nodetools.reap`` can
stop it even if this timer is killed. Before anything starts, the timer takes the engine port's
lock (``--lock-dir``) and checks that nothing answers on the port. Wall time runs from the start
command to the first completion token, polling a one-token completion every ``--poll-s`` seconds.
While it waits, every poll also looks at what the node shows of the start
(:mod:`nodetools.procwatch`): the processes of the engine's group as they appear (``processes``:
pid, start in seconds after the start command from ``/proc``, name, role such as ``engine_core``),
the log's first byte (``events.log_first_byte``) and the port opening (``events.port_open``);
``clock`` holds the wall, monotonic and boot-time clocks read at the start command and the local
time zone's offset, which map those seconds and the log's timestamps onto one timeline
(``runner.parse.startup_timeline``). ``before_start`` is ``prepare.json``, what the start began
from. With ``--sleep-wake`` the started engine is put to sleep (level 1) and woken, and the time to wake
and to the first token after wake are recorded. The engine is always stopped (the whole group;
``events.stop_requested`` to ``events.stopped`` is the stop a restart pays before its start), and
the port checked free: a port that still answers after the stop fails the measure (7), so the
playbook's cleanup runs only when a timer did not finish cleanly. After the stop it records what a
trial changes on the node (``gpu_mem_mib_after_stop``; ``node_after_stop``: host memory, page cache,
``/dev/shm`` offload buffers, :mod:`nodetools.node_state`). Stdlib only: this runs on the node.

``prepare`` does everything before the start in one program (:mod:`nodetools.startprep`): stop
what an earlier, killed attempt left (``--reap-leases``), make the model if it is missing
(``--make-model``), check the mode's preconditions (``--check``: the launch's port and GPUs, a
module the mode needs, a vLLM subcommand); then, unless one is unmet, an emptied trial folder and fresh cache, the
persistent caches emptied with ``--empty-cache``, the cache folders, ``launch.json``, what the
start begins from in ``prepare.json`` (the caches' state, the engine's warm ``.pyc`` fractions),
then the page cache dropped or the weights read. It prints JSON ``{"reasons": [...], "changed":
[...], "before_start": {...}, "steps_s": {...}}``: a reason means skip the trial.

``trial`` is ``prepare`` then, unless it gave a reason to skip, ``measure`` of the ``launch.json``
it wrote (``server.log`` and ``timings.json`` in ``--dir``): one program for a startup trial's
node work. It prints prepare's JSON (without ``before_start``, which is in ``timings.json``) with
``measure_rc`` when it measured, and exits with measure's code.

``cleanup`` stops what a killed timer may have left (what the trial's leases name, the group in
``engine.pgid`` once its start time proves it is the engine's, the container) and prints JSON
``{"stopped": [...], "port_free": bool}``.

Exit codes (nodetools.exitcodes): 0 measured (prepared); 2 bad input; 3 the engine exited before
its first token (prepare: a leftover outlived SIGKILL, or the model could not be made); 4 timed out
or stopped by SIGTERM; 7 the port is locked by another run, already answers, or still answers after
the engine was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.gpu import memory_used_mib
from nodetools.lease import Claim, PortBusy, claim, default_lease_dir, default_trial
from nodetools.node_state import node_state
from nodetools.pagecache import resident_fraction
from nodetools.proc import (
    group_members,
    interrupt_on_term,
    launch_env,
    port_open,
    start_time,
    stop_child_group,
    write_json_atomic,
)
from nodetools.procwatch import GroupWatcher, clock_sample
from nodetools.reap import reap
from nodetools.startprep import LAUNCH, PREPARED, Checks, PrepareError, before_prepare, drop_scope, prepare
from nodetools.vllm_cli import serve_split

__all__ = ["Timer", "add_claim_options", "cleanup", "first_token", "main", "post", "write_json_atomic"]


def post(port: int, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def first_token(port: int, model: str, timeout: float) -> bool:
    """One tiny completion; True when it returned a real token."""
    try:
        status, body = post(port, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 1,
                                                        "temperature": 0}, timeout)
    except (OSError, http.client.HTTPException):
        return False
    if status != 200:
        return False
    try:
        choices = json.loads(body).get("choices") or []
    except ValueError:
        return False
    return bool(choices and choices[0].get("text"))


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
        self.inherit_lock = True
        self.t0 = 0.0
        self.watch: GroupWatcher | None = None
        self._log_size_at_start = 0
        self.out: dict[str, Any] = {"poll_s": poll_s, "events": {}}
        self.began = time.time()  # the timer's own time before the start command is overhead too

    def mark(self, event: str) -> float:
        t = time.time() - self.t0
        self.out["events"][event] = round(t, 4)
        return t

    def _spawn(self, argv: list[str], log_path: Path, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        env = launch_env(self.launch)
        with log_path.open("ab") as log:
            return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
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
        self.proc = self._spawn(self.launch["argv"], self.log, fds)
        self._record(self.proc, "engine.pgid", f"engine on port {self.port}", str(self.launch.get("container") or ""))
        self.watch = GroupWatcher(self.proc.pid, clock)
        self.watch_once()

    def watch_once(self) -> None:
        """One look at what the timer can see on the node: the group's processes, the log's first byte."""
        if self.watch is not None:
            self.watch.poll()
        if "log_first_byte" not in self.out["events"]:
            with contextlib.suppress(OSError):
                if self.log.stat().st_size > self._log_size_at_start:
                    self.mark("log_first_byte")

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

    def sleep_wake(self) -> int:
        self.out["gpu_mem_mib_awake"] = memory_used_mib(self.gpus)
        t = self.mark("sleep_requested")
        status, _ = post(self.port, "/sleep?level=1", None, timeout=600)
        self.out["sleep_http_s"] = round(self.mark("asleep") - t, 4)
        if status != 200:
            self.out["error"] = f"/sleep answered HTTP {status}"
            return exitcodes.DIED
        self.out["gpu_mem_mib_asleep"] = memory_used_mib(self.gpus)
        t = self.mark("wake_requested")
        status, _ = post(self.port, "/wake_up", None, timeout=600)
        self.out["wake_http_s"] = round(self.mark("awake") - t, 4)
        if status != 200:
            self.out["error"] = f"/wake_up answered HTTP {status}"
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

    def own_steps(self) -> dict[str, float]:
        """The timer's seconds outside the measured windows (benchmarks/bench_trial_overhead.py):
        from its start to the start command, and from the engine's stop to now (port, GPU memory)."""
        steps = {"before_start_s": round(self.t0 - self.began, 3)} if self.t0 else {}
        stopped = self.out["events"].get("stopped")
        if stopped is not None:
            steps["after_stop_s"] = round(time.time() - self.t0 - stopped, 3)
        return steps


def _recorded_group(pgid_file: Path) -> tuple[int, int | None] | None:
    """(group id, its leader's start time or None in an old one-number file) from ``engine.pgid``."""
    try:
        words = pgid_file.read_text().split()
        return int(words[0]), (int(words[1]) if len(words) > 1 else None)
    except (OSError, IndexError, ValueError):
        return None


def cleanup(workdir: Path, port: int, container: str = "", trial: str | None = None,
            lease_dir: Path | None = None, grace_s: float = 30) -> dict[str, Any]:
    """Stop what a killed timer left behind (the trial's leases, the engine group, the container);
    report the port. ``trial`` defaults to the folder's name, ``lease_dir`` to ``.leases`` beside it."""
    reaped = reap(lease_dir or default_lease_dir(workdir), trial or default_trial(workdir), grace_s)
    stopped = list(reaped["stopped"]) + [f"still running: {what}" for what in reaped["still_running"]]
    recorded = _recorded_group(workdir / "engine.pgid")
    if recorded is not None:
        pgid, start = recorded
        # Only a group whose leader is gone or started when recorded: a reused pid is never signalled.
        leader = start_time(pgid)
        ours = start is not None and (leader is None or leader == start)
        if ours and any(s >= start for _, s in group_members(pgid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            stopped.append(f"process group {pgid}")
    if container and shutil.which("docker"):
        done = subprocess.run(["docker", "rm", "--force", container], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            stopped.append(f"container {container}")
    deadline = time.monotonic() + 30
    while port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"stopped": stopped, "port_free": not port_open(port)}


def _prepare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--launch-json", required=True)
    p.add_argument("--fresh-cache", default="")
    p.add_argument("--empty-cache", action="store_true", help="empty the launch's (persistent) cache folders first")
    p.add_argument("--page-cache", choices=("drop", "warm", "keep"), default="keep")
    p.add_argument("--drop-scope", choices=("auto", "global", "files"), default="global",
                   help="drop: the whole page cache (the node is the campaign's) or only the model's files; "
                        "auto: files for the stand-in, global for a real engine")
    p.add_argument("--engine-kind", default="", help="with --drop-scope auto: the engine's kind (stand-in, vllm)")
    p.add_argument("--model", default="")
    p.add_argument("--engine-python", default="", help="the Python that runs the engine (for its bytecode)")
    p.add_argument("--bytecode-packages", default="", help="comma-separated packages whose .pyc to count")
    before = p.add_argument_group("before the state (each skipped unless given)")
    before.add_argument("--reap-leases", type=Path, default=None,
                        help="first stop what the stale leases in this folder name (an earlier, killed attempt)")
    before.add_argument("--make-model", default="", help="JSON argv that makes --model when it has no config.json")
    before.add_argument("--check", action="store_true",
                        help="check the mode's preconditions (the launch's port and GPUs, and the options below)")
    before.add_argument("--python-module", default="", help="a module the mode needs beside the engine")
    before.add_argument("--exists", nargs="*", default=[], help="paths the mode needs")
    before.add_argument("--docker-image", default="", help="the engine's image (for --python-module)")
    before.add_argument("--vllm-subcommand", default="", help="a vLLM command the mode runs (preload)")
    before.add_argument("--answers-dir", type=Path, default=None,
                        help="keep the vLLM subcommand's answer here (asking imports vLLM: once per install)")


def _prepared(args: argparse.Namespace) -> tuple[dict[str, Any] | None, int]:
    """``prepare``'s work: (what it prints, exit code); None with an error code, the error on stderr."""
    try:
        launch = json.loads(args.launch_json)
        make_model = json.loads(args.make_model) if args.make_model else []
        if not isinstance(launch, dict) or not isinstance(make_model, list):
            raise ValueError("--launch-json must be a JSON object and --make-model a JSON list")
        if args.check:
            int(launch["port"])
    except KeyError:
        print("coldstart prepare: --check needs the port in --launch-json", file=sys.stderr)
        return None, exitcodes.BAD_INPUT
    except ValueError as exc:
        print(f"coldstart prepare: bad JSON argument: {exc}", file=sys.stderr)
        return None, exitcodes.BAD_INPUT
    packages = tuple(name.strip() for name in args.bytecode_packages.split(",") if name.strip())
    checks = Checks(args.engine_python, args.python_module, tuple(args.exists), args.docker_image,
                    args.vllm_subcommand, args.answers_dir) if args.check else None
    try:
        changed, reasons, steps = before_prepare(launch, args.dir, args.reap_leases, args.model, make_model, checks)
        if reasons:  # a skip changes nothing more: the node stays as the last trial left it
            return {"reasons": reasons, "changed": changed, "steps_s": steps}, exitcodes.OK
        more, before = prepare(args.dir, launch, args.fresh_cache, args.page_cache, args.model, args.empty_cache,
                               args.engine_python, packages, drop_scope(args.drop_scope, args.engine_kind))
    except ValueError as exc:
        print(f"coldstart prepare: {exc}", file=sys.stderr)
        return None, exitcodes.BAD_INPUT
    except PrepareError as exc:
        print(f"coldstart prepare: {exc}", file=sys.stderr)
        return None, exitcodes.DIED
    return {"reasons": [], "changed": changed + more, "before_start": before,
            "steps_s": {**steps, **before.get("prepare_steps_s", {})}}, exitcodes.OK


def _main_prepare(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart prepare")
    _prepare_options(p)
    out, rc = _prepared(p.parse_args(argv))
    if out is not None:
        print(json.dumps(out))
    return rc


def _main_trial(argv: list[str]) -> int:
    """``prepare``, then (unless a precondition is unmet) ``measure`` on what it rendered, in one
    program: a task per program costs 0.3-0.7 s on the H200, outside every measured window."""
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart trial")
    _prepare_options(p)
    _measure_options(p)
    args = p.parse_args(argv)
    out, rc = _prepared(args)
    if out is None or out["reasons"]:
        if out is not None:
            print(json.dumps(out))
        return rc
    args.launch, args.log, args.out = args.dir / LAUNCH, args.dir / "server.log", args.dir / "timings.json"
    out["measure_rc"] = rc = _main_measure_args(args)
    print(json.dumps({k: v for k, v in out.items() if k != "before_start"}))  # before_start: in timings.json
    return rc


def _main_cleanup(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart cleanup")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--container", default="")
    p.add_argument("--trial", default=None, help="whose leases to reap (the folder's name)")
    p.add_argument("--lease-dir", type=Path, default=None, help="the lease folder (.leases beside --dir)")
    args = p.parse_args(argv)
    print(json.dumps(cleanup(args.dir, args.port, args.container, args.trial, args.lease_dir)))
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["measure"]:
        return _main_measure(args[1:])
    if args[:1] == ["prepare"]:
        return _main_prepare(args[1:])
    if args[:1] == ["trial"]:
        return _main_trial(args[1:])
    if args[:1] == ["cleanup"]:
        return _main_cleanup(args[1:])
    print("usage: python -m nodetools.coldstart {prepare|measure|trial|cleanup} ... (see --help of each)",
          file=sys.stderr)
    return exitcodes.BAD_INPUT


def add_claim_options(p: argparse.ArgumentParser) -> None:
    """``--trial``, ``--lease-dir`` and ``--lock-dir`` of every tool that starts an engine."""
    p.add_argument("--trial", default="", help="the trial id for the lease and the port lock (the folder's name)")
    p.add_argument("--lease-dir", type=Path, default=None, help="the lease folder (.leases beside the trial folder)")
    p.add_argument("--lock-dir", default=None, help="where the port lock files live ($GPU_CAMPAIGN_LOCK_DIR or /tmp)")


def _measure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--sleep-wake", action="store_true")
    p.add_argument("--residency", nargs="*", default=[], help="files or folders whose page-cache share to record")
    add_claim_options(p)


def _main_measure(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart measure", description=__doc__.splitlines()[0])
    p.add_argument("--launch", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    _measure_options(p)
    return _main_measure_args(p.parse_args(argv))


def _main_measure_args(args: argparse.Namespace) -> int:
    try:
        launch = json.loads(args.launch.read_text())
        launch["argv"], launch["port"], launch["model"]  # presence check: KeyError below
    except (OSError, ValueError, KeyError) as exc:
        print(f"coldstart: bad --launch {args.launch}: {exc}", file=sys.stderr)
        return exitcodes.BAD_INPUT
    workdir = args.log.parent
    try:
        with claim("coldstart measure", args.trial or default_trial(workdir), workdir, [int(launch["port"])],
                   args.lease_dir, args.lock_dir) as held:
            return _measure(launch, args, held)
    except PortBusy as exc:
        print(f"coldstart: {exc}", file=sys.stderr)
        return exitcodes.BUSY


def _measure(launch: dict[str, Any], args: argparse.Namespace, held: Claim) -> int:
    timer = Timer(launch, args.log, args.poll_s, args.timeout_s)
    timer.claim = held
    with contextlib.suppress(OSError, ValueError):
        timer.out["before_start"] = json.loads((args.log.parent / PREPARED).read_text())
    if args.residency:
        timer.out["resident_fraction_before"] = resident_fraction(args.residency)
    interrupt_on_term()  # Ansible's task timeout, or the reaper, must still stop the engine
    rc = exitcodes.BAD_INPUT
    try:
        if launch.get("preload_port"):
            rc = timer.start_preload()
            if rc != exitcodes.OK:
                return rc
        timer.start()
        rc = timer.wait_first_token("first_token")
        if rc == exitcodes.OK:
            timer.out["first_token_s"] = timer.out["events"]["first_token"]
            if args.sleep_wake:
                rc = timer.sleep_wake()
    except KeyboardInterrupt:
        timer.out["error"] = "timer interrupted"
        rc = exitcodes.TIMEOUT
    finally:
        timer.stop()
        if rc == exitcodes.OK and not timer.out.get("port_free_after_stop", True):
            timer.out["error"] = f"port {timer.port} still answers after the engine was stopped"
            rc = exitcodes.BUSY
        timer.out["rc"] = rc
        timer.out["timer_steps_s"] = timer.own_steps()
        write_json_atomic(args.out, timer.out)
    if rc != exitcodes.OK:
        print(f"coldstart: {_failure_line(timer.out)}", file=sys.stderr)
    return rc


def _failure_line(out: dict[str, Any]) -> str:
    events = out["events"]
    if "engine_exited" in events:
        return f"engine exited with rc {out.get('engine_rc')} {events['engine_exited']:.1f} s after its start, " \
               "before its first token (see server.log)"
    if "timed_out" in events:
        return f"no first token within {events['timed_out']:.0f} s"
    return str(out.get("error") or "failed")


if __name__ == "__main__":
    raise SystemExit(main())
