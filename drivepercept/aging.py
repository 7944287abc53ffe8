"""Frames that wait for a busy engine, live with a deadline: which of them the batcher sends
on at once as predicted frames (`batching.Batcher._aging_round`), rather than leaving them in
their cameras' queues until the next round.

A waiting frame goes on once the model could no longer answer it within the budget, alone in
a batch that starts when the engine is expected free (less the scheduler's margin): the next
round would predict it anyway. That expectation does not know of a model batch that stalls,
so while the batch in progress runs past its estimate, a frame half the budget old goes on
too. In the engine's inbox its watch (`engine.overdue`) answers it at its deadline if the
engine is still busy then. A frame that must be detected stays, and so do its camera's later
frames (a camera's answers go out in its frames' order).
"""

from __future__ import annotations

from collections.abc import Sequence

from drivepercept.schedule import DeadlineScheduler
from drivepercept.types import QueuedFrame


def aged_before_ns(
    scheduler: DeadlineScheduler, *, now_ns: int, start_ns: int, prepare_ns: float, stalled: bool
) -> float:
    """The capture time up to which a waiting frame is sent on (see the module docstring):
    `start_ns` when the engine is expected free, `stalled` when its batch in progress has
    run past its estimate."""
    done = max(now_ns, start_ns) + prepare_ns + scheduler.service.estimate_ns(1)
    cutoff = done - scheduler.budget_ns + scheduler.margin_ns(1)
    return max(cutoff, now_ns - scheduler.budget_ns / 2) if stalled else cutoff


def aged_count(frames: Sequence[QueuedFrame], must: int | None, before_ns: float) -> int:
    """How many of a camera's waiting frames (oldest first) are sent on: those captured up
    to `before_ns`, but none from the frame the model must see (`must`, its index) on."""
    usable = frames if must is None else frames[:must]
    return next((k for k, f in enumerate(usable) if f.capture_ns > before_ns), len(usable))
