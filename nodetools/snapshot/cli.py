"""``python -m nodetools.snapshot gates|measure``: the command lines the snapshot playbooks run.

``gates`` prints ``{"reasons": [...], "facts": {...}}`` (``gates.py``). ``measure`` takes the
engine port's lock and writes its lease as the cold-start timer does (``nodetools.lease``), takes
the node's snapshot lock (``lock.py``), runs the mode, always stops what it started, and writes
``--out`` (timings.json) whatever happened. Exit codes (nodetools.exitcodes): 0 measured; 2 bad
input; 3 a tool or the engine failed (see ``error`` and the tool logs); 4 stopped by SIGTERM;
7 the port is locked by another run or already answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nodetools import exitcodes
from nodetools.gpu import gpu_list
from nodetools.lease import PortBusy, add_claim_options, claim, default_trial
from nodetools.proc import interrupt_on_term, write_json_atomic
from nodetools.secret_env import SecretsError, take_secrets
from nodetools.snapshot.criu_mode import CriuRun
from nodetools.snapshot.criu_node import DEFAULT_FLAGS, NETWORK_LOCKS
from nodetools.snapshot.cuda_checkpoint_mode import CudaCheckpointRun
from nodetools.snapshot.engine_run import EngineRun
from nodetools.snapshot.gates import gates
from nodetools.snapshot.images import CACHE_STATES
from nodetools.snapshot.kernel_memory import THP_CHOICES
from nodetools.snapshot.lock import NodeLock
from nodetools.snapshot.quiesce import LEVELS
from nodetools.snapshot.vllm_snapshot_mode import VllmSnapshotRun

__all__ = ["main"]

MODES: dict[str, type[EngineRun]] = {"criu": CriuRun, "cuda_checkpoint": CudaCheckpointRun,
                                     "vllm_snapshot": VllmSnapshotRun}


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r}")
    return value


def _cache_states(text: str) -> list[str]:
    states = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in states if s not in CACHE_STATES]
    if bad or not states or len(set(states)) != len(states):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of distinct {'/'.join(CACHE_STATES)}")
    return states


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", required=True, choices=tuple(MODES))
    p.add_argument("--criu", default="criu")
    p.add_argument("--libdir", default="")
    p.add_argument("--cuda-checkpoint", default="cuda-checkpoint")
    p.add_argument("--revision", default="")
    p.add_argument("--network-lock", default="auto", choices=NETWORK_LOCKS)
    p.add_argument("--criu-flags", type=_json_list, default=list(DEFAULT_FLAGS),
                   help=f"JSON list of dump and restore flags (default {json.dumps(list(DEFAULT_FLAGS))})")
    p.add_argument("--lazy-pages", action="store_true", help="criu: restore with criu lazy-pages (userfaultfd)")
    p.add_argument("--keep-io-uring", dest="disable_io_uring", action="store_false",
                   help="criu: leave kernel.io_uring_disabled as it is (the dump then fails on an io_uring)")
    p.add_argument("--quiesce", default="none", choices=tuple(LEVELS),
                   help="criu, cuda_checkpoint: put the engine to sleep before the snapshot (level 1 or 2), wake it "
                        "after the restore")
    p.add_argument("--stage-dir", type=Path, default=None,
                   help="criu: copy the images into this folder in RAM before each restore, and restore from it")
    p.add_argument("--thp", default="leave", choices=THP_CHOICES,
                   help="criu: transparent huge pages (anonymous and shared memory) for the restores, put back "
                        "afterwards; leave: as the node has them")


def _main_gates(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.snapshot gates")
    _common(p)
    p.add_argument("--gpus", default="")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--model", default="")
    p.add_argument("--images", type=Path, default=None, help="criu: the images folder (its filesystem and space)")
    p.add_argument("--launch-json", default="", help="vllm_snapshot: the engine's launch (its vLLM command, env)")
    p.add_argument("--gpu-memory-fraction", type=float, default=1.0,
                   help="share of each GPU's memory the engine takes (vLLM's --gpu-memory-utilization)")
    a = p.parse_args(argv)
    try:
        gpus = gpu_list(a.gpus, "snapshot gates")
    except ValueError as exc:
        sys.stderr.write(f"{exc}\n")
        return exitcodes.BAD_INPUT
    try:
        launch = json.loads(a.launch_json) if a.launch_json else None
    except ValueError as exc:
        sys.stderr.write(f"snapshot gates: --launch-json is not JSON: {exc}\n")
        return exitcodes.BAD_INPUT
    reasons, facts = gates(a.mode, criu=a.criu, libdir=a.libdir, cuda_checkpoint=a.cuda_checkpoint, gpus=gpus,
                           tp=a.tp, model=a.model, revision=a.revision, launch=launch,
                           gpu_memory_fraction=a.gpu_memory_fraction, network_lock=a.network_lock,
                           criu_flags=a.criu_flags, images_dir=a.images, lazy_pages=a.lazy_pages,
                           disable_io_uring=a.disable_io_uring, quiesce=a.quiesce, stage_dir=a.stage_dir)
    sys.stdout.write(json.dumps({"reasons": reasons, "facts": facts}) + "\n")
    return exitcodes.OK


def _main_measure(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m nodetools.snapshot measure")
    _common(p)
    p.add_argument("--launch", type=Path, required=True)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--restore-cache", type=_cache_states, default=["dropped"],
                   help="criu: one restore per page-cache state of the image, in this order (dropped,warm)")
    p.add_argument("--answers", type=int, default=3, help="timed answers before the dump and after each restore")
    p.add_argument("--keep-images", action="store_true", help="criu: leave the images in --images afterwards")
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--timeout-s", type=float, default=1800)
    add_claim_options(p)
    args = p.parse_args(argv)
    try:
        launch = json.loads(args.launch.read_text())
        run = MODES[args.mode](args, launch)  # reads the port and the model: KeyError when missing
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"snapshot: bad --launch {args.launch}: {exc}\n")
        return exitcodes.BAD_INPUT
    workdir = args.log.parent
    try:
        run.timer.secrets = take_secrets(workdir, launch.get("secret_env") or [])
    except SecretsError as exc:
        sys.stderr.write(f"snapshot: {exc}\n")
        return exitcodes.BAD_INPUT
    try:
        with claim(f"snapshot measure {args.mode}", args.trial or default_trial(workdir), workdir, [run.timer.port],
                   args.lease_dir, args.lock_dir) as held:
            run.timer.claim = held
            run.timer.inherit_lock = args.mode != "criu"  # CRIU refuses to dump a process holding a file lock
            return _measure(run, args)
    except PortBusy as exc:
        sys.stderr.write(f"snapshot: {exc}\n")
        return exitcodes.BUSY


def _measure(run: EngineRun, args: argparse.Namespace) -> int:
    interrupt_on_term()  # Ansible's task timeout, or the reaper, must still stop the engine
    rc = exitcodes.BAD_INPUT
    try:
        with NodeLock(args.timeout_s):
            rc = run.measure()
    except TimeoutError as exc:
        run.out["error"] = str(exc)
        rc = exitcodes.DIED
    except KeyboardInterrupt:
        run.out["error"] = "interrupted (SIGTERM)"
        rc = exitcodes.TIMEOUT
    finally:
        _stop(run)
        run.out["rc"] = rc
        write_json_atomic(args.out, run.out)
    if rc != exitcodes.OK:
        sys.stderr.write(f"snapshot: {run.out.get('error', 'failed')}\n")
    return rc


def _stop(run: EngineRun) -> None:
    """Stop what the mode started; a second SIGTERM while stopping must not skip the rest."""
    try:
        run.stop()
    except KeyboardInterrupt:
        run.stop()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["gates"]:
        return _main_gates(args[1:])
    if args[:1] == ["measure"]:
        return _main_measure(args[1:])
    sys.stderr.write("usage: python -m nodetools.snapshot {gates|measure} ... (see --help of each)\n")
    return exitcodes.BAD_INPUT
