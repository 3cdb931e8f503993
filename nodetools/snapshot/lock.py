"""One snapshot operation per node at a time: they share /dev/shm (vLLM's and CRIU's files there), so
an exclusive lock on a file in it serialises them, whichever campaign or user started them.

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import fcntl
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["LOCK", "NodeLock"]

LOCK = Path("/dev/shm/.gpu-campaign-snapshot.lock")


class NodeLock:
    """An exclusive ``flock`` on ``path``, waited for up to ``timeout_s`` (``TimeoutError`` after)."""

    def __init__(self, timeout_s: float, path: Path = LOCK) -> None:
        self.timeout_s = timeout_s
        self.path = path
        self.fh: IO[str] | None = None

    def __enter__(self) -> NodeLock:
        self.fh = self.path.open("a")
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.fh.close()
                    raise TimeoutError(f"another snapshot operation holds {self.path} (they share /dev/shm)") from None
                time.sleep(0.5)

    def __exit__(self, *exc: Any) -> None:
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None
