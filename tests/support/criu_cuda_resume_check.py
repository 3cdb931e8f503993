#!/usr/bin/env python3
"""Exercise CRIU's CUDA plugin resume path without a GPU: cuda-overlapped-resume.patch's, or upstream's.

    criu_cuda_resume_check.py CRIU PLUGIN_DIR WORKDIR

Dumps and restores a tree of 3 Python processes, each with a thread named ``cudarst`` that stands in
for the CUDA restore thread, with a stand-in ``cuda-checkpoint`` first on PATH (its restore and unlock
sleep 0.5 s each and log when they ran) and the plugin's GPU check skipped by CRIU's own fault
injection (CRIU_FAULT=138, FI_PLUGIN_CUDA_FORCE_ENABLE). Three restores:
  together   the default: the plugin's "resumed N processes together in X s" line, the restores' runs
             overlapping;
  serial     CRIU_CUDA_SERIAL_RESUME=1: one process after the other, "resumed N processes one at a time";
  failed     the root's restore run fails: the plugin logs "RESUME_DEVICES RESTORE failed with <output>",
             skips that process's unlock, and the restore still ends (as upstream's path does).
After each one every process must count on, its stand-in restore thread too. Prints one JSON line;
exits 1 when a check fails. Root only (criu); stdlib only, so it can be copied to a test host alone.
An unpatched CRIU fails "together" (no summary line) and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

FAKE_SLEEP = 0.5
PROCESSES = 3

FAKE_CUDA_CHECKPOINT = r"""#!/bin/sh
# Stand-in for cuda-checkpoint (tests only): a process's restore thread is its thread named cudarst.
log=$FAKE_CC_LOG
case "$1" in
  -h|--help) echo "usage: cuda-checkpoint --action lock|checkpoint|restore|unlock --pid PID"; exit 0 ;;
  --get-restore-tid)
    for d in /proc/$3/task/*; do
      [ "$(cat "$d/comm" 2>/dev/null)" = cudarst ] && { basename "$d"; exit 0; }
    done
    echo "Could not find restore thread for process ID $3"; exit 1 ;;
  --get-state) echo running; exit 0 ;;
  --action)
    echo "$(date +%s.%N) start $2 $4" >> "$log"
    case "$2" in restore|unlock) sleep "$FAKE_CC_SLEEP" ;; esac
    if [ "${FAKE_CC_FAIL:-}" = "$2:$4" ]; then
      echo "$(date +%s.%N) fail $2 $4" >> "$log"; echo "stand-in: $2 of pid $4 failed"; exit 1
    fi
    echo "$(date +%s.%N) end $2 $4" >> "$log"; exit 0 ;;
esac
echo "stand-in cuda-checkpoint: bad arguments: $*"; exit 2
"""

# The tree: the root forks the others; each counts in count.<i> ("<count> <restore thread's spins>").
TREE = r"""
import ctypes, os, sys, threading, time
run, n = sys.argv[1], int(sys.argv[2])
idx = 0
for i in range(1, n):
    if os.fork() == 0:
        idx = i
        break
spins = 0
def restore_thread():
    global spins
    ctypes.CDLL(None).prctl(15, b"cudarst", 0, 0, 0)  # PR_SET_NAME: the stand-in finds it by name
    while True:
        spins += 1
        time.sleep(0.01)
threading.Thread(target=restore_thread, daemon=True).start()
path = f"{run}/count.{idx}"
count = 0
while True:
    count += 1
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{count} {spins}\n")
    os.replace(path + ".tmp", path)
    time.sleep(0.1)
"""


class CheckFailed(Exception):
    pass


def wait_for(what: str, cond, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise CheckFailed(f"timed out waiting for {what}")
        time.sleep(0.05)


def counts(run: Path) -> list[tuple[int, int]]:
    out = []
    for i in range(PROCESSES):
        text = (run / f"count.{i}").read_text().split()
        out.append((int(text[0]), int(text[1])))
    return out


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
    return sorted(pids)


def actions(log: Path) -> dict[str, dict[int, list[float | None]]]:
    """{"restore": {pid: [start, end]}, ...} of the restore side (after the marker line)."""
    out: dict[str, dict[int, list[float | None]]] = {}
    text = log.read_text() if log.exists() else ""
    for line in text.split("--- restore\n", 1)[-1].splitlines():
        stamp, what, action, pid = line.split()
        slot = out.setdefault(action, {}).setdefault(int(pid), [None, None])
        slot[0 if what == "start" else 1] = float(stamp)
    return out


def run_case(criu: str, plugins: str, work: Path, name: str, extra_env: dict[str, str], fail: str = "") -> dict:
    case = work / name
    shutil.rmtree(case, ignore_errors=True)
    (case / "img").mkdir(parents=True)
    (case / "run").mkdir()
    cc_log = case / "cuda-checkpoint.log"
    env = dict(os.environ, PATH=f"{work / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", CRIU_FAULT="138",
               FAKE_CC_LOG=str(cc_log), FAKE_CC_SLEEP=str(FAKE_SLEEP))
    env.pop("CRIU_CUDA_SERIAL_RESUME", None)
    tree = subprocess.Popen([sys.executable, "-c", TREE, str(case / "run"), str(PROCESSES)], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = tree.pid
    try:
        wait_for("the tree's counts", lambda: all((case / "run" / f"count.{i}").exists() for i in range(PROCESSES)))
        time.sleep(0.3)
        pids = session_pids(root)
        dump = subprocess.run([criu, "dump", "-t", str(root), "-D", str(case / "img"), "-v4", "-o", "dump.log",
                               "-L", plugins], env=env, capture_output=True, text=True, check=False)
        if dump.returncode:
            raise CheckFailed(f"{name}: dump failed: {_tail(case / 'img' / 'dump.log')}")
        tree.wait(timeout=10)
        # The children are reparented zombies until PID 1 reaps them; the restore needs their pids back.
        wait_for("the dumped processes' pids to be free", lambda: not any(Path(f"/proc/{p}").exists() for p in pids))
        before = counts(case / "run")
        with cc_log.open("a") as fh:
            fh.write("--- restore\n")
        if fail:
            env["FAKE_CC_FAIL"] = f"{fail}:{root}"
        env.update(extra_env)
        started = time.monotonic()
        restore = subprocess.run([criu, "restore", "-D", str(case / "img"), "-d", "-v4", "-o", "restore.log",
                                  "-L", plugins], env=env, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        log = (case / "img" / "restore.log").read_text(errors="replace")
        if restore.returncode:
            raise CheckFailed(f"{name}: restore failed: {_tail(case / 'img' / 'restore.log')}")
        time.sleep(1.0)
        after = counts(case / "run")
        stalled = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a[0] <= b[0] or a[1] <= b[1]]
        if stalled:
            raise CheckFailed(f"{name}: processes {stalled} (or their restore threads) stopped counting: "
                              f"{before} -> {after}")
        ran = actions(cc_log)
        restores = [v for v in ran.get("restore", {}).values() if None not in v]
        summary = re.search(r"cuda_plugin: resumed (\d+) processes (together|one at a time) in ([0-9.]+) s", log)
        return {
            "criu_s": round(seconds, 3),
            "summary": summary.group(0) if summary else None,
            "processes": int(summary.group(1)) if summary else None,
            "how": summary.group(2) if summary else None,
            "s": float(summary.group(3)) if summary else None,
            # Every restore run started before any one ended: they overlapped.
            "restores_overlap": bool(restores) and max(s for s, _ in restores) < min(e for _, e in restores),
            "restores": len(ran.get("restore", {})),
            "unlocks": sorted(ran.get("unlock", {})),
            "root": root,
            "restore_failed_logged": "RESUME_DEVICES RESTORE failed with stand-in: restore of pid" in log,
            "finished": "Restore finished successfully" in log,
        }
    finally:
        for pid in session_pids(root):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if tree.poll() is None:
            tree.kill()
            tree.wait()


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return str(err)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    criu, plugins, work = argv[1], argv[2], Path(argv[3])
    shutil.rmtree(work, ignore_errors=True)
    (work / "bin").mkdir(parents=True)
    fake = work / "bin" / "cuda-checkpoint"
    fake.write_text(FAKE_CUDA_CHECKPOINT)
    fake.chmod(0o755)
    out: dict = {"ok": False}
    try:
        out["together"] = together = run_case(criu, plugins, work, "together", {})
        out["serial"] = serial = run_case(criu, plugins, work, "serial", {"CRIU_CUDA_SERIAL_RESUME": "1"})
        out["failed"] = failed = run_case(criu, plugins, work, "failed", {}, fail="restore")
        checks = {
            "together: all processes resumed together": together["how"] == "together"
            and together["processes"] == PROCESSES,
            "together: the restore runs overlapped": together["restores_overlap"],
            "serial: one at a time, no overlap": serial["how"] == "one at a time"
            and serial["processes"] == PROCESSES and not serial["restores_overlap"],
            "together took less than serial": (together["s"] or 99) < (serial["s"] or 0),
            "failed: the error logged, the root's unlock skipped, the restore finished": failed["restore_failed_logged"]
            and failed["root"] not in failed["unlocks"] and len(failed["unlocks"]) == PROCESSES - 1
            and failed["finished"],
        }
        out["failed_checks"] = [what for what, good in checks.items() if not good]
        out["ok"] = not out["failed_checks"]
    except (CheckFailed, OSError, subprocess.SubprocessError, ValueError) as err:
        out["error"] = str(err)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
