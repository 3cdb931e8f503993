"""The node programs' argument parser: a bad argument exits with ``exitcodes.BAD_INPUT`` (argparse's
own 2 would read as ours anyway, but the message names the program and where to look)."""

from __future__ import annotations

import argparse

from nodetools import exitcodes

__all__ = ["ToolParser"]


class ToolParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(exitcodes.BAD_INPUT, f"{self.prog}: {message} (see --help)\n")
