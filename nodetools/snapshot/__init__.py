"""Node-side snapshot measurements: restore a started engine instead of starting it.

    python -m nodetools.snapshot gates --mode MODE [--criu criu] [--libdir DIR] [--cuda-checkpoint BIN]
        [--gpus 0] [--tp 1] [--images DIR] [--model M] [--revision R] [--launch-json JSON]
        [--network-lock auto|iptables|nftables|skip] [--criu-flags JSON] [--lazy-pages] [--keep-io-uring]
        [--quiesce none|sleep|sleep2] [--stage-dir DIR]
    python -m nodetools.snapshot measure --mode MODE --launch launch.json --log server.log --out timings.json
        --images DIR [the same mode options] [--restore-cache dropped,warm] [--answers 3] [--poll-s 0.05]
        [--timeout-s 1800] [--trial ID] [--lease-dir DIR] [--lock-dir DIR]

One module per job:

- ``gates``: every precondition of a mode, as reasons a user can act on;
- ``lock``: one snapshot operation per node at a time (they share /dev/shm);
- ``criu_node``: what the node's CRIU can do; the flags, network lock and io_uring settings that a
  live vLLM engine needs (``io_uring``: the sysctl for the engine's life, put back even when the
  tool is killed, through its lease and ``nodetools.reap``);
- ``criu_mode``, ``cuda_checkpoint_mode``, ``vllm_snapshot_mode``: the three modes, over
  ``engine_run`` (start, first token, answers, stop); ``quiesce`` (sleep before the snapshot, wake
  after the restore); ``images`` (the images folder, its filesystem, its page-cache state, the
  staging into RAM); ``written_files`` (files the engine writes, put back to their dumped size);
  ``cuda_tool`` (which cuda-checkpoint acts);
- ``cli``: the two command lines.

Stdlib only: this runs on the node.
"""
