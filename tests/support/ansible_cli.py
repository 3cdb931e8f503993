"""ansible-playbook itself, asked what its -e, -i and -l give, so the runner's options can be
compared with the tool whose semantics they copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"

_DUMP_VARS = """\
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Write the extra vars the test asks about
      ansible.builtin.copy:
        dest: "{{ lookup('env', 'DUMP_TO') }}"
        content: "{{ dict(wanted | zip(wanted | map('extract', hostvars['localhost']))) | to_json }}"
      vars:
        wanted: "{{ lookup('env', 'DUMP_KEYS') | split(',') }}"
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "ANSIBLE_NOCOLOR": "1", **extra}


def extra_vars(items: list[str], keys: list[str], tmp: Path) -> dict[str, Any]:
    """The variables ``ansible-playbook -e ITEM ...`` sets, for ``keys``."""
    playbook = tmp / "dump_vars.yml"
    playbook.write_text(_DUMP_VARS)
    out = tmp / "vars.json"
    argv = [str(PLAYBOOK_BIN), "-i", "localhost,", "-c", "local", str(playbook)]
    for item in items:
        argv += ["-e", item]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=tmp,
                          env=_env(DUMP_TO=str(out), DUMP_KEYS=",".join(keys)))
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(out.read_text()))


def listed_hosts(play_hosts: str, inventories: list[str], limit: str | None, tmp: Path) -> list[str]:
    """The hosts ``ansible-playbook --list-hosts -i ... -l LIMIT`` gives a play of ``play_hosts``."""
    playbook = tmp / "list_hosts.yml"
    playbook.write_text(f"- hosts: {json.dumps(play_hosts)}\n  gather_facts: false\n  tasks: []\n")
    argv = [str(PLAYBOOK_BIN), "--list-hosts", str(playbook)]
    for inv in inventories:
        argv += ["-i", inv]
    if limit is not None:
        argv += ["-l", limit]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=tmp, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("hosts ("))
    return [line.strip() for line in lines[start + 1:] if line.strip()]


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Leaves by dotted path, as the runner applies a mapping of overrides."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out
