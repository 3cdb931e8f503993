"""Entry point: ``python -m nodetools.standin serve MODEL [flags]`` (also ``make-model``, ``knobs``)."""

from __future__ import annotations

import sys

from nodetools.standin.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
