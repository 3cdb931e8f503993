"""Load and validate a campaign YAML before any host is touched.

Every problem becomes one line ``FILE:LINE: key.path: message``; all of them are reported at once
(a user fixing a campaign should not discover typos one run at a time). Unknown keys are errors.

One module per job: ``models`` (the pydantic models and bounds), ``secret_names`` (credential
names and flags), ``messages`` (pydantic errors as one-line messages, "did you mean"), ``modes``
(each experiment's modes against its kind), ``hosts`` (the inventory and host pattern),
``weights`` (dummy weights and config-only rehearsal models), ``loading`` (``load_campaign``) and
``selection`` (``--only``).
"""

from __future__ import annotations

from runner.spec.loading import load_campaign
from runner.spec.messages import did_you_mean
from runner.spec.models import (
    MAX_REPEATS,
    MAX_TIMEOUT_S,
    MAX_TRIALS,
    Campaign,
    Defaults,
    Engine,
    Experiment,
    LoadedCampaign,
)
from runner.spec.secret_names import EngineArg, is_secret_name
from runner.spec.selection import select

__all__ = ["MAX_REPEATS", "MAX_TIMEOUT_S", "MAX_TRIALS", "Campaign", "Defaults", "Engine", "EngineArg", "Experiment",
           "LoadedCampaign", "did_you_mean", "is_secret_name", "load_campaign", "select"]
