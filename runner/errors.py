"""Expected errors of the runner; each carries enough context for a one-line message."""

from __future__ import annotations

__all__ = ["ParseError", "ResultsLockedError", "ResultsWriteError", "RunnerError", "SpecError"]


class RunnerError(Exception):
    """Base of every expected runner error (bad input, unreadable artefacts)."""


class SpecError(RunnerError):
    """A campaign file is invalid; ``lines`` holds one message per problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


class ParseError(RunnerError):
    """A file could not be parsed as the format that was asked for."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class ResultsWriteError(RunnerError):
    """The results folder refused a write (full disk, quota, read-only): the run stops; what was
    written before stays valid (every write is atomic)."""

    def __init__(self, path: object, exc: OSError) -> None:
        self.path = str(path)
        self.strerror = exc.strerror or str(exc)
        super().__init__(f"cannot write {self.path}: {self.strerror}")


class ResultsLockedError(RunnerError):
    """Another run holds the results folder."""


class LogInputError(ParseError):
    """A log file cannot be read as a text log: not a regular file, binary, or over a size limit."""


__all__ += ["LogInputError"]
