"""What every snapshot mode does with its engine: start it and time it to its first token (the cold-start
timer, :class:`nodetools.timer.Timer`), ask it for answers, quiesce it before the snapshot and wake it
after (``quiesce.py``), wait for the first token after a restore, stop it.

Stdlib only: this runs on the node.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from nodetools import exitcodes
from nodetools.http_probe import first_token, post
from nodetools.proc import stop_group
from nodetools.snapshot.quiesce import Quiesce
from nodetools.timer import Timer

__all__ = ["ANSWER_TOKENS", "EngineRun"]

ANSWER_TOKENS = 16  # an answer the size of a short reply: decode, not only the first token
TOKEN_WAIT_S = 120  # a restored engine that gives no token in this long is a failed restore


class EngineRun:
    """One engine of a snapshot trial; ``after_first_token`` is the mode's own work."""

    def __init__(self, args: argparse.Namespace, launch: dict[str, Any]) -> None:
        self.args = args
        self.timer = Timer(launch, args.log, args.poll_s, args.timeout_s)
        self.out = self.timer.out
        self.out["mode"] = getattr(args, "mode", "")
        self.quiesce = Quiesce(getattr(args, "quiesce", "none"), self.timer.port, self.timer.gpus)

    def measure(self) -> int:
        """Start the engine, time its first token, then the mode's work; an exit code."""
        self.timer.start()
        rc = self.timer.wait_first_token("first_token")
        if rc != exitcodes.OK:
            self.out.setdefault("error", "the engine did not start (see server.log)")
            return rc
        self.out["first_token_s"] = self.out["events"]["first_token"]
        return self.after_first_token()

    def after_first_token(self) -> int:
        raise NotImplementedError

    def sleep_engine(self) -> str:
        """Quiesce the engine before its snapshot (``out["quiesce"]``); an error naming the step, or ""."""
        if not self.quiesce.level or self.timer.proc is None:
            return ""
        return self.quiesce.sleep(self.timer.proc.pid, self.out.setdefault("quiesce", {"asked": self.quiesce.name}))

    def wake_engine(self, record: dict[str, Any]) -> str:
        """Wake the engine a restore brought back, asleep as it was dumped; its seconds into ``record``."""
        return self.quiesce.wake(record)

    def wait_token(self, key: str, since: float, record: dict[str, Any] | None = None) -> bool:
        """Poll for a real token for up to TOKEN_WAIT_S; the seconds from ``since`` into ``record[key]``."""
        deadline = time.time() + TOKEN_WAIT_S
        while time.time() < deadline:
            if first_token(self.timer.port, self.timer.model, timeout=30):
                (self.out if record is None else record)[key] = round(time.time() - since, 4)
                return True
            time.sleep(self.args.poll_s)
        return False

    def answers(self, count: int) -> list[float | None]:
        """Seconds of ``count`` completions of ANSWER_TOKENS tokens, one after the other (None: failed)."""
        body = {"model": self.timer.model, "prompt": "Tell me about the sea.", "max_tokens": ANSWER_TOKENS,
                "temperature": 0}
        took: list[float | None] = []
        for _ in range(count):
            started = time.time()
            try:
                status, payload = post(self.timer.port, "/v1/completions", body, 120)
                ok = status == 200 and bool(json.loads(payload).get("choices"))
            except (OSError, ValueError):
                ok = False
            took.append(round(time.time() - started, 4) if ok else None)
        return took

    def lease_group(self, pgid: int, what: str) -> None:
        if self.timer.claim is not None:
            self.timer.claim.lease.add_group(pgid, what)

    def stop(self) -> None:
        """Stop the engine, whether it is still our child or a tree a restore brought back."""
        if self.timer.proc is not None and self.timer.proc.poll() is not None:
            stop_group(self.timer.proc.pid)  # a restored tree is no longer our child
            self.out["events"]["stopped"] = round(time.time() - self.timer.t0, 4)
        self.timer.stop()
