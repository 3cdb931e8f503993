"""The node-side cold-start timer: start an engine, time it to the first real token, stop it.

    python -m nodetools.coldstart measure --launch launch.json --log server.log --out timings.json
        [--poll-s 0.05] [--timeout-s 1800] [--sleep-wake] [--residency PATH ...]
        [--trial ID] [--lease-dir DIR] [--lock-dir DIR] [--window-marker FILE]
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
playbook's cleanup runs only when a timer did not finish cleanly. With ``--window-marker`` a file
says, just before the stop, that the measured windows are over (holding ``$GPU_CAMPAIGN_LEASE``,
the runner's lease of the run): the runner starts the host's next trial's Ansible run then.
After the stop it records what a trial changes on the node (``gpu_mem_mib_after_stop``;
``node_after_stop``: host memory, page cache, ``/dev/shm`` offload buffers,
:mod:`nodetools.node_state`). The engine's start, wait and stop are :class:`nodetools.timer.Timer`'s;
this module is the command line. Stdlib only: this runs on the node.

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
``engine.pgid`` once its start time proves it is the engine's, the container:
:mod:`nodetools.engine_cleanup`) and prints JSON ``{"stopped": [...], "port_free": bool}``.

Exit codes (nodetools.exitcodes): 0 measured (prepared); 2 bad input; 3 the engine exited before
its first token (prepare: a leftover outlived SIGKILL, or the model could not be made); 4 timed out
or stopped by SIGTERM; 7 the port is locked by another run, already answers, or still answers after
the engine was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.engine_cleanup import cleanup
from nodetools.lease import Claim, PortBusy, add_claim_options, claim, default_trial
from nodetools.proc import interrupt_on_term, write_json_atomic
from nodetools.residency import resident_fraction
from nodetools.secret_env import SecretsError, take_secrets
from nodetools.startprep import LAUNCH, PREPARED, Checks, PrepareError, before_prepare, drop_scope, prepare
from nodetools.timer import Timer

__all__ = ["RUNNER_LEASE_ENV", "main"]

# runner/supervise.py's LEASE_VARIABLE: set on every process of a phase on a local connection.
RUNNER_LEASE_ENV = "GPU_CAMPAIGN_LEASE"


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
    p.add_argument("--compile-bytecode", action="store_true",
                   help="compile what the engine imports into its PYTHONPYCACHEPREFIX first (once: nodetools.pycache)")
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
                        help="keep what is asked once per install here: the vLLM subcommand's answer (asking "
                             "imports vLLM), where the engine's packages are and which modules to read")


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
                               args.engine_python, packages, drop_scope(args.drop_scope, args.engine_kind),
                               args.compile_bytecode, args.answers_dir)
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
    secrets = _secrets(args.dir, args.launch_json)  # first: the prepare empties the folder
    if secrets is None:
        return exitcodes.BAD_INPUT
    out, rc = _prepared(args)
    if out is None or out["reasons"]:
        if out is not None:
            print(json.dumps(out))
        return rc
    args.launch, args.log, args.out = args.dir / LAUNCH, args.dir / "server.log", args.dir / "timings.json"
    out["measure_rc"] = rc = _main_measure_args(args, secrets)
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


def _measure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--sleep-wake", action="store_true")
    p.add_argument("--residency", nargs="*", default=[], help="files or folders whose page-cache share to record")
    p.add_argument("--window-marker", type=Path, default=None,
                   help="write this file when the measured windows are over, before the engine's stop")
    add_claim_options(p)


def _main_measure(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.coldstart measure", description=__doc__.splitlines()[0])
    p.add_argument("--launch", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    _measure_options(p)
    return _main_measure_args(p.parse_args(argv))


def _secrets(workdir: Path, launch_json: str) -> dict[str, str] | None:
    """The engine's secrets the launch names, taken from the trial's folder (nodetools.secret_env);
    None, the reason on stderr, when they cannot be."""
    launch: Any = None
    with contextlib.suppress(ValueError):
        launch = json.loads(launch_json)
    try:
        return take_secrets(workdir, launch.get("secret_env") or [] if isinstance(launch, dict) else [])
    except SecretsError as exc:
        print(f"coldstart: {exc}", file=sys.stderr)
        return None


def _main_measure_args(args: argparse.Namespace, secrets: dict[str, str] | None = None) -> int:
    try:
        text = args.launch.read_text()
        launch = json.loads(text)
        launch["argv"], launch["port"], launch["model"]  # presence check: KeyError below
    except (OSError, ValueError, KeyError) as exc:
        print(f"coldstart: bad --launch {args.launch}: {exc}", file=sys.stderr)
        return exitcodes.BAD_INPUT
    workdir = args.log.parent
    secrets = _secrets(workdir, text) if secrets is None else secrets
    if secrets is None:
        return exitcodes.BAD_INPUT
    try:
        with claim("coldstart measure", args.trial or default_trial(workdir), workdir, [int(launch["port"])],
                   args.lease_dir, args.lock_dir) as held:
            return _measure(launch, args, held, secrets)
    except PortBusy as exc:
        print(f"coldstart: {exc}", file=sys.stderr)
        return exitcodes.BUSY


def _measure(launch: dict[str, Any], args: argparse.Namespace, held: Claim, secrets: dict[str, str]) -> int:
    timer = Timer(launch, args.log, args.poll_s, args.timeout_s)
    timer.claim, timer.secrets = held, secrets
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
        if args.window_marker is not None:
            _mark_window_over(args.window_marker)
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


def _mark_window_over(path: Path) -> None:
    """Say the measurement is over (the runner starts the host's next trial's Ansible run then:
    runner/overlap.py), with the runner's lease of this run, so a marker it did not ask for (an
    earlier run's, a remote node's folder that happens to exist on the controller) is not taken."""
    with contextlib.suppress(OSError):  # the marker only starts the next run sooner: never fail the trial
        write_json_atomic(path, {"lease": os.environ.get(RUNNER_LEASE_ENV, ""), "at": time.time()})


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
