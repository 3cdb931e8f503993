"""The node side of one offload trial, one job per module (``python -m nodetools.offload_run`` is
their command line):

- ``layout``: where each engine copy's files live, and the GPUs each copy gets;
- ``preflight``: whether the node can take the trial (RAM per NUMA node, /dev/shm, the
  file-system tier, the context), from the ``node_facts`` facts;
- ``leftovers``: stale offload buffers and leftover engine containers, found and removed;
- ``run``: start the copies, load, snapshot ``/metrics``, quality check, stop;
- ``lmcache_gate``: whether LMCache ran its CUDA extension or fell back to torch ops (a run refuses
  the fallback unless the mode allows it);
- ``cleanup``: after the trial, stop what a killed run left and remove the trial's files.

Stdlib and aiohttp only: this runs on the node.
"""
