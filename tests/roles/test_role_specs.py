"""Every role's ``meta/argument_specs.yml`` agrees with its ``defaults/main.yml`` (docs match code).

For each role: every default is documented in some entry point's spec, every optional spec option
has a default equal to the spec's ``default``, required options have no default (no fake value),
and every variable carries the role's prefix. Every role's README is checked too: its sections, every
public variable mentioned, and the defaults it shows (a variables table between the
``BEGIN_ROLE_VARIABLES``/``END_ROLE_VARIABLES`` markers, or ``name: value`` lines in its "Role
variables" YAML blocks) equal to the spec's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))
# Every role with tasks has a README that these tests read (test_every_role_has_a_spec_and_a_checked_readme).
README_CHECKED = tuple(r.name for r in ROLES)


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _options(role: Path) -> dict[str, dict[str, Any]]:
    specs = _load(role / "meta" / "argument_specs.yml")["argument_specs"]
    out: dict[str, dict[str, Any]] = {}
    for entry in specs.values():
        for name, option in (entry.get("options") or {}).items():
            assert name not in out or out[name] == option, f"{role.name}: {name} differs between entry points"
            out[name] = option
    return out


def test_every_role_has_a_spec_and_a_checked_readme() -> None:
    assert {r.name for r in ROLES} >= {"raid0_xfs", "cache_volumes", "fio", "nvidia_driver", "docker",
                                       "nvidia_container_toolkit", "cuda_checkpoint", "criu", "vllm_images",
                                       "bench_client"}
    # Every role has a spec: a role without one is not in ROLES at all.
    assert {r.name for r in ROLES} == {p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir()}
    assert set(README_CHECKED) == {r.name for r in ROLES}


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_defaults_and_argument_specs_agree(role: Path) -> None:
    defaults = _load(role / "defaults" / "main.yml") or {}
    options = _options(role)
    undocumented = sorted(set(defaults) - set(options))
    assert not undocumented, f"{role.name}: defaults without a spec entry: {undocumented}"
    for name, option in options.items():
        if option.get("required"):
            assert name not in defaults, f"{role.name}: required {name} must not have a (fake) default"
            assert "default" not in option, f"{role.name}: required {name} has a default in the spec"
            continue
        assert name in defaults, f"{role.name}: optional {name} has no default in defaults/main.yml"
        assert "default" in option, f"{role.name}: optional {name} has no default in the spec"
        assert option["default"] == defaults[name], (
            f"{role.name}: {name}: spec default {option['default']!r} != defaults/main.yml {defaults[name]!r}")
        assert option.get("description"), f"{role.name}: {name} has no description"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_variables_carry_the_role_prefix(role: Path) -> None:
    names = set(_options(role)) | set(_load(role / "defaults" / "main.yml") or {})
    assert all(n.startswith(f"{role.name}_") for n in names), sorted(n for n in names if not n.startswith(role.name))
    internal = set(_load(role / "vars" / "main.yml") or {})
    assert all(n.startswith(f"__{role.name}_") for n in internal), sorted(internal)


@pytest.mark.parametrize("role", [REPO / "roles" / name for name in README_CHECKED], ids=lambda r: r.name)
def test_readme_documents_every_public_variable(role: Path) -> None:
    readme = (role / "README.md").read_text()
    missing = sorted(n for n in _options(role) if not re.search(rf"\b{n}\b", readme))
    assert not missing, f"{role.name}/README.md does not mention {missing}"
    for section in ("## Purpose", "## Role variables", "## Example playbook", "## Testing"):
        assert section in readme, f"{role.name}/README.md has no '{section}' section"


def _spec_type(option: dict[str, Any]) -> str:
    kind = option.get("type", "str")
    if kind == "list" and "elements" in option:
        kind = f"{kind} of {option['elements']}"
    return f"{kind} ({', '.join(map(str, option['choices']))})" if option.get("choices") else kind


def _readme_table(readme: str) -> dict[str, tuple[str, str]] | None:
    """The variables table between the markers: {name: (type, default cell without backticks)}."""
    match = re.search(r"<!-- BEGIN_ROLE_VARIABLES.*?-->\n(.*?)<!-- END_ROLE_VARIABLES -->", readme, re.S)
    if not match:
        return None
    rows: dict[str, tuple[str, str]] = {}
    for line in match.group(1).splitlines():
        cells = re.match(r"^\| `([a-z0-9_]+)` \| ([^|]+) \| (.*?) \| .* \|$", line)
        if cells:
            default = cells.group(3).strip()
            rows[cells.group(1)] = (cells.group(2).strip(), default[1:-1] if default.startswith("`") else default)
    return rows


def _readme_yaml_defaults(readme: str) -> dict[str, Any]:
    """``name: value`` lines of the YAML blocks in the "Role variables" section."""
    section = readme.split("## Role variables", 1)[1].split("\n## ", 1)[0]
    values: dict[str, Any] = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if re.match(r"^[a-z0-9_]+:", line):
                values.update(yaml.safe_load(line) or {})
    return values


@pytest.mark.parametrize("role", [REPO / "roles" / name for name in README_CHECKED], ids=lambda r: r.name)
def test_readme_shows_the_spec_defaults(role: Path) -> None:
    readme = (role / "README.md").read_text()
    options = _options(role)
    table = _readme_table(readme)
    if table is not None:
        assert set(table) == set(options), (
            f"{role.name}/README.md table: missing {sorted(set(options) - set(table))}, "
            f"not in the spec {sorted(set(table) - set(options))}")
        for name, (kind, default) in table.items():
            option = options[name]
            assert kind == _spec_type(option), f"{role.name}: {name}: README says {kind}, spec {_spec_type(option)}"
            if option.get("required"):
                assert "required" in default.lower() or default in ("", "—", "-"), f"{role.name}: {name}: {default}"
                continue
            assert json.loads(default) == option["default"], (
                f"{role.name}: {name}: README default {default} != spec {option['default']!r}")
        return
    shown = _readme_yaml_defaults(readme)
    assert shown, f"{role.name}/README.md shows no defaults (neither a variables table nor YAML lines)"
    for name, value in shown.items():
        assert name in options, f"{role.name}/README.md shows {name}, which the spec does not have"
        option = options[name]
        assert not option.get("required"), f"{role.name}/README.md shows a value for required {name}"
        assert value == option["default"], f"{role.name}: {name}: README shows {value!r}, spec {option['default']!r}"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_no_meta_dependencies(role: Path) -> None:
    meta = _load(role / "meta" / "main.yml") or {}
    assert meta.get("dependencies", []) == [], f"{role.name}: ordering belongs to playbooks, not meta dependencies"
