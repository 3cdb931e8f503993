"""Every role's ``meta/argument_specs.yml`` agrees with its ``defaults/main.yml`` (docs match code).

For each role: every default is documented in some entry point's spec, every optional spec option
has a default equal to the spec's ``default``, required options have no default (no fake value),
and every variable carries the role's prefix. The storage roles' READMEs are checked too (sections,
every public variable); other roles join ``README_CHECKED`` once they have one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))
README_CHECKED = ("raid0_xfs", "cache_volumes", "fio")


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


def test_the_storage_roles_are_checked() -> None:
    assert {r.name for r in ROLES} >= {"raid0_xfs", "cache_volumes", "fio"}
    # Every role has a spec: a role without one is not in ROLES at all.
    assert {r.name for r in ROLES} == {p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir()}


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


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_no_meta_dependencies(role: Path) -> None:
    meta = _load(role / "meta" / "main.yml") or {}
    assert meta.get("dependencies", []) == [], f"{role.name}: ordering belongs to playbooks, not meta dependencies"
