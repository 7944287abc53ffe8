"""Batches the model raised on: set aside and counted, until too many fail in a row.

A perception run should not die of one bad batch (a transient out-of-memory on an unusually
crowded batch, one corrupt frame that trips the model), and should not pretend to run when
the model fails every time. `BatchFailures` keeps the count, the frames without results and
the last error; the engine asks it after each failed batch whether to go on.

In the engine a failed batch's slot is given back and its frames get no results (counted in
`failed_batches` / `failed_frames`, and in their cameras' `discarded`); the error is logged
once per batch and the next batch runs. `MAX_FAILED_IN_A_ROW` failures in a row (a model
that cannot run at all) stop the run through the pipeline's error handler; a failure in the
warm-up stops it at once.
"""

from __future__ import annotations

import logging
import threading

from drivepercept.errors import StageError, one_line
from drivepercept.types import Batch

log = logging.getLogger(__name__)

MAX_FAILED_IN_A_ROW = 3  # failed batches in a row that stop the run


class BatchFailures:
    """Counts of failed batches; thread-safe (the engine's two threads both report)."""

    def __init__(self, max_in_a_row: int = MAX_FAILED_IN_A_ROW) -> None:
        self.max_in_a_row = max_in_a_row
        self.batches = 0
        self.frames = 0
        self.last: str | None = None  # the last error, one line
        self._in_a_row = 0
        self._lock = threading.Lock()

    def failed(self, batch: Batch, exc: Exception, *, answered: int = 0) -> None:
        """Count a batch that raised `exc` and log it once; `answered` of its frames were
        answered at their deadline before it failed (`overdue`): they have results.

        Raises:
            StageError: the max_in_a_row-th failed batch in a row (the cause attached).
        """
        why = one_line(f"{type(exc).__name__}: {exc}")
        with self._lock:
            self.batches += 1
            self.frames += batch.size - answered
            self.last = why
            self._in_a_row += 1
            in_a_row = self._in_a_row
        log.error(
            "batch %d (%d frames) failed, %d of its frames have no results: %s",
            batch.batch_index,
            batch.size,
            batch.size - answered,
            why,
        )
        if in_a_row >= self.max_in_a_row:
            raise StageError(f"{in_a_row} batches in a row failed, the last with {why}") from exc

    def succeeded(self) -> None:
        with self._lock:
            self._in_a_row = 0
