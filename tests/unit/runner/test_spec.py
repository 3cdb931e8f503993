"""Campaign validation: every error is one line naming file, line and key path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.spec import load_campaign

GOOD = """\
name: demo
inventory: inventory
experiments:
  - kind: facts
  - kind: selftest
    modes:
      sleep: {seconds: 1.5}
      noop:
    repeats: 2
"""


def errors_of(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    return info.value.lines


def test_valid_campaign_loads_with_hosts_and_mode_params(write_campaign: Callable[[str], Path]) -> None:
    loaded = load_campaign(write_campaign(GOOD))
    assert loaded.hosts == ("localhost",)
    assert loaded.modes[0] == {"default": {}}
    assert loaded.modes[1]["sleep"] == {"seconds": 1.5, "interval_s": 0.5}
    assert list(loaded.modes[1]) == ["sleep", "noop"]


def test_unknown_key_names_line_and_path(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("    repeats: 2\n", "    repeats: 2\n    repeets: 3\n"))
    assert errors_of(path) == [f"{path}:10: experiments[1].repeets: unknown key: did you mean 'repeats'?"]


def test_mode_parameter_bound_names_the_mode(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("seconds: 1.5", "seconds: -1"))
    assert errors_of(path) == [f"{path}:7: experiments[1].modes.sleep.seconds: must be > 0"]


def test_unknown_mode_lists_the_known_ones(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("      noop:\n", "      nope:\n"))
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:8: experiments[1].modes.nope: unknown mode for kind selftest (known: ")
    assert "noop" in line


def test_unknown_kind(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("kind: facts", "kind: fax"))
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:4: experiments[0].kind: unknown experiment kind 'fax' (known: ")


def test_wrong_type_and_missing_key_reported_together(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("name: demo\n", "").replace("repeats: 2", "repeats: many"))
    lines = errors_of(path)
    assert f"{path}:1: name: required key is missing" in lines
    assert any(x.startswith(f"{path}:8: experiments[1].repeats: ") and "integer" in x for x in lines)


def test_missing_inventory(write_campaign: Callable[[str], Path], tmp_path: Path) -> None:
    path = write_campaign(GOOD.replace("inventory: inventory", "inventory: nowhere"))
    assert errors_of(path) == [f"{path}:2: inventory: inventory {tmp_path / 'nowhere'} does not exist"]


def test_host_pattern_matching_nothing(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("inventory: inventory\n", "inventory: inventory\nhosts: h200\n"))
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3: hosts: host pattern 'h200' matches no host in ")


def test_docker_engine_needs_an_image(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD + "engine:\n  kind: vllm\n  runtime: docker\n  model: /m\n")
    assert errors_of(path) == [f"{path}:10: engine: runtime docker needs engine.image"]


def test_engine_python_and_rehearsal_model_are_checked(write_campaign: Callable[[str], Path]) -> None:
    both = write_campaign(GOOD + "engine:\n  kind: vllm\n  model: /m\n  venv: /v\n  python: /p/python3\n")
    assert errors_of(both) == [f"{both}:10: engine: engine.venv and engine.python both name vLLM's Python: keep one"]
    standin = write_campaign(GOOD + "engine:\n  kind: stand-in\n  model: /m\n  rehearsal_model: qwen3-0.8b\n")
    assert errors_of(standin) == [
        f"{standin}:10: engine: engine.rehearsal_model is for kind vllm (the stand-in makes its own model)"]


def test_duplicate_experiment_names(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD + "  - kind: facts\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:10: experiments[2].name: experiment name 'facts' is used twice")


def test_not_yaml_and_not_a_mapping(write_campaign: Callable[[str], Path]) -> None:
    bad = write_campaign("name: [unclosed\n", "bad.yaml")
    (line,) = errors_of(bad)
    assert line.startswith(f"{bad}:2: not valid YAML")
    assert errors_of(write_campaign("- a\n- b\n", "list.yaml")) == [
        f"{write_campaign('- a', 'list.yaml')}:1: a campaign must be a YAML mapping"]


def test_unreadable_file(tmp_path: Path) -> None:
    (line,) = errors_of(tmp_path / "absent.yaml")
    assert line == f"{tmp_path / 'absent.yaml'}:1: cannot read: No such file or directory"
