"""Where the engine's weights come from: dummy weights and config-only rehearsal models."""

from __future__ import annotations

from nodetools.model_shapes import CONFIG_ONLY_PRESETS, PRESETS
from runner.spec.messages import did_you_mean
from runner.spec.models import Engine, Experiment
from runner.yaml_input import Loc

__all__ = ["weights_problems"]

# Kinds that time reading the weights: vLLM's --load-format dummy (random weights made on the GPU,
# nothing read from disk) would fake that phase.
_MEASURES_WEIGHT_LOADING = {"startup": "it times reading the weights, which --load-format dummy skips"}


def weights_problems(engine: Engine, exp: Experiment, index: int) -> list[tuple[Loc, str]]:
    """Dummy weights where the kind measures loading them, and a config-only rehearsal model
    (no weights on disk) without them."""
    args = {**engine.args, **exp.engine_args}
    dummy = (args.get("load-format") or args.get("load_format")) == "dummy"
    if dummy and exp.kind in _MEASURES_WEIGHT_LOADING:
        return [(("experiments", index, "kind"), f"kind {exp.kind} cannot run with engine.args load-format dummy: "
                 f"{_MEASURES_WEIGHT_LOADING[exp.kind]} (use a rehearsal model with weights, or another kind)")]
    preset = engine.rehearsal_model or ""
    if preset and preset not in PRESETS:
        return [(("engine", "rehearsal_model"), f"unknown preset {preset!r} (known: {', '.join(PRESETS)})"
                 f"{did_you_mean(preset, PRESETS)}")]
    if preset in CONFIG_ONLY_PRESETS and not dummy:
        return [(("engine", "rehearsal_model"), f"preset {preset} is written without weights (config and tokenizer "
                 f"only): experiment {exp.label} needs engine.args load-format: dummy")]
    return []
