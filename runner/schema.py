"""The JSON Schema of campaign files, generated from the spec's models and each kind's mode models.

Editors that speak JSON Schema (the YAML language server behind VS Code, JetBrains, Neovim, ...)
validate and complete a campaign while it is typed, through its first line::

    # yaml-language-server: $schema=../schema/campaign.schema.json

The schema is generated, never edited by hand: ``python -m runner.schema --out
schema/campaign.schema.json`` writes it again after a model changed, and ``--check PATH`` fails
when the shipped file is stale (a unit test does the same). ``runner.spec`` stays the authority:
checks that need code (credential-looking ``env`` names, ``runtime: docker`` without ``image``,
``remote_dir`` normalisation, an engine for kinds that start one, the inventory and host pattern)
are only made by ``python -m runner``. Only keywords that draft 7 also knows are used (plus
``$defs`` references, which are plain JSON pointers), so editors limited to draft 7 still
understand all of it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from runner.experiments import KINDS
from runner.experiments.base import ExperimentKind
from runner.spec import Campaign

__all__ = ["SCHEMA_ID", "campaign_schema", "main", "render"]

SCHEMA_ID = "urn:gpu-campaign-runner:campaign.schema.json"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
REF = "#/$defs/{model}"
SHIPPED = Path("schema/campaign.schema.json")


def _unique(models: Iterable[type[BaseModel]]) -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []
    for model in models:
        if model not in out:
            out.append(model)
    return out


def _modes_schema(kind: ExperimentKind, refs: dict[type[BaseModel], str]) -> dict[str, Any]:
    names = list(kind.modes)
    defaults = ", ".join(kind.default_modes) or "none (modes must be given)"
    return {
        "description": f"Modes of kind {kind.name}: a list of mode names, or a mapping of mode name to its "
                       f"parameters (null or empty: the defaults). Omitted: {defaults}.",
        "anyOf": [
            {"type": "array", "items": {"type": "string", "enum": names}, "minItems": 1, "uniqueItems": True},
            {
                "type": "object",
                "properties": {
                    mode: {
                        "description": f"Parameters of mode {mode} (null or empty: the defaults).",
                        "anyOf": [{"$ref": refs[model]}, {"type": "null"}],
                    }
                    for mode, model in kind.modes.items()
                },
                "additionalProperties": False,
                "minProperties": 1,
            },
            {"type": "null"},
        ],
    }


def _def_name(kind: str) -> str:
    return "Modes_" + kind


def campaign_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a campaign file, with each kind's modes and their parameters.

    Validation mode throughout: computed fields (a mode's ``recipe``) are outputs and never offered
    as inputs.
    """
    params = _unique(model for kind in KINDS.values() for model in kind.modes.values())
    keys, top = models_json_schema([(m, "validation") for m in (Campaign, *params)], ref_template=REF)
    defs: dict[str, Any] = top["$defs"]
    refs = {model: keys[(model, "validation")]["$ref"] for model in params}
    campaign = dict(defs.pop(keys[(Campaign, "validation")]["$ref"].rsplit("/", 1)[-1]))

    experiment = defs["Experiment"]
    experiment["description"] = (
        "One experiment: a kind, its modes (each with parameters) and how often each mode runs. "
        "Two experiments of one kind need distinct names."
    )
    experiment["required"] = ["kind"]
    experiment["properties"]["kind"] = {
        "title": "Kind",
        "type": "string",
        "enum": list(KINDS),
        "description": "The experiment kind: " + "; ".join(f"{k.name}: {k.summary}" for k in KINDS.values()) + ".",
    }
    # The shape of ``modes`` depends on the kind: the allOf below gives it, once, per kind.
    experiment["properties"]["modes"] = {
        "title": "Modes",
        "description": "The kind's modes to run: omitted (the kind's default modes), a list of mode names, or a "
                       "mapping of mode name to its parameters (null: the defaults).",
    }
    # Descriptions the models do not give (yet): a model's own always wins.
    props = experiment["properties"]
    props["name"].setdefault("description", "Labels the experiment in results (default: its kind).")
    props["repeats"].setdefault("description", "Runs of each mode (default: defaults.repeats).")
    props["timeout_s"].setdefault("description", "Per phase (default: defaults.timeout_s).")
    experiment["allOf"] = [
        {
            "if": {"properties": {"kind": {"const": name}}, "required": ["kind"]},
            "then": {"properties": {"modes": {"$ref": REF.format(model=_def_name(name))}}},
        }
        for name in KINDS
    ]
    for name, kind in KINDS.items():
        if _def_name(name) in defs:
            raise RuntimeError(f"schema definition {_def_name(name)} is taken by a model")
        defs[_def_name(name)] = _modes_schema(kind, refs)

    defs["Defaults"].setdefault("description", "Repeats and phase timeout of every experiment that sets none.")
    return {
        "$schema": DRAFT,
        "$id": SCHEMA_ID,
        **campaign,
        "title": "GPU campaign file",
        "description": (
            "A campaign for python -m runner: where to run (inventory, hosts), which engine to start, and the "
            "experiments, each with its modes and repeats. Generated from runner/spec/ and the mode models "
            "of runner/experiments/ by python -m runner.schema."
        ),
        "$defs": defs,
    }


def render() -> str:
    """The schema as shipped: indented, sorted keys, one trailing newline."""
    return json.dumps(campaign_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Print the schema, write it (``--out PATH``) or compare a file with it (``--check PATH``: exit 1 if stale)."""
    p = argparse.ArgumentParser(prog="python -m runner.schema", description="The JSON Schema of campaign files.")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--out", type=Path, metavar="PATH", help="write the schema to PATH instead of stdout")
    group.add_argument("--check", type=Path, metavar="PATH",
                       help=f"exit 1 if PATH (e.g. {SHIPPED}) differs from what the models generate")
    args = p.parse_args(argv)
    text = render()
    if args.check is not None:
        try:
            current = args.check.read_text(encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"{args.check}: cannot read ({exc.strerror}): run python -m runner.schema "
                             f"--out {args.check}\n")
            return 1
        if current != text:
            sys.stderr.write(f"{args.check} is out of date with the campaign models: run python -m runner.schema "
                             f"--out {args.check}\n")
            return 1
        return 0
    if args.out is not None:
        _write(args.out, text)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
