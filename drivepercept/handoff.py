"""What the engine's completion thread does with a finished batch's results (`Pipeline`
wires it): the tracking stage, the `emitted` stamp, the deadline scheduler's lateness, the
sinks, the counters.

A frame is `emitted` when it is handed to the sinks: the engine stamps it as its boxes are
ready, and a stage after the engine (tracking) stamps it again as the stage hands it on, so
that the stage's time is in every frame's end to end, as it is in what a consumer waits for,
and in the lateness the scheduler learns its margin from (on the sample rig, replayed in real
time with a budget, the stage took 2.4 ms a six-frame batch, p50).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from drivepercept.schedule import DeadlineScheduler
from drivepercept.sinks.fanout import SinkSet
from drivepercept.telemetry.counters import RunCounters
from drivepercept.types import FrameResult

Stage = Callable[[list[FrameResult]], list[FrameResult]]


def handed_on(
    results: list[FrameResult], emitted_ns: int, *, drop_images: bool = False
) -> list[FrameResult]:
    """The results, stamped `emitted` at `emitted_ns` (and without their original pixels,
    `drop_images`, where only the stage wanted them)."""
    replace = dataclasses.replace
    if drop_images:
        return [
            replace(
                r,
                meta=replace(r.meta, original_bgr=None)
                if r.meta.original_bgr is not None
                else r.meta,
                timing=replace(r.timing, emitted_ns=emitted_ns),
            )
            for r in results
        ]
    return [replace(r, timing=replace(r.timing, emitted_ns=emitted_ns)) for r in results]


class Handoff:
    """The completion thread's hand-off: called with each batch's results, and with None
    after the last batch, for what the stage still holds (tracking's frames waiting for
    their rig step, its `flush`). A batch the sinks refuse (closing, an essential output
    failed) is not counted: counts match files. `drop_images`: the frames carry their
    original pixels for the stage alone (tracking's looks); they are dropped as the stage
    hands the frames on, so that no sink's queue holds them."""

    def __init__(
        self,
        *,
        stage: Stage | None,
        scheduler: DeadlineScheduler | None,
        sinks: SinkSet,
        counters: RunCounters,
        drop_images: bool = False,
    ) -> None:
        self.stage, self.scheduler, self.sinks, self.counters = stage, scheduler, sinks, counters
        self.drop_images = drop_images

    def __call__(self, results: list[FrameResult] | None) -> None:
        batch = results[0].batch_index if results else None
        if self.stage is not None:  # it may hold frames back, or add earlier ones
            results = self.stage(results) if results else getattr(self.stage, "flush", list)()
            results = handed_on(results, time.monotonic_ns(), drop_images=self.drop_images)
        if batch is not None and self.scheduler is not None:  # how late its model batch came
            self.scheduler.observe(batch, time.monotonic_ns())
        if results and self.sinks.dispatch(results):
            self.counters.add(results)

    def overdue(self, results: list[FrameResult], sent: int) -> list[FrameResult]:
        """Frames the engine is late with (`engine.overdue`, predicted and empty; the first
        `sent` were given to the model, the others wait behind): those the stage can answer
        from their cameras' tracks are answered and handed on now (not a frame the scheduler
        forced: it must be detected); their boxes, when they come, only move the tracks on.
        Returns those answered."""
        answer: Stage | None = getattr(self.stage, "overdue", None)
        if answer is None:
            return []
        model = {(r.camera, r.frame_index) for r in results[:sent]}
        if self.scheduler is not None:
            forced = [self.scheduler.must_wait(r.batch_index, r.camera_index) for r in results]
            results = [r for k, r in enumerate(results) if k >= sent or not forced[k]]
        now = time.monotonic_ns()
        results = handed_on(answer(results), now, drop_images=self.drop_images) if results else []
        if results and self.scheduler is not None:
            late = [r.camera_index for r in results if (r.camera, r.frame_index) in model]
            self.scheduler.overdue(late)
        if results and self.sinks.dispatch(results):
            self.counters.add(results, batch=False)
        return results
