"""The sample inventory (inventory/sample) against the preflight play and the role specs: what a site
copies must pass preflight once the site's own files are in place, and fail it, with the reason,
while they are missing. Runs the real ``ansible-playbook`` on a copy of the sample (no host is
contacted: preflight's checks are controller-side)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "inventory" / "sample"
PLAYBOOK = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or "ansible-playbook"


def preflight(inventory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([PLAYBOOK, "-i", str(inventory), str(REPO / "site.yml"), "--tags", "preflight", *extra],
                          capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=240)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    inventory = tmp_path / "site"
    shutil.copytree(SAMPLE, inventory)
    return inventory


def test_preflight_stops_the_sample_until_the_site_carries_cuda_checkpoint(site: Path) -> None:
    missing = preflight(site)
    assert missing.returncode != 0
    assert f"{site}/files/cuda-checkpoint does not exist on the controller" in missing.stdout
    (site / "files").mkdir()
    (site / "files" / "cuda-checkpoint").write_bytes(b"the site's cuda-checkpoint\n")
    ready = preflight(site)
    assert ready.returncode == 0, ready.stdout[-3000:]
    # No CRIU variable in the sample: the criu role's default release, URL and checksum are its source.
    assert re.search(r"h200-01\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", ready.stdout)


PINS = "CRIU (>= 4.1) and cuda-checkpoint each need"


@pytest.mark.parametrize(("extra", "reason"), [
    ({"criu_source_checksum": "sha256:29ec0ee0"}, PINS),                  # truncated
    ({"criu_source_url": "", "criu_source_path": ""}, PINS),              # no source at all
    ({"criu_version": "3.17.1"}, PINS),                                   # Debian 12's, too old
    ({"cuda_checkpoint_source_checksum": "sha256:<its sha256>"}, PINS),   # the sample's placeholder, uncommented
    ({"nvidia_driver_reboot_enabled": "false"}, 'nvidia_driver_reboot_enabled is "false"'),
])
def test_preflight_refuses_a_broken_sample(site: Path, extra: dict[str, str], reason: str) -> None:
    (site / "files").mkdir()
    (site / "files" / "cuda-checkpoint").write_bytes(b"x\n")
    out = preflight(site, "--extra-vars", yaml.safe_dump(extra, default_flow_style=True).strip())
    assert out.returncode != 0
    assert re.search(r"h200-01\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=1", out.stdout), out.stdout[-2000:]
    assert reason in " ".join(out.stdout.split()), out.stdout[-2000:]


def _role_options() -> dict[str, set[str]]:
    options: dict[str, set[str]] = {}
    for spec in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        entries = yaml.safe_load(spec.read_text())["argument_specs"].values()
        options[spec.parent.parent.name] = {name for entry in entries for name in (entry.get("options") or {})}
    return options


def test_every_role_variable_of_the_sample_is_a_role_option() -> None:
    options = _role_options()
    names = set(yaml.safe_load((SAMPLE / "group_vars" / "h200.yml").read_text()))
    for host_vars in (SAMPLE / "host_vars").glob("*.yml"):
        names |= set(yaml.safe_load(host_vars.read_text()))
    unknown = []
    for name in sorted(names - {"ansible_user", "ansible_become", "ansible_python_interpreter"}):
        role = next((r for r in sorted(options, key=len, reverse=True) if name.startswith(f"{r}_")), None)
        if role is None or name not in options[role]:
            unknown.append(name)
    assert not unknown, f"not an option of any role's meta/argument_specs.yml: {unknown}"


def test_the_sample_carries_what_docs_say_a_site_sets() -> None:
    doc = (REPO / "docs" / "gpu-stack.md").read_text()
    section = doc.split("## What a site sets", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    sample = (SAMPLE / "group_vars" / "h200.yml").read_text().splitlines()
    missing = [line for line in block.splitlines() if line.strip() and line not in sample]
    assert not missing, f"inventory/sample/group_vars/h200.yml lacks these lines of docs/gpu-stack.md: {missing}"
