"""The node-side cold-start timer: start an engine, time it to the first real token, stop it.

    python -m nodetools.coldstart measure --launch launch.json --log server.log --out timings.json
        [--poll-s 0.05] [--timeout-s 1800] [--sleep-wake] [--residency PATH ...]
    python -m nodetools.coldstart prepare --dir WORKDIR --launch-json JSON [--fresh-cache DIR]
        [--page-cache drop|warm|keep] [--model PATH]
    python -m nodetools.coldstart cleanup --dir WORKDIR --port N [--container NAME]

``launch.json`` holds ``argv``, ``env``, ``stop_argv``, ``port`` and ``model`` (what the playbook
rendered with the ``engine_launch`` filter). The engine runs in its own process group with its
output in ``--log``; its group id goes to ``engine.pgid`` beside the log so a cleanup can stop it
even if this timer is killed. Wall time runs from the start command to the first completion
token, polling a one-token completion every ``--poll-s`` seconds (the seed polled every 0.2 s).
With ``--sleep-wake`` the started engine is put to sleep (level 1) and woken, and the time to wake
and to the first token after wake are recorded. The engine is always stopped (the whole group),
and the port checked free. Stdlib only: this runs on the node.

``prepare`` puts the node in the mode's state in one step (an emptied trial folder and fresh cache,
the cache folders, ``launch.json``, then the page cache dropped or the weights read) and prints
JSON ``{"changed": [...]}``. ``cleanup`` stops what a killed timer may have left (the group in
``engine.pgid``, the container) and prints JSON ``{"stopped": [...], "port_free": bool}``.

Exit codes: 0 measured; 3 the engine exited before its first token; 4 timed out; 5 bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nodetools.pagecache import drop, resident_fraction, warm

__all__ = ["cleanup", "main", "write_json_atomic"]

EXIT_OK, EXIT_DIED, EXIT_TIMEOUT, EXIT_BAD_INPUT = 0, 3, 4, 5


def _post(port: int, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _first_token(port: int, model: str, timeout: float) -> bool:
    """One tiny completion; True when it returned a real token."""
    try:
        status, body = _post(port, "/v1/completions", {"model": model, "prompt": "Hello", "max_tokens": 1,
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


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def _gpu_memory_mib(gpus: list[int]) -> list[int] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    argv = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        return None
    used = {}
    for line in done.stdout.splitlines():
        index, _, mib = line.partition(",")
        with contextlib.suppress(ValueError):
            used[int(index)] = int(mib)
    return [used[g] for g in gpus if g in used] if gpus else list(used.values())


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """TERM the process group, KILL it after ``grace_s``, and KILL stragglers that outlived the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class Timer:
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
        self.t0 = 0.0
        self.out: dict[str, Any] = {"poll_s": poll_s, "events": {}}

    def mark(self, event: str) -> float:
        t = time.time() - self.t0
        self.out["events"][event] = round(t, 4)
        return t

    def _spawn(self, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, **{k: str(v) for k, v in (self.launch.get("env") or {}).items()}}
        with log_path.open("ab") as log:
            return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def start_preload(self) -> int:
        """``vllm preload``: the weights daemon must be ready before the engine's clock starts."""
        self.pre = self._spawn(self.launch["pre_argv"], self.log.parent / "preload.log")
        (self.log.parent / "preload.pgid").write_text(f"{self.pre.pid}\n")
        started, port = time.time(), int(self.launch["pre_ready_port"])
        while time.time() - started < self.timeout_s:
            if self.pre.poll() is not None:
                self.out["error"] = f"vllm preload exited with rc {self.pre.returncode} (see preload.log)"
                return EXIT_DIED
            if _port_open(port):
                self.out["preload_ready_s"] = round(time.time() - started, 3)
                return EXIT_OK
            time.sleep(self.poll_s)
        self.out["error"] = f"vllm preload not ready within {self.timeout_s:.0f} s"
        return EXIT_TIMEOUT

    def start(self) -> None:
        self.t0 = time.time()
        self.out["started_at"] = self.t0
        self.proc = self._spawn(self.launch["argv"], self.log)
        (self.log.parent / "engine.pgid").write_text(f"{self.proc.pid}\n")

    def wait_first_token(self, event: str) -> int:
        """Poll until a real token; returns an exit code."""
        assert self.proc is not None
        deadline = self.t0 + self.timeout_s
        while time.time() < deadline:
            tick = time.monotonic()
            if self.proc.poll() is not None:
                self.out["engine_rc"] = self.proc.returncode
                self.mark("engine_exited")
                return EXIT_DIED
            if "port_open" not in self.out["events"] and _port_open(self.port):
                self.mark("port_open")
            if "port_open" in self.out["events"] and _first_token(self.port, self.model, timeout=30):
                self.mark(event)
                return EXIT_OK
            time.sleep(max(0.0, self.poll_s - (time.monotonic() - tick)))
        self.mark("timed_out")
        return EXIT_TIMEOUT

    def sleep_wake(self) -> int:
        self.out["gpu_mem_mib_awake"] = _gpu_memory_mib(self.gpus)
        t = self.mark("sleep_requested")
        status, _ = _post(self.port, "/sleep?level=1", None, timeout=600)
        self.out["sleep_http_s"] = round(self.mark("asleep") - t, 4)
        if status != 200:
            self.out["error"] = f"/sleep answered HTTP {status}"
            return EXIT_DIED
        self.out["gpu_mem_mib_asleep"] = _gpu_memory_mib(self.gpus)
        t = self.mark("wake_requested")
        status, _ = _post(self.port, "/wake_up", None, timeout=600)
        self.out["wake_http_s"] = round(self.mark("awake") - t, 4)
        if status != 200:
            self.out["error"] = f"/wake_up answered HTTP {status}"
            return EXIT_DIED
        deadline = time.time() + 120
        while time.time() < deadline:
            if _first_token(self.port, self.model, timeout=30):
                self.out["wake_to_first_token_s"] = round(self.mark("first_token_after_wake") - t, 4)
                self.out["gpu_mem_mib_after_wake"] = _gpu_memory_mib(self.gpus)
                return EXIT_OK
            time.sleep(self.poll_s)
        self.out["error"] = "no token within 120 s after wake"
        return EXIT_TIMEOUT

    def stop(self) -> None:
        """Stop the whole engine group (a lone API process can leave its EngineCore on the GPU)."""
        if self.proc is None and self.pre is None:
            return
        self.mark("stop_requested")
        if self.launch.get("stop_argv"):
            subprocess.run(self.launch["stop_argv"], check=False, capture_output=True, timeout=120)
        for proc, grace in ((self.proc, 60), (self.pre, 30)):
            if proc is not None:
                _stop_group(proc, grace)
        self.mark("stopped")
        deadline = time.monotonic() + 30
        while _port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.out["port_free_after_stop"] = not _port_open(self.port)
        self.out["gpu_mem_mib_after_stop"] = _gpu_memory_mib(self.gpus)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup(workdir: Path, port: int, container: str = "") -> dict[str, Any]:
    """Stop an engine group or container left behind by a killed timer; report the port."""
    stopped = []
    pgid_file = workdir / "engine.pgid"
    if pgid_file.is_file():
        pgid = int(pgid_file.read_text().split()[0])
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            stopped.append(f"process group {pgid}")
    if container and shutil.which("docker"):
        done = subprocess.run(["docker", "rm", "--force", container], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            stopped.append(f"container {container}")
    deadline = time.monotonic() + 30
    while _port_open(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"stopped": stopped, "port_free": not _port_open(port)}


def prepare(workdir: Path, launch: dict[str, Any], fresh_cache: str, page_cache: str, model: str) -> list[str]:
    changed = []
    if workdir.exists():  # an earlier attempt's log must not mix into this one's
        shutil.rmtree(workdir)
        changed.append(f"emptied {workdir}")
    workdir.mkdir(parents=True)
    if fresh_cache and Path(fresh_cache).exists():
        shutil.rmtree(fresh_cache)
        changed.append(f"emptied {fresh_cache}")
    for cache in (launch.get("caches") or {}).values():
        Path(cache).mkdir(parents=True, exist_ok=True)
    (workdir / "launch.json").write_text(json.dumps(launch, indent=2, sort_keys=True) + "\n")
    changed.append("wrote launch.json")
    if page_cache == "drop":
        drop()
        changed.append("dropped the page cache")
    elif page_cache == "warm":
        changed.append(f"read {warm([model])} bytes of {model} into the page cache")
    return changed


def _main_prepare(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart prepare")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--launch-json", required=True)
    p.add_argument("--fresh-cache", default="")
    p.add_argument("--page-cache", choices=("drop", "warm", "keep"), default="keep")
    p.add_argument("--model", default="")
    args = p.parse_args(argv)
    try:
        launch = json.loads(args.launch_json)
    except ValueError as exc:
        print(f"coldstart prepare: --launch-json is not JSON: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps({"changed": prepare(args.dir, launch, args.fresh_cache, args.page_cache, args.model)}))
    return 0


def _main_cleanup(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart cleanup")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--container", default="")
    args = p.parse_args(argv)
    print(json.dumps(cleanup(args.dir, args.port, args.container)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["measure"]:
        return _main_measure(args[1:])
    if args[:1] == ["prepare"]:
        return _main_prepare(args[1:])
    if args[:1] == ["cleanup"]:
        return _main_cleanup(args[1:])
    print("usage: python -m nodetools.coldstart {prepare|measure|cleanup} ... (see --help of each)", file=sys.stderr)
    return EXIT_BAD_INPUT


def _main_measure(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart measure", description=__doc__.splitlines()[0])
    p.add_argument("--launch", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--sleep-wake", action="store_true")
    p.add_argument("--residency", nargs="*", default=[], help="files or folders whose page-cache share to record")
    args = p.parse_args(argv)
    try:
        launch = json.loads(args.launch.read_text())
        launch["argv"], launch["port"], launch["model"]  # presence check: KeyError below
    except (OSError, ValueError, KeyError) as exc:
        print(f"coldstart: bad --launch {args.launch}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if _port_open(int(launch["port"])):
        print(f"coldstart: port {launch['port']} already answers: another server is running", file=sys.stderr)
        return EXIT_BAD_INPUT
    timer = Timer(launch, args.log, args.poll_s, args.timeout_s)
    if args.residency:
        timer.out["resident_fraction_before"] = resident_fraction(args.residency)
    signal.signal(signal.SIGTERM, _term_as_interrupt)  # Ansible's task timeout must still stop the engine
    rc = EXIT_BAD_INPUT
    try:
        if launch.get("pre_argv"):
            rc = timer.start_preload()
            if rc != EXIT_OK:
                return rc
        timer.start()
        rc = timer.wait_first_token("first_token")
        if rc == EXIT_OK:
            timer.out["first_token_s"] = timer.out["events"]["first_token"]
            if args.sleep_wake:
                rc = timer.sleep_wake()
    except KeyboardInterrupt:
        timer.out["error"] = "timer interrupted"
        rc = EXIT_TIMEOUT
    finally:
        timer.stop()
        timer.out["rc"] = rc
        write_json_atomic(args.out, timer.out)
    if rc != EXIT_OK:
        print(f"coldstart: {_failure_line(timer.out)}", file=sys.stderr)
    return rc


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write then rename: a killed timer never leaves a torn result for the collect phase."""
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


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
