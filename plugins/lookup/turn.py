# SPDX-License-Identifier: MIT
"""Wait, on the controller, for this run's turn on its node (runner/overlap.py).

The runner starts a trial's Ansible run while the trial before it on the same host still collects,
so that ansible-playbook's own start overlaps that collect. The run's first task calls this lookup:
it blocks until the runner lets go of the turn file's lock, then reads what the runner wrote
there. ``go``: the previous trial is recorded, the node is this run's. Anything else (``cancel``,
or nothing from a runner that died): the lookup fails, and nothing of the run touched the node.
"""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: turn
short_description: Wait for the runner to give this run its turn on the node
description:
  - Blocks until the runner releases the lock of the turn file, then returns the seconds waited.
  - Fails when the runner released it without writing C(go) (the campaign stopped, the host was
    lost, or the runner is gone), or when O(timeout) passes first.
options:
  _terms:
    description: The turn file (the runner's C(exp_turn_file)).
    required: true
  timeout:
    description: Seconds to wait at most.
    type: float
    default: 3600
"""

POLL_S = 0.01  # the turn comes when the previous trial is recorded: wait no more than this past it


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleError("lookup('turn', FILE): one turn file")
        path, timeout = str(terms[0]), float(self.get_option("timeout"))
        started = time.monotonic()
        try:
            with Path(path).open(encoding="utf-8") as fh:
                while True:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() - started > timeout:
                            raise AnsibleError(f"no turn on the node within {timeout:g} s ({path})") from None
                        time.sleep(POLL_S)
                word = fh.read().strip()
        except OSError as exc:
            raise AnsibleError(f"cannot read the turn file {path}: {exc}") from exc
        if word != "go":
            raise AnsibleError(f"not this run's turn: the runner wrote {word or 'nothing'!r} (it stopped, lost the "
                               "host, or is gone); nothing was done on the node")
        return [round(time.monotonic() - started, 3)]
