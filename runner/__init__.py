"""Campaign runner: GPU-node startup, snapshot and KV-offload experiments driven through Ansible."""

__version__ = "0.1.0"
