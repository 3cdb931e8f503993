# SPDX-License-Identifier: MIT
"""The plugins' tests import module_utils by the name Ansible gives them.

ansible.cfg's ``module_utils = plugins/module_utils`` makes Ansible resolve
``ansible.module_utils.node_facts.*`` there; extending the package's search path the same way lets the
tests import exactly the code that Ansible ships to a node, as plain Python.
"""

from __future__ import annotations

from pathlib import Path

import ansible.module_utils

MODULE_UTILS = Path(__file__).resolve().parents[3] / "plugins" / "module_utils"

if str(MODULE_UTILS) not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(MODULE_UTILS))
