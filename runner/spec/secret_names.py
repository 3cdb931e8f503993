"""Which variable names and engine flags carry credentials, so a campaign file never holds one.

A campaign file is copied into every results folder and shared; ``engine.env_from_controller``
passes credentials from the controller's environment instead.
"""

from __future__ import annotations

import re

__all__ = ["ENV_NAME", "EngineArg", "is_secret_name", "refuse_secret_flags"]

EngineArg = str | int | float | bool | None | list[str | int | float]

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
_SECRET_WORDS = {"SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
_KEY_QUALIFIERS = {"API", "ACCESS", "PRIVATE", "SECRET", "AUTH", "SIGNING"}
_SECRET_FLAGS = ("hf-token", "api-key")


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, DB_PASS, OPENAI_API_KEY are credentials; STANDIN_KV_CAPACITY_TOKENS is not."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(w == "KEY" and i > 0 and words[i - 1] in _KEY_QUALIFIERS for i, w in enumerate(words)):
        return True
    # HF_TOKEN, ACCESS_TOKEN; not BYTES_PER_TOKEN or MAX_TOKENS (token counts are everywhere here)
    return bool(words) and words[-1] == "TOKEN" and (len(words) == 1 or words[-2] not in {"PER", "MAX", "MIN", "NUM"})


def refuse_secret_flags(args: dict[str, EngineArg]) -> dict[str, EngineArg]:
    """``args`` unchanged, or ValueError when a flag takes a credential (--hf-token, --api-key)."""
    for key in args:
        flag = str(key).lstrip("-").replace("_", "-")
        if flag in _SECRET_FLAGS:
            raise ValueError(f"--{flag} takes a credential: a campaign file is shared; put its value in a "
                             "variable named in engine.env_from_controller (vLLM reads HF_TOKEN / VLLM_API_KEY)")
    return args
