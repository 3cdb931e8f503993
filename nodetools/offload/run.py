"""Run one offload trial on the node: engines up, ``/metrics``, the load, ``/metrics``, quality, stop.

``run_trial`` takes every copy's port lock and writes its lease (``nodetools.lease``, as the
cold-start timer does), starts every engine copy with ``nodetools.coldstart``'s ``Timer`` (own
process group, ``engine.pgid``, the group in the lease), waits for each to answer, snapshots
``/metrics``, drives the multi-turn load (``nodetools.loadgen``) while watching the engines,
snapshots ``/metrics`` again, runs the quality check, and stops every copy; ``run.json`` says what
happened. Copy 0 logs to ``WORKDIR/server.log``, copy i to ``WORKDIR/copy<i>/server.log``. The
secrets the copies' launches name (``secret_env``) are taken first from ``WORKDIR/secrets.json``,
which is removed (:mod:`nodetools.secret_env`), and go into the engines' environments only.

Exit codes (nodetools.exitcodes): 0 ok; 2 bad input; 3 an engine exited (before it answered, or
during the run); 4 not ready in time, the load stopped at its wall-time cap, or stopped by
SIGTERM; 6 more failed requests than allowed; 7 an engine port is locked by another run or
already answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.lease import Claim, PortBusy, claim, default_trial
from nodetools.loadgen.multiturn import MultiTurnLoad
from nodetools.loadgen.quality import QualityCheck
from nodetools.loadgen.workload import QualitySpec, Workload, known_fields
from nodetools.model_shapes import engine_model_dir, read_kv_bytes_per_token
from nodetools.offload.layout import copy_dir
from nodetools.offload.lmcache_gate import first_fallback, refusal
from nodetools.proc import group_io, interrupt_on_term, write_json_atomic
from nodetools.secret_env import SecretsError, secret_names, take_secrets
from nodetools.timer import Timer

__all__ = ["RunOptions", "quality_spec", "ready_timeout", "run_trial"]


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


@dataclass(frozen=True)
class RunOptions:
    """The command line of ``offload_run run``."""

    launch: Path
    workdir: Path
    load: str  # JSON: the Workload (a mode's params carry more keys)
    quality: str = ""  # JSON: the quality parameters; empty or "enabled": false: no check
    max_failed: int = 0
    timeout_s: float = 1800.0  # per engine copy, to its first answer
    phase_timeout_s: float = 0.0  # the runner's limit on the whole phase: the wait for a copy stays inside it
    poll_s: float = 0.2
    trial: str = ""
    lease_dir: Path | None = None
    lock_dir: str | None = None  # where the port lock files live (nodetools.lease)


def ready_timeout(timeout_s: float, phase_timeout_s: float) -> float:
    """The wait for each copy's first answer: the mode's, but inside the phase's limit with 30 s
    left to stop the engines and write run.json (10 s at least)."""
    if phase_timeout_s <= 0:
        return timeout_s
    return min(timeout_s, max(phase_timeout_s - 30, 10))


def quality_spec(text: str) -> QualitySpec | None:
    """The quality check from its JSON, or None when there is none (empty, or ``enabled: false``)."""
    if not text:
        return None
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"--quality must be a JSON object, got {text[:80]!r}")
    if data.get("enabled") is False:
        return None
    return QualitySpec(**known_fields(QualitySpec, data))


def _metrics(port: int, path: Path) -> str | None:
    """Scrape ``/metrics`` to ``path``; the error in words when it cannot."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            path.write_bytes(resp.read())
    except OSError as exc:
        return f"/metrics on port {port}: {exc}"
    return None


@dataclass
class _Run:
    launch: dict[str, Any]
    workdir: Path
    poll_s: float
    timeout_s: float
    timers: list[Timer] = field(default_factory=list)
    out: dict[str, Any] = field(default_factory=lambda: {"copies": [], "errors": []})
    died: str | None = None
    claim: Claim | None = None  # the port locks and the lease every copy's group goes into
    secrets: dict[str, str] = field(default_factory=dict)  # what the copies' secret_env names (secret_env)

    def start(self) -> int:
        for i, spec in enumerate(self.launch["copies"]):
            log_dir = copy_dir(self.workdir, i)
            log_dir.mkdir(parents=True, exist_ok=True)
            timer = Timer(spec, log_dir / "server.log", self.poll_s, self.timeout_s)
            timer.claim, timer.secrets = self.claim, self.secrets
            self.timers.append(timer)
            timer.start()  # all copies start together, as a node's replicas would
        for i, timer in enumerate(self.timers):
            rc = timer.wait_first_token("ready")
            if rc != exitcodes.OK:
                what = "exited" if rc == exitcodes.DIED else f"did not answer within {self.timeout_s:.0f} s"
                self.out["error"] = f"engine copy {i} {what} before it answered (see its server.log)"
                if rc == exitcodes.DIED:
                    self.died = self.out["error"]
                return rc
        self.out["ready_s"] = max(t.out["events"]["ready"] for t in self.timers)
        return exitcodes.OK

    def snapshot(self, name: str) -> None:
        for i, timer in enumerate(self.timers):
            error = _metrics(timer.port, copy_dir(self.workdir, i) / f"metrics_{name}.txt")
            if error:
                self.out["errors"].append(error)

    def file_io(self) -> list[dict[str, Any]]:
        """Each copy's engine group's file I/O so far (nodetools.proc.group_io); none for a
        container, whose engine runs outside the group (the docker client's)."""
        return [group_io(t.proc.pid) if t.proc is not None and not t.launch.get("container") else {}
                for t in self.timers]

    def dead(self) -> str | None:
        for i, timer in enumerate(self.timers):
            if timer.proc is not None and timer.proc.poll() is not None:
                rc = timer.proc.returncode
                how = f"killed by signal {-rc}" if rc < 0 else f"rc {rc}"
                return f"engine copy {i} exited ({how})"
        return None

    async def load(self, workload: Workload, model: str) -> dict[str, Any]:
        urls = [f"http://127.0.0.1:{t.port}" for t in self.timers]
        load = MultiTurnLoad(workload, urls, model, self.workdir / "requests.jsonl")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        reasons: list[str] = []

        def on_term() -> None:
            reasons.append("the runner stopped the trial (SIGTERM)")
            stop.set()

        async def watch() -> None:
            while not stop.is_set():
                died = self.dead()
                if died:
                    self.died = died
                    reasons.append(died)
                    stop.set()
                await asyncio.sleep(0.2)

        loop.add_signal_handler(signal.SIGTERM, on_term)
        watcher = asyncio.create_task(watch())
        try:
            return await load.run(stop, lambda: reasons[0] if reasons else "stopped")
        finally:
            watcher.cancel()
            loop.remove_signal_handler(signal.SIGTERM)

    def stop(self) -> None:
        for timer in self.timers:
            timer.stop()
        self.out["copies"] = [t.out for t in self.timers]


def run_trial(opts: RunOptions) -> int:
    try:
        launch = json.loads(opts.launch.read_text())
        if not launch.get("copies"):
            raise KeyError("copies")
        workload = Workload(**known_fields(Workload, json.loads(opts.load)))
        quality = quality_spec(opts.quality)
        ports = [int(spec["port"]) for spec in launch["copies"]]
        secrets = take_secrets(opts.workdir, secret_names(launch["copies"]))
    except SecretsError as exc:
        _err(f"offload_run: {exc}")
        return exitcodes.BAD_INPUT
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _err(f"offload_run: bad input: {exc}")
        return exitcodes.BAD_INPUT
    timeout_s = ready_timeout(opts.timeout_s, opts.phase_timeout_s)
    try:
        with claim("offload_run run", opts.trial or default_trial(opts.workdir), opts.workdir, ports, opts.lease_dir,
                   opts.lock_dir) as held:
            run = _Run(launch, opts.workdir, opts.poll_s, timeout_s, claim=held, secrets=secrets)
            return _run_claimed(run, opts, workload, quality)
    except PortBusy as exc:
        _err(f"offload_run: {exc}")
        return exitcodes.BUSY


def _run_claimed(run: _Run, opts: RunOptions, workload: Workload, quality: QualitySpec | None) -> int:
    interrupt_on_term()  # a phase timeout, or the reaper, must still stop the engines
    rc = exitcodes.BAD_INPUT
    try:
        rc = run.start()
        if rc == exitcodes.OK:
            rc = _gate(run) or _measure(run, opts, workload, quality)
    except KeyboardInterrupt:
        run.out["error"] = "interrupted (SIGTERM)"
        rc = exitcodes.TIMEOUT
    finally:
        run.stop()
        run.out["rc"] = rc
        run.out["engine_died"] = run.died
        write_json_atomic(opts.workdir / "run.json", run.out)
    if rc != exitcodes.OK:
        _err(f"offload_run: {run.out.get('error') or 'failed'}")
    return rc


def _measure(run: _Run, opts: RunOptions, workload: Workload, quality: QualitySpec | None) -> int:
    model = str(run.launch["copies"][0]["model"])  # the served name, which requests carry
    # The folder from the command line, not the served name (the H200's 32B run
    # read "rehearsal/config.json", found none, and could not size its host tier in tokens).
    argv = list(run.launch["copies"][0].get("argv") or [])
    model_dir = engine_model_dir(argv)
    run.out["kv_bytes_per_token"] = read_kv_bytes_per_token(model_dir, argv) if model_dir else None
    run.snapshot("before")
    # Where the load starts and ends in each server log: the report reads the log's last stats
    # line *of the load*, not one that also counts the quality check's requests.
    logs = [t.log for t in run.timers]
    run.out["log_offsets"] = [{"load_start": _size(log)} for log in logs]
    io_before = run.file_io()  # a tier on disk is read by the engine's processes: the deltas say how much
    summary = asyncio.run(run.load(workload, model))
    run.out["file_io"] = [{"before": b, "after": a} for b, a in zip(io_before, run.file_io())]  # noqa: B905
    interval = float((run.launch["copies"][0].get("env") or {}).get("VLLM_LOG_STATS_INTERVAL") or 10)
    for offsets, log in zip(run.out["log_offsets"], logs):  # noqa: B905 (one per log; Python 3.8 has no strict)
        offsets["load_end"] = _next_stats_line(log, _size(log), interval + 2)
    interrupt_on_term()  # the loop's handler is gone: ours again
    run.out["load"] = summary
    if run.died is None:
        run.died = run.dead()
    if run.died is None:
        run.snapshot("after")
    counts = summary["counts"]
    failed = counts["failed"] + counts["not_sent"]
    if quality is not None and run.died is None:
        check = QualityCheck(quality, f"http://127.0.0.1:{run.timers[0].port}", model,
                             opts.workdir / "quality.jsonl", engine_kind=str(run.launch.get("engine_kind") or ""))
        run.out["quality"] = asyncio.run(check.run())
    planned = workload.sessions * workload.turns
    if run.died is not None:
        turn = summary.get("first_failed_turn")
        run.out["error"] = (f"{run.died} during {'the load' if turn is None else f'turn {turn} of the load'} "
                            f"({counts['ok']} ok, {counts['failed']} failed, {counts['not_sent']} not sent of "
                            f"{planned} requests)")
        return exitcodes.DIED
    if summary["stopped"]:
        run.out["error"] = f"load stopped: {summary['stopped']}"
        return exitcodes.TIMEOUT
    if _gate(run):  # an LMCache that binds its extension lazily says so only at its first copy
        return exitcodes.REFUSED
    if failed > opts.max_failed:
        run.out["error"] = (f"{failed} of {planned} requests failed or were not sent (allowed: {opts.max_failed}); "
                            "see requests.jsonl")
        return exitcodes.FAILED_REQUESTS
    return exitcodes.OK


def _gate(run: _Run) -> int:
    """REFUSED (the reason in run.json) when the launch refuses LMCache's torch-ops fallback and a
    copy's log shows it: the load would measure LMCache's packaging, not LMCache."""
    if not run.launch.get("refuse_torch_ops"):
        return exitcodes.OK
    line = first_fallback(t.log for t in run.timers)
    if line is None:
        return exitcodes.OK
    run.out["error"] = refusal(line)
    return exitcodes.REFUSED


def _next_stats_line(log: Path, offset: int, timeout_s: float) -> int:
    """Where the first stats line written after ``offset`` ends (the one covering the load's last
    seconds), waiting for it up to ``timeout_s``; ``offset`` itself when none comes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), log.open("rb") as fh:
            fh.seek(offset)
            tail = fh.read()
            at = tail.find(b"Prefix cache hit rate")
            end = tail.find(b"\n", at)
            if at >= 0 and end >= 0:
                return offset + end + 1
        time.sleep(0.1)
    return offset


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
