"""Every role's ``meta/argument_specs.yml`` agrees with its ``defaults/main.yml`` (docs match code).

For each role: every default is documented in some entry point's spec, every optional spec option
has a default equal to the spec's ``default``, required options have no default (no fake value),
and every variable carries the role's prefix. Every role's README is checked too: its sections, every
public variable mentioned, and the defaults it shows (a variables table between the
``BEGIN_ROLE_VARIABLES``/``END_ROLE_VARIABLES`` markers, or ``name: value`` lines in its "Role
variables" YAML blocks) equal to the spec's.

Where inputs are checked: a role's input checks are all in its ``tasks/validate.yml`` (run first by
the role, and by ``playbooks/provision/preflight.yml`` for every role the provision playbooks use);
an assert elsewhere in ``tasks/`` must test what a host reported, and preflight.yml holds no copy of
a role's checks, defaults or versions.
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


# --- Where inputs are checked ------------------------------------------------------------------
# Every check of a role's inputs is in roles/<role>/tasks/validate.yml, which tasks/main.yml imports
# first and playbooks/provision/preflight.yml runs (include_role, tasks_from: validate). An assert
# elsewhere in tasks/ must test something the run found on a host (a registered result, a fact, or
# a value derived from one): one that tests inputs alone belongs in validate.yml.

CHECKS = {"ansible.builtin.assert", "assert", "ansible.builtin.fail", "fail"}
PREFLIGHT = REPO / "playbooks" / "provision" / "preflight.yml"
VALIDATED = tuple(r.name for r in ROLES)  # every role has its tasks/validate.yml (test below)
_NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def _walk(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Every task and block of a task list, blocks' children included."""
    out: list[dict[str, Any]] = []
    for item in items or []:
        out.append(item)
        for key in ("block", "rescue", "always"):
            out.extend(_walk(item.get(key)))
    return out


def _module(task: dict[str, Any]) -> str | None:
    return next((key for key in task if key in CHECKS), None)


def _conditions(task: dict[str, Any]) -> str:
    """What a check tests: its conditions, and the loop its item comes from."""
    module = _module(task)
    value = task[module].get("that") if module in ("ansible.builtin.assert", "assert") else task.get("when")
    loop = task.get("loop") if isinstance(task.get("loop"), str) else ""
    return " ".join([*(value if isinstance(value, list) else [str(value or "")]), loop])


def _task_files(role: Path) -> dict[str, list[dict[str, Any]]]:
    return {p.name: _walk(_load(p)) for p in sorted((role / "tasks").glob("*.yml"))}


def _found_on_hosts(role: Path) -> set[str]:
    """Names whose value comes from a host: registered results, set_fact, facts, and what derives from them."""
    files = _task_files(role)
    found = {"ansible_facts"}
    derived: dict[str, str] = {k: json.dumps(v) for k, v in (_load(role / "vars" / "main.yml") or {}).items()}
    for tasks in files.values():
        for task in tasks:
            if task.get("register"):
                found.add(task["register"])
            found.update((task.get("ansible.builtin.set_fact") or task.get("set_fact") or {}).keys())
            derived.update({k: json.dumps(v) for k, v in (task.get("vars") or {}).items()})
    while True:
        more = {name for name, value in derived.items() if name not in found and found & set(_NAME.findall(value))}
        if not more:
            return found
        found |= more


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_input_checks_live_only_in_validate_yml(role: Path) -> None:
    found = _found_on_hosts(role)
    misplaced = [f"tasks/{name}: {task.get('name')}"
                 for name, tasks in _task_files(role).items() if name != "validate.yml"
                 for task in tasks if _module(task) and not found & set(_NAME.findall(_conditions(task)))]
    assert not misplaced, f"{role.name}: checks of inputs alone belong in tasks/validate.yml: {misplaced}"


@pytest.mark.parametrize("role", VALIDATED, ids=str)
def test_every_role_checks_its_inputs_in_validate_yml(role: str) -> None:
    assert (REPO / "roles" / role / "tasks" / "validate.yml").is_file(), f"{role}: no tasks/validate.yml"


@pytest.mark.parametrize("role", VALIDATED, ids=str)
def test_validate_yml_is_run_first_and_says_what_is_wrong(role: str) -> None:
    path = REPO / "roles" / role
    first = (_load(path / "tasks" / "main.yml") or [{}])[0]
    include = first.get("ansible.builtin.import_tasks") or first.get("ansible.builtin.include_tasks")
    assert include in ("validate.yml", {"file": "validate.yml"}), f"{role}: tasks/main.yml must start with validate.yml"
    assert {"validate", "always"} <= set(first.get("tags") or []), f"{role}: tag the import [validate, always]"
    options = set(_options(path))
    tasks = _task_files(path)["validate.yml"]
    assert any(_module(t) for t in tasks), f"{role}: tasks/validate.yml checks nothing"
    for task in tasks:
        module = _module(task)
        if not module:
            # Nothing in validate.yml contacts the node: preflight runs it before any host changes.
            assert task.get("delegate_to") == "localhost", f"{role}: {task.get('name')} must run on the controller"
            continue
        args = task[module]
        assert args.get("quiet") is True, f"{role}: {task.get('name')}: quiet: true"
        message = str(args.get("fail_msg") or args.get("msg") or "")
        assert message.startswith(f"{role}: "), f"{role}: {task.get('name')}: the message starts with '{role}: '"
        # What the message says, not what it computes: a {{ expression }} counts only for its quoted text.
        said = re.sub(r"{{(.*?)}}", lambda m: " ".join(re.findall(r"'([^']*)'", m.group(1))), message)
        named = sorted(n for n in options & set(_NAME.findall(_conditions(task))) if not re.search(rf"\b{n}\b", said))
        assert not named, f"{role}: {task.get('name')}: the message does not name {named}"
        loop_var = (task.get("loop_control") or {}).get("loop_var")
        if loop_var:
            assert loop_var in message, f"{role}: {task.get('name')}: the message does not name the item ({loop_var})"


def _preflight_includes() -> dict[str, dict[str, Any]]:
    includes: dict[str, dict[str, Any]] = {}
    for play in _load(PREFLIGHT):
        for task in _walk(play.get("tasks")):
            args = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
            if args:
                assert args["name"] not in includes, f"preflight.yml runs {args['name']} twice"
                includes[args["name"]] = {**args, "tags": set(task.get("tags") or [])}
    return includes


def _provision_roles() -> dict[str, set[str]]:
    """Role -> its tags, for every role the playbooks site.yml imports apply."""
    roles: dict[str, set[str]] = {}
    for playbook in sorted((REPO / "playbooks" / "provision").glob("*.yml")):
        for play in _load(playbook):
            for entry in play.get("roles") or []:
                roles[entry["role"]] = set(entry.get("tags") or [])
    site = {p.get("ansible.builtin.import_playbook") for p in _load(REPO / "site.yml")}
    provision = {f"playbooks/provision/{p.name}" for p in (REPO / "playbooks" / "provision").glob("*.yml")}
    assert provision == site, f"site.yml imports {sorted(site)}, not the provision playbooks {sorted(provision)}"
    return roles


def test_preflight_runs_every_used_roles_validate_yml_and_no_copies() -> None:
    used = _provision_roles()
    includes = _preflight_includes()
    wanted = {r for r in used if r in VALIDATED}
    assert set(includes) == wanted, f"preflight.yml must run validate.yml of {sorted(wanted)}, runs {sorted(includes)}"
    for role, args in includes.items():
        assert args.get("tasks_from") == "validate", f"preflight.yml: {role} without tasks_from: validate"
        assert "always" in (args.get("apply") or {}).get("tags", []), f"preflight.yml: {role}: apply tags [always]"
        missing = sorted(used[role] - args["tags"])
        assert not missing, f"preflight.yml: {role}'s check lacks the role's tags {missing}"
    # Its own checks are the controller's: none of them tests a role's variable.
    text = PREFLIGHT.read_text()
    prefixes = tuple(f"{r.name}_" for r in ROLES)
    for play in _load(PREFLIGHT):
        for task in _walk(play.get("tasks")):
            if _module(task):
                names = [n for n in _NAME.findall(_conditions(task)) if n.startswith(prefixes)]
                assert not names, f"preflight.yml checks {names} itself: that belongs in the role's tasks/validate.yml"
    assert "defaults/main.yml" not in text and not re.search(r"lookup\(\s*'(ansible\.builtin\.)?file'", text), (
        "preflight.yml reads a role's defaults by file: include_role (tasks_from: validate) loads them")


def test_preflight_ansible_core_bounds_hold_the_pinned_release() -> None:
    play = _load(PREFLIGHT)[0]
    low, below = (tuple(int(n) for n in str(play["vars"][k]).split(".")) for k in
                  ("preflight_ansible_core_min", "preflight_ansible_core_below"))
    pin = re.search(r'"ansible-core==([\d.]+)"', (REPO / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins no ansible-core release"
    assert low <= tuple(int(n) for n in pin.group(1).split("."))[:2] < below, (pin.group(1), low, below)
    assert "version('2." not in PREFLIGHT.read_text(), "preflight.yml writes an ansible-core bound as a literal"


def test_preflight_has_no_version_literals() -> None:
    # The controller's own ansible-core gate is not a role input; every other version is a role's default.
    lines = [line for line in PREFLIGHT.read_text().splitlines()
             if "ansible_version" not in line and "ansible-core" not in line and "preflight_ansible_core" not in line]
    literal = re.compile(r"(?<![\w.])\d+(?:\.\d+)+(?![\w.])|\b\d{3,}\b")  # 4.2.1, 580.159.04, 1.17.8, 580
    found = sorted({m.group(0) for line in lines for m in literal.finditer(line)})
    assert not found, f"preflight.yml holds version literals {found}: read them from the roles' defaults"


@pytest.mark.parametrize("role", VALIDATED, ids=str)
def test_readme_says_where_inputs_are_checked(role: str) -> None:
    assert "tasks/validate.yml" in (REPO / "roles" / role / "README.md").read_text(), (
        f"{role}/README.md does not say that its input checks are in tasks/validate.yml")
