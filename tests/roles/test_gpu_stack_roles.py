"""Unit tests of the GPU-stack roles' static parts: argument specs against defaults, the mock
nvidia-smi against the captured H200 outputs, the controller-side wheel build, and pins that must
agree with pyproject.toml. The roles themselves are tested by their molecule scenarios."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = ["nvidia_driver", "docker", "nvidia_container_toolkit", "cuda_checkpoint", "criu", "vllm_images",
         "bench_client"]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia_smi"
MOCK_SMI = FIXTURES / "mock-nvidia-smi"
REAL_H200_LINE = "NVIDIA H200, 580.159.04, 143771 MiB, 0 MiB, 00000000:00:06.0, 9.0"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_agree_with_defaults(role: str) -> None:
    defaults = load(REPO / "roles" / role / "defaults" / "main.yml")
    options = load(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert all(key.startswith(f"{role}_") for key in [*defaults, *options])
    assert set(defaults) == {k for k, v in options.items() if not v.get("required")}
    for key, value in defaults.items():
        assert options[key].get("default") == value, key
        assert options[key].get("description"), key


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_a_readme_and_a_molecule_scenario(role: str) -> None:
    readme = (REPO / "roles" / role / "README.md").read_text()
    for section in ("## Purpose", "## Role variables", "## Example playbook", "## Testing"):
        assert section in readme, (role, section)
    for option in load(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]:
        assert f"`{option}`" in readme, (role, option)
    scenario = REPO / "roles" / role / "molecule" / "default"
    assert (scenario / "molecule.yml").is_file() and (scenario / "verify.yml").is_file()


def mock_smi(tmp_path: Path, fixture: str | None, *args: str, persistence: str | None = None,
             fabric_manager: bool = False) -> subprocess.CompletedProcess[str]:
    selected = tmp_path / "fixture"
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    if fixture:
        selected.write_text(fixture + "\n")
    if persistence:
        (state / "persistence-mode").write_text(persistence + "\n")
    if fabric_manager:
        (state / "fabricmanager").write_text("-c cfg\n")
    env = {**os.environ, "MOCK_NVIDIA_SMI_DIR": str(FIXTURES), "MOCK_NVIDIA_SMI_SELECTED": str(selected),
           "MOCK_NVIDIA_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, str(MOCK_SMI), *args], capture_output=True, text=True, env=env, check=False)


def test_mock_answers_the_captured_h200_line(tmp_path: Path) -> None:
    fields = "name,driver_version,memory.total,memory.used,pci.bus_id,compute_cap"
    out = mock_smi(tmp_path, "h200-1gpu", f"--query-gpu={fields}", "--format=csv,noheader")
    assert out.returncode == 0
    assert out.stdout.strip() == REAL_H200_LINE


def test_mock_fails_like_nvidia_smi_without_a_driver(tmp_path: Path) -> None:
    out = mock_smi(tmp_path, None, "--query-gpu=driver_version", "--format=csv,noheader")
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout


def test_mock_reports_host_state_for_persistence_and_fabric(tmp_path: Path) -> None:
    query = ("--query-gpu=driver_version,persistence_mode,fabric.state,fabric.status", "--format=csv,noheader")
    down = mock_smi(tmp_path, "hgx-h200-8gpu", *query)
    assert down.stdout.splitlines() == ["580.159.04, Disabled, In Progress, N/A"] * 8
    up = mock_smi(tmp_path, "hgx-h200-8gpu", *query, persistence="Enabled", fabric_manager=True)
    assert up.stdout.splitlines() == ["580.159.04, Enabled, Completed, Success"] * 8
    no_fabric = mock_smi(tmp_path, "h200-1gpu", *query, persistence="Enabled", fabric_manager=True)
    assert no_fabric.stdout.splitlines() == ["580.159.04, Enabled, N/A, N/A"]


def test_mock_refuses_an_unknown_field(tmp_path: Path) -> None:
    out = mock_smi(tmp_path, "h200-1gpu", "--query-gpu=clocks.nonsense", "--format=csv")
    assert out.returncode == 2
    assert 'Field "clocks.nonsense" is not a valid field to query.' in out.stdout


def test_written_fixtures_say_so() -> None:
    for fixture in FIXTURES.iterdir():
        if fixture.is_dir():
            provenance = load(fixture / "fixture.json")["provenance"]
            assert provenance.startswith(("CAPTURED", "WRITTEN")), fixture.name


def test_nodetools_wheel_is_reproducible_and_versioned_by_its_sources(tmp_path: Path) -> None:
    script = REPO / "roles" / "bench_client" / "files" / "build_wheel.py"

    def build(out: Path) -> tuple[Path, str]:
        run = subprocess.run([sys.executable, str(script), "--project", str(REPO), "--out", str(out),
                              "--requires=aiohttp==3.14.5"], capture_output=True, text=True, check=True)
        wheel = Path(yaml.safe_load(run.stdout)["wheel"])
        return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()

    first, first_hash = build(tmp_path / "a")
    second, second_hash = build(tmp_path / "b")
    assert first.name == second.name and first_hash == second_hash
    assert re.match(r"gpu_campaign_nodetools-\d+\.\d+\.\d+\+g[0-9a-f]{12}-py3-none-any\.whl$", first.name)


def test_node_requirements_follow_pyproject() -> None:
    pins = set(re.findall(r'"(aiohttp==[^"]+)"', (REPO / "pyproject.toml").read_text()))
    defaults = load(REPO / "roles" / "bench_client" / "defaults" / "main.yml")
    assert set(defaults["bench_client_requirements"]) == pins
