"""An in-memory sink for pipeline tests: every result it is given, and whether it was closed."""

from __future__ import annotations

from drivepercept.types import FrameResult


class Collect:
    """Keeps each result written to it, in order."""

    def __init__(self) -> None:
        self.results: list[FrameResult] = []
        self.closed = False

    def write(self, result: FrameResult) -> None:
        self.results.append(result)

    def close(self) -> None:
        self.closed = True
