"""``--only``: a subset of a loaded campaign's experiments and modes."""

from __future__ import annotations

import dataclasses

from runner.errors import SpecError
from runner.spec.messages import did_you_mean
from runner.spec.models import LoadedCampaign

__all__ = ["select"]


def select(loaded: LoadedCampaign, only: list[str]) -> LoadedCampaign:
    """Keep the experiments (``EXPERIMENT``) and modes (``EXPERIMENT.MODE``) that ``--only`` names;
    trial ids do not change, so a subset run resumes into the same results folder."""
    if not only:
        return loaded
    labels = [e.label for e in loaded.campaign.experiments]
    wanted: dict[str, set[str] | None] = {}
    errors = []
    for item in only:
        # An experiment's name may hold dots (`name: gmu0.9`): a whole name first, else the mode after the last dot.
        label, dot, mode = item.rpartition(".")
        if item in labels or not dot:
            label, mode = item, ""
        if label not in labels:
            errors.append(f"--only {item}: no experiment {label!r} (known: {', '.join(labels)})"
                          f"{did_you_mean(label, labels)}")
            continue
        modes = loaded.modes[labels.index(label)]
        if mode and mode not in modes:
            errors.append(f"--only {item}: experiment {label} has no mode {mode!r} (known: {', '.join(modes)})"
                          f"{did_you_mean(mode, modes)}")
            continue
        if mode:
            current = wanted.setdefault(label, set())
            if current is not None:
                current.add(mode)
        else:
            wanted[label] = None
    if errors:
        raise SpecError(errors)
    experiments, modes_kept = [], []
    for exp, modes in zip(loaded.campaign.experiments, loaded.modes, strict=True):
        if exp.label in wanted:
            keep = wanted[exp.label]
            experiments.append(exp)
            modes_kept.append({m: p for m, p in modes.items() if keep is None or m in keep})
    campaign = loaded.campaign.model_copy(update={"experiments": experiments})
    return dataclasses.replace(loaded, campaign=campaign, modes=tuple(modes_kept),
                               options=(*loaded.options, *(f"--only {o}" for o in only)))
