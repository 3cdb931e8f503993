"""Real CUDA processes for the GPU-only checkpoint tests (ctypes over libcuda, no CUDA toolkit needed).

    python cuda_holder.py context MIB      # a context with MIB of device memory holding a known pattern
    python cuda_holder.py init             # cuInit(0) only: the driver opened, no context
    python cuda_holder.py load             # libcuda loaded, nothing called
    python cuda_holder.py tree MIB         # a parent without CUDA whose child is ``context MIB``
    python cuda_holder.py serve PORT MIB   # vLLM's shape: an HTTP server without CUDA and its child
                                           # worker holding the context; a completion checks the GPU

The first four print ``ready PID[,PID...]`` (the CUDA process last), then wait for a line on stdin;
``context`` and ``tree`` then copy the memory back, compare it with the pattern and print
``intact`` or ``corrupted``. ``serve`` answers ``POST /v1/completions`` with the text ``intact``
(HTTP 200) only when its worker read the whole pattern back from the GPU.
"""

from __future__ import annotations

import ctypes
import http.server
import json
import subprocess
import sys
from collections.abc import Callable


def _check(code: int, what: str) -> None:
    if code != 0:
        sys.stdout.write(f"error {what} {code}\n")
        sys.stdout.flush()
        raise SystemExit(1)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hold(cuda: ctypes.CDLL, mib: int) -> Callable[[], str]:
    """A context with ``mib`` MiB of device memory holding a pattern; returns its check."""
    size = mib * 2**20
    _check(cuda.cuInit(0), "cuInit")
    device, context, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    _check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    _check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
    pattern = bytes(range(251)) * (size // 251) + bytes(size % 251)
    _check(cuda.cuMemcpyHtoD_v2(ptr, pattern, ctypes.c_size_t(size)), "cuMemcpyHtoD")
    _check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")

    def check() -> str:
        back = ctypes.create_string_buffer(size)
        code = cuda.cuMemcpyDtoH_v2(back, ptr, ctypes.c_size_t(size))
        if code != 0:
            return f"error cuMemcpyDtoH {code}"
        return "intact" if back.raw == pattern else "corrupted"

    return check


def serve(port: int, mib: int) -> int:
    worker = subprocess.Popen([sys.executable, __file__, "worker", str(mib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    if not worker.stdout.readline().startswith("ready"):
        return 1

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            worker.stdin.write("check\n")  # type: ignore[union-attr]
            worker.stdin.flush()  # type: ignore[union-attr]
            answer = worker.stdout.readline().strip()  # type: ignore[union-attr]
            body = json.dumps({"choices": [{"text": answer}]}).encode()
            self.send_response(200 if answer == "intact" else 500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


def main() -> int:
    mode = sys.argv[1]
    if mode == "serve":
        return serve(int(sys.argv[2]), int(sys.argv[3]))
    if mode == "tree":
        child = subprocess.Popen([sys.executable, __file__, "context", sys.argv[2]], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline().split()
        _say(f"ready {ctypes.CDLL(None).getpid()},{line[1]}")
        child.stdin.write(sys.stdin.readline())
        child.stdin.flush()
        _say(child.stdout.readline().strip())
        return child.wait()
    cuda = ctypes.CDLL("libcuda.so.1")
    check = hold(cuda, int(sys.argv[2])) if mode in ("context", "worker") else None
    if mode == "init":
        _check(cuda.cuInit(0), "cuInit")
    _say(f"ready {ctypes.CDLL(None).getpid()}")
    if mode == "worker":
        for _ in sys.stdin:
            _say(check())  # type: ignore[misc]
        return 0
    sys.stdin.readline()
    _say(check() if check else "done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
