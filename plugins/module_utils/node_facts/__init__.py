# Copyright (c) the project contributors
# SPDX-License-Identifier: MIT
"""What the ``node_facts`` module reads about a node, one concern per module.

The module (plugins/modules/node_facts.py) imports these as ``ansible.module_utils.node_facts.*``
(ansible.cfg's ``module_utils`` path), and Ansible ships them to the node with it. They run on the
node's system Python: standard library only, and nothing newer than Python 3.8 at run time.
"""
