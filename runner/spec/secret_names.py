"""Which variable names and engine flags carry credentials, so a campaign file never holds one.

A campaign file is copied into every results folder and shared; ``engine.env_from_controller``
passes credentials from the controller's environment instead (how a campaign marks a secret).
The naming rules live in ``runner.secrets`` so that ``-e`` overrides hide the same values.
"""

from __future__ import annotations

import re
from typing import Any

from runner.secrets import is_secret_name, looks_like_credential

__all__ = ["ENV_NAME", "EngineArg", "is_secret_name", "refuse_secret_flags"]

EngineArg = str | int | float | bool | None | list[str | int | float]

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_FLAG_NAME = re.compile(r"^-{0,2}[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def refuse_secret_flags(args: Any) -> Any:
    """``args`` unchanged, or ValueError when a flag name takes or holds a credential; run before
    the values are validated, so no per-flag error ever prints such a name. Never echoes the name
    of a flag that may hold a value."""
    if not isinstance(args, dict):
        return args  # the type error is pydantic's
    for key in args:
        name = str(key)
        if not _FLAG_NAME.match(name) or looks_like_credential(name):
            raise ValueError("a flag name is not a flag (it holds '=', spaces or a credential-like word; not shown): "
                             "give a flag's value as the value (max-model-len: 8192), and credentials through "
                             "engine.env_from_controller")
        flag = name.lstrip("-").replace("_", "-")
        if is_secret_name(flag):
            raise ValueError(f"--{flag} takes a credential: a campaign file is shared; put its value in a "
                             "variable named in engine.env_from_controller (vLLM reads HF_TOKEN / VLLM_API_KEY)")
    return args
