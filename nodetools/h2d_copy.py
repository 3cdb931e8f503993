"""Host-to-GPU and GPU-to-host copy rates of one GPU, pinned and pageable (stdlib only).

    python -m nodetools.h2d_copy --size-mib 1024 --repeats 5 --gpu 0 [--out FILE]
    python -m nodetools.h2d_copy --probe [--gpu 0]

What a KV offload tier or a CUDA checkpoint restore can reach is bounded by how fast this node
copies between host memory and the GPU. This measures it through ctypes over the NVIDIA driver's
``libcuda.so.1`` (the driver API: no torch, no CUDA toolkit): one device buffer of ``--size-mib``
MiB, one pinned host buffer (``cuMemHostAlloc``, page-locked: the DMA engine reads it directly,
as vLLM's CPU KV tier does) and one pageable one (``malloc``: the driver stages it through its own
pinned buffers), each direction and memory kind timed ``--repeats`` times after one untimed
warm-up copy. Each copy is timed on the host's monotonic clock around the synchronous copy and a
``cuCtxSynchronize``, so it is what a caller waits for. The device buffer is read back at the end
and compared with what was sent: a copy that moved nothing cannot pass as a fast one.

Prints one JSON document (also written to ``--out``): the GPU's name, PCI bus id and NUMA node,
the driver version, the size, the repeats, and per direction (``h2d``, ``d2h``) and memory kind
(``pinned``, ``pageable``) each repeat's seconds, their median, ``gb_s`` (decimal GB/s over the
median, as fio and the reference campaign quote rates) and ``gb_s_max`` (the fastest repeat).
``--gpu`` is nvidia-smi's index: the driver is asked to number GPUs by PCI bus
(``CUDA_DEVICE_ORDER=PCI_BUS_ID``), and the record carries the bus id, so it is never ambiguous.

``--probe`` prints ``{"usable": ..., "why": ..., "gpus": N}`` and exits 0: ``usable`` is false,
with the reason, where there is no NVIDIA driver (libcuda cannot be loaded) or no GPU (the driver
finds no device), which a playbook records as a skipped trial; a driver that fails otherwise is an
error. Errors are one line on stderr; exit codes from ``nodetools/exitcodes.py``: 0 measured;
2 bad input (arguments, a GPU index this node lacks, a size the GPU cannot hold); 3 no driver or
GPU, a CUDA call failed, or the data read back differs. ``H2D_COPY_LIBCUDA`` names another library
to load instead of ``libcuda.so.1`` (tests).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodetools import exitcodes
from nodetools.tool_args import ToolParser

__all__ = ["BadInput", "CudaError", "DataDiffers", "NoGpu", "main", "measure", "probe"]

PROG = "h2d_copy"
LIBCUDA_ENV = "H2D_COPY_LIBCUDA"
LIBCUDA = "libcuda.so.1"
MAX_SIZE_MIB = 65536
MAX_REPEATS = 1000
CUDA_SUCCESS = 0
CUDA_ERROR_NO_DEVICE = 100
DIRECTIONS = ("h2d", "d2h")
MEMORY_KINDS = ("pinned", "pageable")

_U64, _SIZE, _PTR, _INT = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (ctypes.POINTER(_INT),),
    "cuDeviceGetCount": (ctypes.POINTER(_INT),),
    "cuDeviceGet": (ctypes.POINTER(_INT), _INT),
    "cuDeviceGetName": (ctypes.c_char_p, _INT, _INT),
    "cuDeviceGetPCIBusId": (ctypes.c_char_p, _INT, _INT),
    "cuDeviceTotalMem_v2": (ctypes.POINTER(_SIZE), _INT),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_PTR), _INT),
    "cuDevicePrimaryCtxRelease_v2": (_INT,),
    "cuCtxSetCurrent": (_PTR,),
    "cuCtxSynchronize": (),
    "cuMemAlloc_v2": (ctypes.POINTER(_U64), _SIZE),
    "cuMemFree_v2": (_U64,),
    "cuMemHostAlloc": (ctypes.POINTER(_PTR), _SIZE, ctypes.c_uint),
    "cuMemFreeHost": (_PTR,),
    "cuMemcpyHtoD_v2": (_U64, _PTR, _SIZE),
    "cuMemcpyDtoH_v2": (_PTR, _U64, _SIZE),
}


class NoGpu(Exception):
    """No NVIDIA driver (libcuda cannot be loaded) or no GPU (the driver finds no device)."""


class BadInput(Exception):
    """Arguments this node cannot honour: a GPU index it lacks, a size its GPU cannot hold."""


class DataDiffers(Exception):
    """The bytes read back from the GPU are not the bytes copied there."""


class CudaError(Exception):
    def __init__(self, call: str, name: str, text: str) -> None:
        super().__init__(f"{call} returned {name} ({text})")
        self.call, self.name = call, name


def _display_driver() -> str:
    """The kernel module's version (e.g. '580.159.04'), or '' where there is none."""
    try:
        words = Path("/proc/driver/nvidia/version").read_text(encoding="ascii", errors="replace").split()
    except OSError:
        return ""
    return next((w for w in words if w[:1].isdigit() and w.count(".") >= 1), "")


class Cuda:
    """The driver functions this tool calls, after ``cuInit(0)``."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get(LIBCUDA_ENV) or LIBCUDA
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # --gpu means nvidia-smi's index
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as exc:
            raise NoGpu(f"no NVIDIA driver on this node: cannot load {self.path} ({exc})") from None
        missing = [name for name in _SIGNATURES if not hasattr(self.lib, name)]
        if missing:
            raise NoGpu(f"{self.path} lacks {', '.join(missing)}: is it NVIDIA's libcuda?")
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes, fn.restype = argtypes, _INT
        code = self.lib.cuInit(0)
        if code == CUDA_ERROR_NO_DEVICE:
            name, text = self._error_text(code)
            raise NoGpu(f"no NVIDIA GPU on this node: cuInit returned {name} ({text})")
        self.check("cuInit", code)

    def _error_text(self, code: int) -> tuple[str, str]:
        texts = []
        for getter in ("cuGetErrorName", "cuGetErrorString"):
            out = ctypes.c_char_p()
            fn = getattr(self.lib, getter, None)
            if fn is not None:
                fn.argtypes, fn.restype = (_INT, ctypes.POINTER(ctypes.c_char_p)), _INT
            ok = fn is not None and fn(code, ctypes.byref(out)) == CUDA_SUCCESS and out.value
            texts.append(out.value.decode(errors="replace") if ok and out.value else f"CUresult {code}")
        return texts[0], texts[1]

    def check(self, call: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            raise CudaError(call, *self._error_text(code))

    def call(self, name: str, *args: object) -> None:
        self.check(name, getattr(self.lib, name)(*args))

    def count(self) -> int:
        n = _INT(0)
        self.call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def cuda_version(self) -> str:
        v = _INT(0)
        self.call("cuDriverGetVersion", ctypes.byref(v))
        return f"{v.value // 1000}.{v.value % 1000 // 10}"

    def describe(self, device: int) -> dict[str, Any]:
        name, bus, total = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64), _SIZE(0)
        self.call("cuDeviceGetName", name, len(name), device)
        self.call("cuDeviceGetPCIBusId", bus, len(bus), device)
        self.call("cuDeviceTotalMem_v2", ctypes.byref(total), device)
        pci = bus.value.decode(errors="replace")
        return {"gpu_name": name.value.decode(errors="replace"), "pci_bus_id": pci,
                "numa_node": _numa_node(pci), "gpu_memory_bytes": total.value}


def _numa_node(pci_bus_id: str) -> int | None:
    """The NUMA node sysfs gives the GPU's PCI device (None where it says -1 or nothing)."""
    try:
        node = int(Path(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def probe(gpu: int = 0, path: str | None = None) -> dict[str, Any]:
    """Whether this node has a driver and a GPU to measure; a broken driver raises CudaError."""
    try:
        cuda = Cuda(path)
    except NoGpu as exc:
        return {"usable": False, "why": str(exc), "gpus": 0}
    count = cuda.count()
    if count == 0:
        return {"usable": False, "why": "no NVIDIA GPU on this node: the driver counts 0 devices", "gpus": 0}
    return {"usable": True, "why": "", "gpus": count, "gpu": gpu, "cuda_version": cuda.cuda_version()}


class _Buffers:
    """One device buffer, one pinned and one pageable host buffer of the same size, freed on exit."""

    def __init__(self, cuda: Cuda, device: int, size: int) -> None:
        self.cuda, self.device, self.size = cuda, device, size
        self.libc = ctypes.CDLL(None)
        self.libc.malloc.argtypes, self.libc.malloc.restype = (_SIZE,), _PTR
        self.libc.free.argtypes, self.libc.free.restype = (_PTR,), None
        self.libc.memcmp.argtypes, self.libc.memcmp.restype = (_PTR, _PTR, _SIZE), _INT
        self.context, self.dev, self.pinned, self.pageable = _PTR(), _U64(0), _PTR(), _PTR()
        self.retained = False

    def __enter__(self) -> _Buffers:
        cuda = self.cuda
        cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
        self.retained = True
        cuda.call("cuCtxSetCurrent", self.context)
        cuda.call("cuMemAlloc_v2", ctypes.byref(self.dev), self.size)
        cuda.call("cuMemHostAlloc", ctypes.byref(self.pinned), self.size, 0)
        self.pageable = _PTR(self.libc.malloc(self.size))
        if not self.pageable.value:
            raise MemoryError(f"malloc of {self.size} bytes of pageable host memory failed")
        _fill(self.pinned.value or 0, self.size)  # touched, so no copy pays the first page faults
        ctypes.memmove(self.pageable.value, self.pinned.value, self.size)
        return self

    def __exit__(self, *_exc: object) -> None:
        lib = self.cuda.lib
        if self.pageable.value:
            self.libc.free(self.pageable)
        if self.pinned.value:
            lib.cuMemFreeHost(self.pinned)
        if self.dev.value:
            lib.cuMemFree_v2(self.dev)
        if self.retained:
            lib.cuDevicePrimaryCtxRelease_v2(self.device)

    def copy(self, direction: str, memory: str) -> Callable[[], None]:
        host = self.pinned if memory == "pinned" else self.pageable
        if direction == "h2d":
            return lambda: self.cuda.call("cuMemcpyHtoD_v2", self.dev, host, self.size)
        return lambda: self.cuda.call("cuMemcpyDtoH_v2", host, self.dev, self.size)

    def read_back_matches(self) -> bool:
        """The device buffer read into a cleared host buffer equals the pattern, written afresh
        (every timed copy moved that pattern, so a copy that lost or changed bytes shows here)."""
        ctypes.memset(self.pageable.value or 0, 0, self.size)
        self.copy("d2h", "pageable")()
        _fill(self.pinned.value or 0, self.size)
        return self.libc.memcmp(self.pageable, self.pinned, self.size) == 0


def _fill(address: int, size: int) -> None:
    """A position-dependent byte pattern (a short or shifted copy does not match it), by doubling."""
    seed = bytes(range(251)) * 17  # 4267 bytes: a prime period, so no power-of-two offset repeats it
    ctypes.memmove(address, seed, min(len(seed), size))
    done = min(len(seed), size)
    while done < size:
        step = min(done, size - done)
        ctypes.memmove(address + done, address, step)
        done += step


def _timed(copy: Callable[[], None], sync: Callable[[], None], repeats: int) -> list[float]:
    copy()
    sync()  # the warm-up: the driver's staging buffers and the first DMA mappings are set up here
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        copy()
        sync()
        seconds.append(time.perf_counter() - start)
    return seconds


def measure(size_mib: int, repeats: int, gpu: int, path: str | None = None) -> dict[str, Any]:
    """Every direction and memory kind timed ``repeats`` times on GPU ``gpu``; the JSON record."""
    cuda = Cuda(path)
    count = cuda.count()
    if count == 0:
        raise NoGpu("no NVIDIA GPU on this node: the driver counts 0 devices")
    if gpu >= count:
        indices = "index 0" if count == 1 else f"indices 0-{count - 1}"
        raise BadInput(f"--gpu {gpu}: this node has {count} GPU{'s' if count != 1 else ''} ({indices})")
    device = _INT(0)
    cuda.call("cuDeviceGet", ctypes.byref(device), gpu)
    info = cuda.describe(device.value)
    size = size_mib * 2**20
    if size >= info["gpu_memory_bytes"]:
        raise BadInput(f"--size-mib {size_mib}: GPU {gpu} ({info['gpu_name']}) has "
                       f"{info['gpu_memory_bytes'] / 2**20:.0f} MiB in all")
    record: dict[str, Any] = {
        "tool": "nodetools.h2d_copy", "gpu": gpu, **info, "driver_version": _display_driver() or None,
        "cuda_version": cuda.cuda_version(), "size_bytes": size, "size_mib": size_mib, "repeats": repeats,
        "timing": "host monotonic clock around each synchronous copy and cuCtxSynchronize, after one warm-up",
        "copies": [],
    }
    def sync() -> None:
        cuda.call("cuCtxSynchronize")

    with _Buffers(cuda, device.value, size) as buffers:
        for memory in MEMORY_KINDS:
            for direction in DIRECTIONS:
                seconds = _timed(buffers.copy(direction, memory), sync, repeats)
                median = statistics.median(seconds)
                record["copies"].append({
                    "direction": direction, "memory": memory, "seconds": [round(s, 6) for s in seconds],
                    "seconds_median": round(median, 6), "gb_s": round(size / median / 1e9, 3),
                    "gb_s_max": round(size / min(seconds) / 1e9, 3)})
        record["verified"] = buffers.read_back_matches()
    if not record["verified"]:
        raise DataDiffers(f"the {size_mib} MiB read back differ from what was copied there: the copy path "
                          "loses or changes bytes, so its rates mean nothing")
    return record


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parser() -> argparse.ArgumentParser:
    p = ToolParser(prog=PROG, description="Host<->GPU copy rates of one GPU, pinned and pageable memory "
                "(ctypes over libcuda).", epilog="Exit codes: 0 measured; 2 bad input; 3 no driver or GPU, "
                f"a CUDA call failed, or the read-back differs. {LIBCUDA_ENV} loads another library.")
    p.add_argument("--size-mib", type=int, default=1024, help=f"bytes per copy, in MiB (1-{MAX_SIZE_MIB})")
    p.add_argument("--repeats", type=int, default=5, help=f"timed copies per direction and memory kind "
                   f"(1-{MAX_REPEATS})")
    p.add_argument("--gpu", type=int, default=0, help="the GPU, by nvidia-smi's index")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--probe", action="store_true", help="print whether a driver and a GPU are there; exit 0")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not 1 <= args.size_mib <= MAX_SIZE_MIB:
        p.error(f"--size-mib must be 1-{MAX_SIZE_MIB}, not {args.size_mib}")
    if not 1 <= args.repeats <= MAX_REPEATS:
        p.error(f"--repeats must be 1-{MAX_REPEATS}, not {args.repeats}")
    if args.gpu < 0:
        p.error(f"--gpu must be >= 0, not {args.gpu}")
    try:
        record = probe(args.gpu) if args.probe else measure(args.size_mib, args.repeats, args.gpu)
    except BadInput as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return exitcodes.BAD_INPUT
    except NoGpu as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return exitcodes.DIED
    except (CudaError, DataDiffers, MemoryError) as exc:
        sys.stderr.write(f"{PROG}: GPU {args.gpu}: {exc}\n")
        return exitcodes.DIED
    text = json.dumps(record, indent=1) + "\n"
    if args.out is not None:
        try:
            _write(args.out, text)
        except OSError as exc:
            sys.stderr.write(f"{PROG}: cannot write {args.out}: {exc.strerror or exc}\n")
            return exitcodes.BAD_INPUT
    sys.stdout.write(text)
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
