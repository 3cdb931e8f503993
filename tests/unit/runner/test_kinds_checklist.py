"""docs/architecture.md's "add a kind" checklist, checked for every registered kind: its doc page, its
row in docs/campaign.md's kinds table, a local campaign that rehearses it, its schema entry, and
playbooks that read only the exp_* variables the runner passes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from runner.campaign import _extravars
from runner.experiments import KINDS
from runner.plan import expand
from runner.secrets import Secrets
from runner.spec import load_campaign

REPO = Path(__file__).resolve().parents[3]
_EXP_VAR = re.compile(r"\bexp_[a-z0-9_]+\b")
_INCLUDES = ("include_tasks", "import_tasks", "ansible.builtin.include_tasks", "ansible.builtin.import_tasks")
# A task-file include (`include_tasks: ../tasks/x.yml`) or a vars_files item (`- ../vars/engine.yml`).
_INCLUDED = re.compile(r"\s*(?:-\s*)?(?:(?:" + "|".join(map(re.escape, _INCLUDES)) + r"):\s*|-\s+)(\S+\.ya?ml)\s*$")


def _passed_variables() -> set[str]:
    """The extra vars a trial's playbook gets from the runner (runner/campaign.py)."""
    loaded = load_campaign(REPO / "campaigns/local.yaml")
    trial = expand(loaded).trials[0]
    ctx = SimpleNamespace(loaded=loaded, secrets=Secrets())
    return set(_extravars(ctx, trial, Path("/tmp/trial")))  # type: ignore[arg-type]


def _files_of(playbook: Path) -> set[Path]:
    """The playbook and every vars file and task file it pulls in, recursively."""
    seen: set[Path] = set()
    todo = [playbook]
    while todo:
        path = todo.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        for line in path.read_text().splitlines():
            found = _INCLUDED.match(line)
            if found and not found.group(1).startswith("{{"):
                todo.append(path.parent / found.group(1))
    return seen


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_has_its_doc_page_table_row_local_campaign_and_schema_entry(name: str) -> None:
    kind = KINDS[name]
    doc = REPO / kind.doc
    assert kind.doc.startswith("docs/") and doc.is_file(), f"{name}: no doc page {kind.doc}"
    assert re.search(rf"`(kind: )?{name}`", doc.read_text()), f"{name}: {kind.doc} never names the kind"
    assert re.search(rf"^\| `{name}` \|", (REPO / "docs/campaign.md").read_text(), re.M), \
        f"{name}: no row in docs/campaign.md's kinds table"
    local = [p.name for p in sorted((REPO / "campaigns").glob("*local*.yaml"))
             if any(e.get("kind") == name for e in yaml.safe_load(p.read_text())["experiments"])]
    assert local, f"{name}: no campaigns/*local*.yaml rehearses it"
    schema = json.loads((REPO / "schema/campaign.schema.json").read_text())
    forms = schema["$defs"].get(f"Modes_{name}", {}).get("anyOf", [])  # a list of names, or a mapping
    modes = set().union(*(form.get("properties", {}) for form in forms), *(form.get("items", {}).get("enum", [])
                                                                          for form in forms))
    assert set(kind.modes) <= set(modes), f"{name}: schema/campaign.schema.json lacks {set(kind.modes) - set(modes)}"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kinds_playbooks_read_only_what_the_runner_passes(name: str) -> None:
    passed = _passed_variables()
    for phase in KINDS[name].phases:
        for path in _files_of(REPO / phase.playbook):
            unknown = set(_EXP_VAR.findall(path.read_text())) - passed
            assert not unknown, f"{name}: {path.relative_to(REPO)} reads {sorted(unknown)}: the runner never passes it"


def test_the_checklist_finds_a_variable_the_runner_does_not_pass(tmp_path: Path) -> None:
    # The check above must be able to fail: a task file that reads an unknown exp_ variable.
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks/t.yml").write_text('- ansible.builtin.debug:\n    msg: "{{ exp_nowhere }}"\n')
    (tmp_path / "p.yml").write_text("- hosts: all\n  tasks:\n    - ansible.builtin.include_tasks: tasks/t.yml\n")
    found = set().union(*(_EXP_VAR.findall(p.read_text()) for p in _files_of(tmp_path / "p.yml")))
    assert "exp_nowhere" in found - _passed_variables()


def test_experiment_playbooks_compute_no_values_in_jinja() -> None:
    """Every value a node program takes is planned in Python (runner/experiments/node_plan.py): no
    inline if/else and no default() over the runner's variables in the experiment playbooks. Task
    conditions (when:) on planned values, and defaults of a task file's own optional inputs, stay."""
    bad = []
    for path in sorted((REPO / "playbooks/experiments").rglob("*.yml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for expr in re.findall(r"\{\{(.*?)\}\}", line):
                if re.search(r"\bexp_\w+\s*\|\s*default\(", expr) or (
                        path.parent.name != "tasks" and re.search(r"\bif\b.*\belse\b", expr)):
                    bad.append(f"{path.relative_to(REPO)}:{number}: {expr.strip()}")
    assert not bad, "values computed in Jinja:\n" + "\n".join(bad)
