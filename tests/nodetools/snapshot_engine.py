"""The engine stand-in as CRIU meets vLLM's API server: ``python snapshot_engine.py [--io-uring]
[--tcp-pair] [--unlinked-shm DIR] -- STAND-IN SERVE ARGS``.

``--io-uring`` maps an io_uring the way vLLM's API server does when the kernel lets it (refused
while ``kernel.io_uring_disabled`` is 2: the process goes on without, as the libraries fall back);
``--tcp-pair`` holds an established loopback TCP connection inside the tree (both ends, traffic
flowing), as vLLM's processes do; ``--unlinked-shm DIR`` maps a file of /dev/shm shared and unlinks the
name it was opened by while a second name (in DIR) keeps it: CRIU dumps that with a
``link_remap`` file beside it, as it dumped a semaphore of vLLM 0.24.0 on the H200;
``--log-without-append`` writes the server log through a descriptor opened without O_APPEND (a
shell's ``>``), whose size CRIU checks at restore, as the H200's hand-run engine's log. Each says what
it got in the server log's first lines, then the stand-in serves in this same process (one process
tree for CRIU, as the real engine).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import runpy
import socket
import sys
import threading
import time

IO_URING_SETUP = 425  # x86-64 and aarch64 alike
KEPT: list[object] = []  # what must stay open while the stand-in serves


def map_io_uring() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    params = (ctypes.c_ubyte * 120)()  # struct io_uring_params, zeroed
    fd = libc.syscall(IO_URING_SETUP, 4, params)
    if fd < 0:
        return f"io_uring: refused ({os.strerror(ctypes.get_errno())})"
    KEPT.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0))
    return f"io_uring: mapped (fd {fd})"


def hold_tcp_pair() -> str:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    KEPT.extend((listener, client, server))

    def ping() -> None:
        while True:
            with contextlib.suppress(OSError):
                client.sendall(b"x")
                server.recv(1)
            time.sleep(0.5)

    threading.Thread(target=ping, daemon=True).start()
    return f"tcp: established {client.getsockname()[1]} <-> {listener.getsockname()[1]}"


def map_unlinked_shm(keep_dir: str) -> str:
    path = f"/dev/shm/snapshot-engine-{os.getpid()}"
    with open(path, "wb") as f:  # noqa: PTH123
        f.write(b"\1" * 32)  # a semaphore's size
    os.link(path, os.path.join(keep_dir, "still-linked"))  # noqa: PTH118
    fd = os.open(path, os.O_RDWR)
    KEPT.append(mmap.mmap(fd, 32, mmap.MAP_SHARED))
    os.unlink(path)  # noqa: PTH108
    return f"unlinked shm: {path} mapped (deleted), kept by {keep_dir}/still-linked"


def log_without_append() -> str:
    path = os.readlink("/proc/self/fd/1")  # noqa: PTH115
    fd = os.open(path, os.O_WRONLY)
    os.lseek(fd, 0, os.SEEK_END)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    return f"log without O_APPEND: {path}"


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    own, serve = args[:split], args[split + 1:]
    lines = []
    if "--io-uring" in own:
        lines.append(map_io_uring())
    if "--tcp-pair" in own:
        lines.append(hold_tcp_pair())
    if "--unlinked-shm" in own:
        lines.append(map_unlinked_shm(own[own.index("--unlinked-shm") + 1]))
    if "--log-without-append" in own:
        lines.append(log_without_append())
    sys.stdout.write("".join(f"snapshot_engine: {line}\n" for line in lines))
    sys.stdout.flush()
    sys.argv = ["nodetools.standin", *serve]
    runpy.run_module("nodetools.standin", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
