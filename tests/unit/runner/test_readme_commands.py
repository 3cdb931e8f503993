"""Every ``python -m runner`` / ``gpu-campaign`` command README.md shows runs as shown: each is
taken from the README's code blocks, its placeholders given real files (a results folder the test
makes, a copy of the sample inventory), and run with ``--plan`` where it would start a campaign,
so no host is touched."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from runner.cli import main

REPO = Path(__file__).resolve().parents[3]
_TRIAL = {"id": "overhead.noop.r1@localhost", "host": "localhost", "experiment": "overhead", "kind": "selftest",
          "mode": "noop", "repeat": 1, "params": {}, "engine": None, "timeout_s": 60}


def readme_commands() -> list[list[str]]:
    """The argument lists after ``python -m runner`` (or ``gpu-campaign``) in README's code blocks."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.M | re.S)
    out = []
    for line in (line for block in blocks for line in block.splitlines()):
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word == "gpu-campaign" or (word == "-m" and i + 1 < len(words) and words[i + 1] == "runner"):
                start = i + 1 if word == "gpu-campaign" else i + 2
                end = next((j for j in range(start, len(words)) if words[j] in ("&&", "||", ";", "|")), len(words))
                out.append(words[start:end])
                break
    return out


@pytest.fixture
def placeholders(tmp_path: Path) -> dict[str, str]:
    """Real files for the names the README uses as examples."""
    results = tmp_path / "results" / "readme"
    (results / "trials" / _TRIAL["id"]).mkdir(parents=True)
    (results / "plan.json").write_text(json.dumps({"campaign": "readme", "trials": [_TRIAL]}))
    (results / "trials" / _TRIAL["id"] / "trial.json").write_text(json.dumps(
        {**_TRIAL, "status": "ok", "reason": "", "duration_s": 2.5, "metrics": {}}))
    shutil.copytree(REPO / "inventory/sample", tmp_path / "site")
    (tmp_path / "overrides.yml").write_text("engine:\n  args: {max-model-len: 16384}\n")
    return {"CAMPAIGN.yaml": str(REPO / "campaigns/local.yaml"), "campaign.yaml": str(REPO / "campaigns/local.yaml"),
            "results/<name>": str(results), "inventory/site": str(tmp_path / "site"),
            "@overrides.yml": f"@{tmp_path / 'overrides.yml'}",
            "server.log": str(REPO / "tests/fixtures/vllm_logs/real/vllm-0.24.0-h200-first_start.log")}


def test_the_readme_shows_the_commands_this_test_knows() -> None:
    commands = readme_commands()
    assert len(commands) >= 10
    assert ["CAMPAIGN.yaml", "--plan"] in commands and ["--version"] in commands


@pytest.mark.parametrize("argv", readme_commands(), ids=" ".join)
def test_every_readme_command_runs(argv: list[str], placeholders: dict[str, str],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    args = [placeholders.get(a, str(REPO / a) if a.startswith("campaigns/") else a) for a in argv]
    for arg in args:  # every file the command names is a real one here
        if arg.endswith((".yaml", ".yml", ".log")) or "/" in arg:
            assert Path(arg.lstrip("@")).exists(), f"README names {arg}: give it a placeholder"
    if args[0] == "--version":
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0
        return
    if args[0] not in ("report", "parse-log") and "--plan" not in args:
        args.append("--plan")
    code = main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err and captured.out
