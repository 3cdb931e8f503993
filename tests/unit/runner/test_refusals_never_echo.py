"""A refusal names what is wrong and where, never the value of a secret-named key and never a
credential pasted into a key: engine flags whose name carries a credential are refused, from the
file or from -e, without repeating it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.cli import main

SECRET = "sk-live-" + "Zx81" * 8
HF = "hf_" + "Ab3" * 12
BASE = """\
name: demo
inventory: inventory
engine:
  model: /models/m
  args: {max-model-len: 4096}
experiments:
  - kind: selftest
    modes: [noop]
"""


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*argv, "--plan"]) == 2
    captured = capsys.readouterr()
    for needle in (SECRET, HF, SECRET[8:20], HF[3:15]):
        assert needle not in captured.err and needle not in captured.out, captured.err
    assert len(captured.err.splitlines()) == 1, captured.err
    return captured.err


@pytest.mark.parametrize("override", [
    f"engine.env.HF_TOKEN={HF}",
    json.dumps({"engine": {"env": {"HF_TOKEN": HF}}}),
    f"engine.args.api-key={SECRET}",
    f"engine.args.hf-token={HF}",
    json.dumps({"engine": {"args": {f"api-key={SECRET}": True}}}),
    f"experiments.0.engine_args.api-key={SECRET}",
])
def test_an_override_carrying_a_credential_is_refused_without_it(
        write_campaign: Callable[[str], Path], capsys: pytest.CaptureFixture[str], override: str) -> None:
    err = _refused([str(write_campaign(BASE)), "-e", override], capsys)
    assert "engine.env_from_controller" in err


@pytest.mark.parametrize(("args", "says"), [
    (f'{{"api-key={SECRET}": true}}', "a flag name is not a flag"),
    (f'{{"hf-token={HF}": true}}', "a flag name is not a flag"),
    (f'{{"{HF}": true}}', "a flag name is not a flag"),
    (f'{{"{HF}": {{"nested": 1}}}}', "a flag name is not a flag"),  # no per-value error names it either
    (f'{{api-key: "{SECRET}"}}', "--api-key takes a credential"),
    (f'{{ssl-keyfile-password: "{SECRET}"}}', "--ssl-keyfile-password takes a credential"),
])
def test_secret_looking_flag_names_in_the_file_are_refused_without_echo(
        write_campaign: Callable[[str], Path], capsys: pytest.CaptureFixture[str], args: str, says: str) -> None:
    path = write_campaign(BASE.replace("{max-model-len: 4096}", args))
    err = _refused([str(path)], capsys)
    assert err.startswith(f"{path}:5: engine.args: ") and says in err


def test_keys_that_carry_a_credential_are_not_repeated(write_campaign: Callable[[str], Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = write_campaign(BASE.replace("  args:", f"  env: {{'HF_TOKEN={HF}': x}}\n  args:"))
    assert "not a variable name: (a " in _refused([str(path)], capsys)
    path = write_campaign(BASE.replace("  args:", f"  {SECRET}: 1\n  args:"))
    assert "engine.(a key not shown): unknown key" in _refused([str(path)], capsys)


def test_plain_flags_still_pass(write_campaign: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = write_campaign(BASE.replace("{max-model-len: 4096}", "{hf-overrides: '{}', tokenizer: /t, "
                                       "max-num-batched-tokens: 8192, api-server-count: 2}"))
    assert main([str(path), "--plan"]) == 0, capsys.readouterr().err
