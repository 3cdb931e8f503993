"""Engine stand-in: an OpenAI-compatible server that rehearses a vLLM campaign without a GPU.

Started like vLLM (``python -m nodetools.standin serve MODEL --port N [vLLM serve flags]``), it
reads the model's files for real, uses a real compile-cache directory, keeps a block-level prefix
cache with LRU eviction and optional offload tiers, serves streaming completions with modelled
prefill and decode times, and writes its log in vLLM's formats. Every timing is a knob: it
rehearses a campaign and measures nothing about vLLM (results are labelled ``engine=stand-in``).
"""

from __future__ import annotations

from nodetools.standin.config import STANDIN_VERSION

__all__ = ["STANDIN_VERSION"]
