"""Follow a node-side log while a phase runs, so the display shows "Loading weights…" live.

Display only: it reads a file (locally, or with ``tail -F`` through OpenSSH with the inventory's
connection settings, as Ansible templates them, and host-key rules) and never changes a node; any
error just ends the following, and a connection that cannot be resolved is a warning: the run goes
on without the live lines.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from runner.inventory import Connection

if TYPE_CHECKING:
    from runner.inventory import Inventory

__all__ = ["LogFollower", "start_following"]

logger = logging.getLogger(__name__)
_warned: set[str] = set()
_warned_lock = threading.Lock()


def start_following(inventory: Inventory, host: str, path: str, on_line: Callable[[str], None]
                    ) -> LogFollower | None:
    """A started follower of ``path`` on ``host``, or None with a warning (once per host and
    reason) when the inventory's connection settings cannot be resolved. Never raises."""
    try:
        conn = inventory.connection(host)
    except Exception as exc:  # noqa: BLE001 - following is best effort: nothing it meets may stop a run
        reason = f"{host}: {' '.join(str(exc).split()) or type(exc).__name__}"
        with _warned_lock:
            first = reason not in _warned
            _warned.add(reason)
        if first:
            logger.warning("not following the server log live on %s (the trial runs on)", reason)
        return None
    follower = LogFollower(conn, path, on_line)
    follower.start()
    return follower


class LogFollower(threading.Thread):
    def __init__(self, conn: Connection, path: str, on_line: Callable[[str], None], *,
                 poll_s: float = 0.2) -> None:
        super().__init__(name=f"follow-{conn.host}", daemon=True)
        self.conn = conn
        self.path = path
        self.on_line = on_line
        self.poll_s = poll_s
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def run(self) -> None:
        try:
            if self.conn.kind == "local":
                self._follow_local()
            else:
                self._follow_ssh()
        except Exception as exc:  # noqa: BLE001 - following is best effort, never a trial failure
            logger.debug("stopped following %s on %s: %s", self.path, self.conn.host, exc)

    def _emit(self, buffer: str) -> str:
        *lines, rest = buffer.split("\n")
        for line in lines:
            if line.strip():
                self.on_line(line)
        return rest

    def _follow_local(self) -> None:
        path = Path(self.path)
        # What the file already holds belongs to an earlier run. A new run truncates or replaces
        # it: seen as a shrink or as different first bytes, it is then followed from its start.
        head = path.read_bytes()[:64] if path.exists() else b""
        offset = path.stat().st_size if head else 0
        buffer = ""
        while not self._stop_event.wait(self.poll_s):
            try:
                with path.open("rb") as fh:
                    if fh.read(len(head)) != head or path.stat().st_size < offset:
                        offset, head = 0, b""
                    fh.seek(offset)
                    data = fh.read()
            except FileNotFoundError:
                continue
            offset += len(data)
            buffer = self._emit(buffer + data.decode(errors="replace"))

    def _follow_ssh(self) -> None:
        # OpenSSH with the inventory's own settings (user, port, key, ssh args, known_hosts, proxy):
        # the same trust rules as Ansible, and BatchMode so an unknown host key is refused, never
        # accepted or asked about.
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=10",
                "-p", str(self.conn.port), "-l", self.conn.user]
        if self.conn.key_file:
            argv += ["-i", self.conn.key_file]
        argv += [*self.conn.ssh_args, self.conn.address,
                 f"tail -n 0 -F {shlex.quote(self.path)} 2>/dev/null"]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        buffer = ""
        try:
            while not self._stop_event.is_set() and proc.poll() is None:
                ready, _, _ = select.select([proc.stdout], [], [], self.poll_s)
                if ready:
                    data = os.read(proc.stdout.fileno(), 65536)
                    if not data:
                        break
                    buffer = self._emit(buffer + data.decode(errors="replace"))
            if proc.poll() is not None and proc.returncode:
                err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                logger.debug("following %s on %s ended: %s", self.path, self.conn.host, err.splitlines()[-1:] or "")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
