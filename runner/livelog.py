"""Follow a node-side log while a phase runs, so the display shows "Loading weights…" live.

Display only: it reads a file (locally, or with ``tail -F`` over SSH through paramiko with the
inventory's credentials) and never changes a node; any error just ends the following.
"""

from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import Callable
from pathlib import Path

from runner.inventory import Connection

__all__ = ["LogFollower"]

logger = logging.getLogger(__name__)


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
        import paramiko

        client = paramiko.SSHClient()
        # Read-only tail of a log for display; the inventory's own host-key policy governs Ansible.
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        client.connect(self.conn.address, port=self.conn.port, username=self.conn.user,
                       key_filename=self.conn.key_file, look_for_keys=self.conn.key_file is None,
                       allow_agent=self.conn.key_file is None, timeout=10)
        try:
            _, stdout, _ = client.exec_command(f"tail -n 0 -F {shlex.quote(self.path)} 2>/dev/null")
            channel = stdout.channel
            buffer = ""
            while not self._stop_event.is_set() and not channel.exit_status_ready():
                if channel.recv_ready():
                    buffer = self._emit(buffer + channel.recv(65536).decode(errors="replace"))
                else:
                    self._stop_event.wait(self.poll_s)
            channel.close()
        finally:
            client.close()
