"""The exit codes of every node tool (coldstart, snapshot, offload_run, preflight, pagecache, reap, h2d_copy, ram_read).

One table, so a playbook or a person reading ``rc=N`` knows what happened whichever tool it was:

==  =================  ==========================================================================
0   OK                 done (measured, reaped, printed)
1   (none)             an unexpected error: Python's own code for an uncaught exception
2   BAD_INPUT          bad command line, launch file or JSON (argparse exits 2 too)
3   DIED               the engine, or a tool the program ran (criu, cuda-checkpoint), failed
4   TIMEOUT            not ready in time, a load stopped at its cap, or stopped by SIGTERM
5   (retired)          bad input before this table; never reused, so an old record still reads right
6   FAILED_REQUESTS    offload_run: more failed requests than the mode allows
7   BUSY               the engine port is held: another run's port lock, or a server already answers
8   REFUSED            offload_run: a gate refused the run (LMCache on its torch-ops fallback)
==  =================  ==========================================================================

``cuda_checkpoint_api.py`` is the exception: it mirrors NVIDIA's cuda-checkpoint and must stay one
file without imports from this project, so it keeps its own (0 done, 1 refused, 2 bad arguments,
3 no usable driver). Stdlib only: this runs on the node.
"""

from __future__ import annotations

__all__ = ["BAD_INPUT", "BUSY", "DIED", "FAILED_REQUESTS", "OK", "REFUSED", "TIMEOUT"]

OK = 0
BAD_INPUT = 2
DIED = 3
TIMEOUT = 4
FAILED_REQUESTS = 6
BUSY = 7
REFUSED = 8
