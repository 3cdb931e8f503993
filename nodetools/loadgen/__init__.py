"""Node-side load generation for the offload experiment: a multi-turn chat load and a quality check.

Runs next to the server (so TTFT is not network-bound) with only the standard library and
aiohttp, which a role installs on the node:

- ``text``: deterministic, seeded English-like text per session (never one repeated token);
- ``client``: one streaming chat request, timed to its first content token, with its ``usage``;
- ``sizing``: texts sized in tokens with the server's ``/tokenize``;
- ``workload``: the load's and the quality check's shapes, defaults and context arithmetic (stdlib
  only: the runner takes its campaign defaults from them);
- ``multiturn``: N sessions, K in flight, T turns behind a barrier, one JSONL record per request;
- ``quality``: multi-turn arithmetic over a shared document, answers checked, loops detected.

``python -m nodetools.loadgen {run|quality} --help`` is the command line.
"""
