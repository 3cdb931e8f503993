"""Node-side programs installed on the GPU node: the engine stand-in, timers and load generators.

Kept apart from ``runner`` so the node needs only their few dependencies, not pandas or Ansible.
"""
