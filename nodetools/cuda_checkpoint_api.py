#!/usr/bin/env python3
"""cuda-checkpoint's command line over the CUDA driver's public checkpoint API (stdlib only).

This is NOT NVIDIA's ``cuda-checkpoint`` tool. It is a re-implementation, for nodes that do not have
NVIDIA's binary, of the part of its command line that this project's snapshot experiment uses, made
of calls to the checkpoint functions that NVIDIA's driver library ``libcuda.so.1`` exports from
driver 570 on (CUDA 12.8 driver API, "CUDA Checkpointing": ``cuCheckpointProcessLock``,
``...Checkpoint``, ``...Restore``, ``...Unlock``, ``...GetState``, ``...GetRestoreThreadId``).
NVIDIA's binary is a thin wrapper over the same functions.

    cuda_checkpoint_api.py --action lock|checkpoint|restore|unlock --pid PID [--timeout MS]
    cuda_checkpoint_api.py --toggle --pid PID [--timeout MS]
    cuda_checkpoint_api.py --get-state --pid PID          # prints running|locked|checkpointed|failed
    cuda_checkpoint_api.py --get-restore-tid --pid PID    # prints the CUDA restore thread id
    cuda_checkpoint_api.py --help

``--toggle`` moves a running process to checkpointed (lock, then checkpoint) and a checkpointed one
back to running (restore, then unlock). ``--timeout`` (milliseconds) bounds the lock; 0 waits
without limit. Nothing is printed on success except what ``--get-state`` and ``--get-restore-tid``
report. On failure one line on stderr names the operation, the pid and the CUDA error's name and
text. Exit codes: 0 done; 1 the driver refused the operation; 2 bad arguments; 3 no usable
libcuda (no NVIDIA driver, or one older than 570 without these functions).

``CUDA_CHECKPOINT_API_LIBCUDA`` names another library to load instead of ``libcuda.so.1`` (tests).
It must stay a single file without imports from this project, so it can be copied to a node alone.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from typing import Any

LIBCUDA_ENV = "CUDA_CHECKPOINT_API_LIBCUDA"
LIBCUDA = "libcuda.so.1"
PROG = "cuda_checkpoint_api.py"

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_DRIVER = 0, 1, 2, 3

CUDA_SUCCESS = 0
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}  # CUprocessState
ACTIONS = ("lock", "checkpoint", "restore", "unlock")

CHECKPOINT_SYMBOLS = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                      "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState",
                      "cuCheckpointProcessGetRestoreThreadId")


class CUcheckpointLockArgs(ctypes.Structure):
    """``{unsigned int timeoutMs; unsigned int reserved0; cuuint64_t reserved1[7];}``: 64 bytes."""

    _fields_ = (("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7))


class CUcheckpointReservedArgs(ctypes.Structure):
    """CUcheckpointCheckpointArgs, ...RestoreArgs, ...UnlockArgs: 64 bytes, passed zeroed.

    ``{cuuint64_t reserved[8];}`` in CUDA 12.8; later CUDA releases give RestoreArgs an optional GPU
    remapping table (``gpuPairs``, ``gpuPairsCount``) in the same 64 bytes, where all zeroes still
    means "restore on the same GPUs".
    """

    _fields_ = (("reserved", ctypes.c_uint64 * 8),)


ARGS_SIZE = 64
if ctypes.sizeof(CUcheckpointLockArgs) != ARGS_SIZE or ctypes.sizeof(CUcheckpointReservedArgs) != ARGS_SIZE:
    raise ImportError("CUDA checkpoint argument structures must be 64 bytes")


class NoDriver(Exception):
    """libcuda cannot be loaded or lacks the checkpoint API."""


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str, text: str) -> None:
        super().__init__(f"{call}: {name} ({text})")
        self.call, self.code, self.name, self.text = call, code, name, text


def _display_driver() -> str:
    """The kernel module's version (e.g. '580.159.04'), or '' where there is none."""
    try:
        with open("/proc/driver/nvidia/version", encoding="ascii", errors="replace") as fh:  # noqa: PTH123
            words = fh.readline().split()
    except OSError:
        return ""
    return next((w for w in words if w[:1].isdigit() and w.count(".") >= 1), "")


class Driver:
    """The checkpoint functions of a loaded libcuda, after ``cuInit(0)``."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get(LIBCUDA_ENV) or LIBCUDA
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as exc:
            raise NoDriver(f"cannot load {self.path} ({exc}): no NVIDIA driver on this machine? The CUDA "
                           "checkpoint API needs the NVIDIA driver's libcuda, driver 570 or newer") from None
        missing = [s for s in CHECKPOINT_SYMBOLS if not hasattr(self.lib, s)]
        if missing:
            raise NoDriver(f"{self.path} lacks {', '.join(missing)}: the CUDA checkpoint API needs NVIDIA driver "
                           f"570 or newer (CUDA 12.8 driver API); this driver: {self._versions()}")
        for name, argtypes in (
            ("cuCheckpointProcessLock", (ctypes.c_int, ctypes.POINTER(CUcheckpointLockArgs))),
            ("cuCheckpointProcessCheckpoint", (ctypes.c_int, ctypes.POINTER(CUcheckpointReservedArgs))),
            ("cuCheckpointProcessRestore", (ctypes.c_int, ctypes.POINTER(CUcheckpointReservedArgs))),
            ("cuCheckpointProcessUnlock", (ctypes.c_int, ctypes.POINTER(CUcheckpointReservedArgs))),
            ("cuCheckpointProcessGetState", (ctypes.c_int, ctypes.POINTER(ctypes.c_int))),
            ("cuCheckpointProcessGetRestoreThreadId", (ctypes.c_int, ctypes.POINTER(ctypes.c_int))),
        ):
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self._call("cuInit", self._fn("cuInit", (ctypes.c_uint,)), 0)

    def _fn(self, name: str, argtypes: tuple[object, ...]) -> Any:
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise NoDriver(f"{self.path} lacks {name}: is it NVIDIA's libcuda?") from None
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        return fn

    def _versions(self) -> str:
        parts = []
        display = _display_driver()
        if display:
            parts.append(f"display driver {display}")
        if hasattr(self.lib, "cuDriverGetVersion"):
            version = ctypes.c_int(0)
            if self._fn("cuDriverGetVersion", (ctypes.POINTER(ctypes.c_int),))(ctypes.byref(version)) == 0:
                parts.append(f"CUDA {version.value // 1000}.{version.value % 1000 // 10}")
        return ", ".join(parts) or "version unknown"

    def error_text(self, code: int) -> tuple[str, str]:
        """cuGetErrorName and cuGetErrorString of ``code`` (the number where the driver has neither)."""
        texts = []
        for getter in ("cuGetErrorName", "cuGetErrorString"):
            out = ctypes.c_char_p()
            ok = hasattr(self.lib, getter) and self._fn(getter, (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)))(
                code, ctypes.byref(out)) == CUDA_SUCCESS and out.value
            texts.append(out.value.decode(errors="replace") if ok and out.value else f"CUresult {code}")
        return texts[0], texts[1]

    def _call(self, name: str, fn: Any, *args: object) -> None:
        code = fn(*args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, *self.error_text(code))

    def lock(self, pid: int, timeout_ms: int = 0) -> None:
        args = CUcheckpointLockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", self.lib.cuCheckpointProcessLock, pid, ctypes.byref(args))

    def _reserved(self, name: str, pid: int) -> None:
        args = CUcheckpointReservedArgs()
        self._call(name, getattr(self.lib, name), pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._reserved("cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int) -> None:
        self._reserved("cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        self._reserved("cuCheckpointProcessUnlock", pid)

    def state(self, pid: int) -> str:
        value = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", self.lib.cuCheckpointProcessGetState, pid, ctypes.byref(value))
        return STATES.get(value.value, f"unknown state {value.value}")

    def restore_tid(self, pid: int) -> int:
        tid = ctypes.c_int(0)
        self._call("cuCheckpointProcessGetRestoreThreadId", self.lib.cuCheckpointProcessGetRestoreThreadId, pid,
                   ctypes.byref(tid))
        return tid.value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{PROG}: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="cuda-checkpoint's command line over the CUDA driver's checkpoint API "
                "(a re-implementation for nodes without NVIDIA's binary, not NVIDIA's tool).",
                epilog="Exit codes: 0 done; 1 the driver refused the operation; 2 bad arguments; "
                       f"3 no usable libcuda (set {LIBCUDA_ENV} to load another library).")
    ops = p.add_mutually_exclusive_group(required=True)
    ops.add_argument("--action", choices=ACTIONS, help="perform this action on PID")
    ops.add_argument("--toggle", action="store_true",
                     help="running -> lock + checkpoint; checkpointed -> restore + unlock")
    ops.add_argument("--get-state", action="store_true", help="print running, locked, checkpointed or failed")
    ops.add_argument("--get-restore-tid", action="store_true", help="print the CUDA restore thread id of PID")
    p.add_argument("--pid", "-p", type=int, required=True, help="the process to act on")
    p.add_argument("--timeout", "-t", type=int, default=None, metavar="MS",
                   help="lock (also --toggle's lock): give up after MS milliseconds (0: no limit)")
    return p


def _describe(args: argparse.Namespace) -> str:
    if args.action:
        return f"--action {args.action} --pid {args.pid}"
    op = "--toggle" if args.toggle else "--get-state" if args.get_state else "--get-restore-tid"
    return f"{op} --pid {args.pid}"


def run(args: argparse.Namespace, driver: Driver) -> str:
    """Perform the operation; returns what to print (may be '')."""
    timeout = args.timeout or 0
    if args.get_state:
        return driver.state(args.pid)
    if args.get_restore_tid:
        return str(driver.restore_tid(args.pid))
    if args.toggle:
        state = driver.state(args.pid)
        if state == "running":
            driver.lock(args.pid, timeout)
            driver.checkpoint(args.pid)
        elif state == "checkpointed":
            driver.restore(args.pid)
            driver.unlock(args.pid)
        else:
            raise ValueError(f"cannot toggle a process in state {state} (only running or checkpointed)")
        return ""
    if args.action == "lock":
        driver.lock(args.pid, timeout)
    else:
        getattr(driver, args.action)(args.pid)
    return ""


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.pid <= 0:
        p.error(f"--pid must be a positive process id, not {args.pid}")
    if args.timeout is not None and (args.timeout < 0 or args.timeout > 0xFFFFFFFF):
        p.error(f"--timeout must be 0..{0xFFFFFFFF} milliseconds, not {args.timeout}")
    if args.timeout is not None and args.action != "lock" and not args.toggle:
        p.error("--timeout applies to --action lock and --toggle only")
    what = _describe(args)
    try:
        out = run(args, Driver())
    except NoDriver as exc:
        sys.stderr.write(f"{PROG}: {what}: {exc}\n")
        return EXIT_NO_DRIVER
    except CudaError as exc:
        sys.stderr.write(f"{PROG}: {what} failed: {exc.call} returned {exc.name}: {exc.text}\n")
        return EXIT_FAILED
    except ValueError as exc:
        sys.stderr.write(f"{PROG}: {what} failed: {exc}\n")
        return EXIT_FAILED
    if out:
        sys.stdout.write(out + "\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
