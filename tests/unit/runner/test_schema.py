"""The campaign JSON Schema: shipped as generated, true to the models, and in step with the spec."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from runner.errors import SpecError
from runner.experiments import KINDS
from runner.schema import campaign_schema, main, render
from runner.spec import load_campaign

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "schema" / "campaign.schema.json"
CAMPAIGNS = sorted((REPO / "campaigns").glob("*.y*ml"))
FIRST_LINE = "# yaml-language-server: $schema=../schema/campaign.schema.json"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SHIPPED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problems(validator: jsonschema.Draft202012Validator, text: str) -> list[str]:
    """Every schema error as 'key.path: message', with those of each failed anyOf branch, at any depth."""
    out: list[str] = []

    def walk(errors: Iterable[jsonschema.ValidationError]) -> None:
        for err in errors:
            out.append(f"{'.'.join(str(p) for p in err.absolute_path)}: {err.message}")
            walk(err.context or [])

    walk(validator.iter_errors(yaml.safe_load(text)))
    return out


# --- the shipped file -----------------------------------------------------------------------


def test_shipped_schema_is_what_the_models_generate() -> None:
    assert SHIPPED.read_text() == render(), "run: python -m runner.schema --out schema/campaign.schema.json"


def test_render_is_sorted_indented_with_one_trailing_newline() -> None:
    text = render()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_schema_names_its_draft_id_and_title() -> None:
    schema = campaign_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] and schema["title"] and schema["description"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "inventory", "experiments"}


def test_check_passes_on_the_shipped_file_and_fails_in_one_line_on_a_stale_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check", str(SHIPPED)]) == 0
    stale = tmp_path / "campaign.schema.json"
    stale.write_text(render().replace('"Labels the experiment', '"labels the experiment'))
    assert main(["--check", str(stale)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(stale) in err and "python -m runner.schema --out" in err
    assert main(["--check", str(tmp_path / "missing.json")]) == 1
    assert capsys.readouterr().err.count("\n") == 1


def test_out_writes_the_file_and_stdout_prints_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "schema.json"
    assert main(["--out", str(out)]) == 0
    assert out.read_text() == render()
    assert main([]) == 0
    assert capsys.readouterr().out == render()


# --- what the schema holds --------------------------------------------------------------------


def _params_def(schema: dict[str, Any], kind: str, mode: str) -> dict[str, Any]:
    modes = schema["$defs"][f"Modes_{kind}"]
    mapping = next(b for b in modes["anyOf"] if b.get("type") == "object")
    ref = mapping["properties"][mode]["anyOf"][0]["$ref"]
    return schema["$defs"][ref.rsplit("/", 1)[-1]]


def test_every_kind_offers_exactly_its_modes_with_their_input_fields() -> None:
    schema = campaign_schema()
    assert schema["$defs"]["Experiment"]["properties"]["kind"]["enum"] == list(KINDS)
    for name, kind in KINDS.items():
        modes = schema["$defs"][f"Modes_{name}"]
        listed = next(b for b in modes["anyOf"] if b.get("type") == "array")
        assert listed["items"]["enum"] == list(kind.modes)
        for mode, model in kind.modes.items():
            params = _params_def(schema, name, mode)
            assert params["additionalProperties"] is False
            # validation mode: a computed field (offload's and startup's recipe) is an output, never an input
            assert set(params.get("properties", {})) == set(model.model_fields), (name, mode)
            assert "recipe" not in params.get("properties", {})


def test_descriptions_are_kept() -> None:
    schema = campaign_schema()
    assert "stand-in" in schema["$defs"]["Engine"]["properties"]["kind"]["description"]
    assert _params_def(schema, "selftest", "sleep")["properties"]["seconds"]["description"]
    assert _params_def(schema, "offload", "native_cpu")["properties"]["offload_gib"]["description"]


# --- the shipped campaigns --------------------------------------------------------------------


def test_there_are_campaigns_to_check() -> None:
    assert len(CAMPAIGNS) >= 5


@pytest.mark.parametrize("path", CAMPAIGNS, ids=lambda p: p.name)
def test_shipped_campaign_names_the_schema_and_validates(
        path: Path, validator: jsonschema.Draft202012Validator) -> None:
    text = path.read_text()
    assert text.splitlines()[0] == FIRST_LINE
    assert (path.parent / FIRST_LINE.split("=", 1)[1]).resolve() == SHIPPED
    assert problems(validator, text) == []


# --- rejections -------------------------------------------------------------------------------

BASE = """\
name: demo
inventory: inventory
engine: {kind: stand-in, model: /tmp/model}
experiments:
"""


def test_unknown_mode_of_a_kind_is_rejected(validator: jsonschema.Draft202012Validator) -> None:
    as_list = problems(validator, BASE + "  - {kind: selftest, modes: [noop, nap]}\n")
    assert any(p.startswith("experiments.0.modes.1: 'nap' is not one of") for p in as_list), as_list
    as_map = problems(validator, BASE + "  - {kind: selftest, modes: {nap: {seconds: 1}}}\n")
    assert any("'nap' was unexpected" in p for p in as_map), as_map
    # a mode of another kind is unknown here too
    assert problems(validator, BASE + "  - {kind: selftest, modes: [hbm_only]}\n")


def test_unknown_key_in_mode_params_is_rejected(validator: jsonschema.Draft202012Validator) -> None:
    found = problems(validator, BASE + "  - {kind: selftest, modes: {sleep: {secnds: 1}}}\n")
    assert any(p.startswith("experiments.0.modes.sleep:") and "'secnds' was unexpected" in p for p in found), found
    nested = problems(validator, BASE + "  - {kind: offload, modes: {hbm_only: {workload: {sesions: 4}}}}\n")
    assert any("'sesions' was unexpected" in p for p in nested), nested


def test_wrong_type_is_rejected(validator: jsonschema.Draft202012Validator) -> None:
    found = problems(validator, BASE + "  - {kind: selftest, modes: {sleep: {seconds: soon}}}\n")
    assert any(p.startswith("experiments.0.modes.sleep.seconds: 'soon' is not of type 'number'") for p in found), found
    assert problems(validator, BASE + "  - {kind: facts, repeats: [2]}\n")
    assert problems(validator, BASE + "  - {kind: selftest, modes: noop}\n")


# --- the schema and the spec agree ------------------------------------------------------------

GOOD = {
    "facts only": "  - kind: facts\n",
    "modes as a list": "  - {kind: selftest, modes: [noop, sleep], repeats: 3, timeout_s: 60}\n",
    "modes as a mapping": "  - kind: selftest\n    modes: {sleep: {seconds: 1.5, interval_s: 0.5}, noop: }\n",
    "nested offload params": "  - kind: offload\n    modes:\n      hbm_only:\n"
                             "      native_cpu: {offload_gib: 8, workload: {sessions: 4, turns: 2}}\n",
    "offload enum param": "  - {kind: offload, modes: {tiered: {eviction_policy: arc, fs_gib: 10}}}\n",
    "startup list": "  - {kind: startup, modes: [first_start, sleep_wake], engine_args: {enforce-eager: true}}\n",
    "storage params": "  - {kind: storage, modes: {seq_read_direct: {iodepth: 4, size: 1G, target: /mnt/f}}}\n",
    "two named of a kind": "  - {kind: selftest, name: a}\n  - {kind: selftest, name: b, modes: [fail]}\n",
}

BAD = {
    "unknown kind": "  - kind: fax\n",
    "unknown mode in a list": "  - {kind: selftest, modes: [noop, nap]}\n",
    "unknown mode in a mapping": "  - {kind: storage, modes: {seq_read: }}\n",
    "unknown param key": "  - {kind: selftest, modes: {fail: {mesage: x}}}\n",
    "unknown nested param key": "  - {kind: offload, modes: {hbm_only: {quality: {enabeld: false}}}}\n",
    "computed field as input": "  - {kind: offload, modes: {hbm_only: {recipe: {}}}}\n",
    "param below its bound": "  - {kind: selftest, modes: {sleep: {seconds: 0}}}\n",
    "param of the wrong type": "  - {kind: storage, modes: {buffered_read: {numjobs: many}}}\n",
    "param not in its enum": "  - {kind: offload, modes: {tiered: {eviction_policy: fifo}}}\n",
    "param pattern": "  - {kind: storage, modes: {buffered_read: {target: relative/dir}}}\n",
    "mode params not a mapping": "  - {kind: selftest, modes: {sleep: 3}}\n",
    "modes a string": "  - {kind: selftest, modes: noop}\n",
    "no modes listed": "  - {kind: selftest, modes: []}\n",
    "a mode listed twice": "  - {kind: selftest, modes: [noop, noop]}\n",
    "unknown experiment key": "  - {kind: facts, repeets: 2}\n",
    "repeats past the bound": "  - {kind: facts, repeats: 1001}\n",
    "bad experiment name": "  - {kind: facts, name: two words}\n",
    "no experiments": "  []\n",
}


def _spec_accepts(write_campaign: Callable[[str], Path], text: str) -> bool:
    try:
        load_campaign(write_campaign(text), check_hosts=False)
    except SpecError:
        return False
    return True


@pytest.mark.parametrize("body", GOOD.values(), ids=GOOD.keys())
def test_both_accept(body: str, validator: jsonschema.Draft202012Validator,
                     write_campaign: Callable[[str], Path]) -> None:
    text = BASE + body
    assert problems(validator, text) == []
    assert _spec_accepts(write_campaign, text)


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_both_reject(body: str, validator: jsonschema.Draft202012Validator,
                     write_campaign: Callable[[str], Path]) -> None:
    text = BASE + body
    assert problems(validator, text) != []
    assert not _spec_accepts(write_campaign, text)


@pytest.mark.parametrize("edit", [
    ("inventory: inventory\n", ""),                        # a required key is missing
    ("name: demo\n", "name: demo\ncolour: red\n"),         # an unknown top-level key
    ("model: /tmp/model}", "model: /tmp/model, port: 0}"),  # an engine bound
    ("kind: stand-in", "kind: sglang"),                    # an engine enum
])
def test_both_reject_top_level_mistakes(edit: tuple[str, str], validator: jsonschema.Draft202012Validator,
                                        write_campaign: Callable[[str], Path]) -> None:
    text = (BASE + GOOD["facts only"]).replace(*edit)
    assert problems(validator, text) != []
    assert not _spec_accepts(write_campaign, text)


@pytest.mark.parametrize(("body", "schema_ok", "spec_ok"), [
    ("  - {kind: facts, repeats: '2'}\n", False, True),   # the spec converts a quoted number; editors flag it
    ("  - {kind: selftest, modes: {sleep: {seconds: '1.5'}}}\n", False, True),
    ("  - {kind: facts}\n", True, False),                  # after the edit below: a check only code makes
], ids=["quoted int", "quoted float", "docker without image"])
def test_known_differences_stay_as_documented(body: str, schema_ok: bool, spec_ok: bool,
                                              validator: jsonschema.Draft202012Validator,
                                              write_campaign: Callable[[str], Path]) -> None:
    text = BASE + body
    if "kind: facts}" in body:
        text = text.replace("kind: stand-in", "kind: vllm, runtime: docker")
    assert (problems(validator, text) == []) is schema_ok
    assert _spec_accepts(write_campaign, text) is spec_ok
