"""Frames the model has not answered by their deadline, answered by the tracker instead.

With a latency budget the deadline scheduler sends a frame to the model only when the
batch's answers are expected within the budget, with a margin for what it has seen go wrong.
The machine can still turn slower within a batch: another process takes a core, the OS runs
something else. Such a batch's frames would come out late. `OverdueFrames` watches the
frames the engine has taken (and those waiting in its inbox) until their batch is handed
on; when one reaches its deadline (capture + budget, less a guard for the answer's own work:
the longest recent time from a batch's model to its hand-off, or from a frame's due time
to its answer here in the last 2 s, which grows when the thread wakes late on a busy
machine) and is not answered, the engine's completion thread answers it at once as a
predicted frame (its camera's tracks moved on to its capture time, as for a frame the
scheduler chose not to detect). When the
model's boxes come, they only move the tracks on: the frame is not answered twice. A frame
whose camera has nothing to predict from (its first frame, a reconnect, tracks older than a
second) or that the scheduler forced is left to the model, and so are its camera's later
frames behind it: a camera's answers go out in its frames' order.

The engine calls `launched` as it takes a batch and `finished` once the batch is handed on
(or failed), and the completion thread waits through `wait` (on a batch's outputs: CPU
lanes, CUDA events) or `timeout_s` (on its queue of finished batches), waking at least every
`RECHECK_S` and for the first deadline. The lock guards what the engine thread adds.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from drivepercept.engine.results import batch_results
from drivepercept.types import Batch, FrameMeta, FrameResult

MIN_GUARD_NS = 3_000_000  # a frame is answered at least this long before its deadline
MAX_GUARD_SHARE = 0.3  # and at most this share of the budget before it
TAILS_KEPT = 32  # model batches whose work after the model the guard is the longest of
LATE_KEPT_S = 2.0  # an answer's lateness widens the guard this long
RECHECK_S = 0.005  # the completion thread looks again at least this often (a batch that
# reaches the engine while it waits may be near its due time already)
MAX_BATCHES = 64  # batches watched at most (a batch never finished is forgotten)


class OverdueFrames:
    """See the module docstring.

    Args:
        budget_ms: the run's latency budget.
        class_names: the detector's classes (the empty predicted frames carry them).
        answer: receives the frames that fall due, as predicted `FrameResult`s with no
            boxes, and how many of them, the first, the model was given (the others were
            to be predicted anyway), on the completion thread (`Handoff.overdue`). None
            (the default, a run without a deadline): nothing is watched. Returns the
            frames it answered.
        inbox: the engine's inbox: the batches waiting in it are watched too (a batch made
            while the model is late waits there, its frames as late as the model's).
    """

    def __init__(
        self,
        budget_ms: float = 0.0,
        class_names: tuple[str, ...] = (),
        answer: Callable[[list[FrameResult], int], list[FrameResult]] | None = None,
        inbox: queue.Queue[Batch | None] | None = None,
    ) -> None:
        self.budget_ns = int(budget_ms * 1e6)
        # the time a batch's frames take from the model's end to their hand-off (NMS, the
        # tracking stage): a frame still with the model this close to its deadline is late
        self._tails: collections.deque[int] = collections.deque(maxlen=TAILS_KEPT)
        # (when, how long after its due time) each of the latest frames answered here that
        # fell due since the scan before was handed on (the thread's wake-up on a busy
        # machine, the answer's own work), plus MIN_GUARD_NS; kept for LATE_KEPT_S
        self._overshoots: collections.deque[tuple[int, int]] = collections.deque(maxlen=TAILS_KEPT)
        self._scanned_ns = 0  # when `answer_due` last looked
        self.class_names = class_names
        self.answer = answer
        self.inbox = inbox
        self._lock = threading.Lock()
        self._batches: dict[int, Batch] = {}  # batch index -> batch, in launch order
        self._offered: set[tuple[int, int]] = set()  # (batch index, row) already offered
        self._held: set[tuple[int, int]] = set()  # of them, those left to the model

    def launched(self, batch: Batch | None) -> None:
        """A batch went to the model, or past it to the completion thread (a batch of
        predicted frames); None: the warm-up's, not watched."""
        if batch is None or self.answer is None:
            return
        with self._lock:
            self._batches[batch.batch_index] = batch
            while len(self._batches) > MAX_BATCHES:
                self._forget(next(iter(self._batches)))

    def finished(self, batch: Batch | None, model_done_ns: int | None = None) -> int:
        """A batch has been handed on (or failed): its frames are no longer watched.
        `model_done_ns`: when its model was done (the work after it is measured). Returns
        how many of its frames were answered at their deadline (a failed batch's have their
        answers)."""
        if batch is None:
            return 0
        index = batch.batch_index
        with self._lock:
            if model_done_ns is not None and index in self._batches:
                self._tails.append(time.monotonic_ns() - model_done_ns)
            answered = sum(1 for key in self._offered - self._held if key[0] == index)
            self._forget(index)
        return answered

    @property
    def after_ns(self) -> int:
        """How long after its capture a frame falls due: the budget less the guard (the
        longest recent work after the model, or lateness of an answer here past its due
        time plus `MIN_GUARD_NS`; at least `MIN_GUARD_NS`)."""
        since = time.monotonic_ns() - int(LATE_KEPT_S * 1e9)
        late = max((ns for t, ns in list(self._overshoots) if t >= since), default=0)
        tail = max(max(self._tails, default=0), late)
        guard = min(max(MIN_GUARD_NS, tail), int(MAX_GUARD_SHARE * self.budget_ns))
        return self.budget_ns - guard

    def _forget(self, index: int) -> None:
        self._batches.pop(index, None)
        self._offered = {(b, row) for b, row in self._offered if b != index}
        self._held = {(b, row) for b, row in self._held if b != index}

    def _rows(self) -> list[tuple[Batch, int, FrameMeta, bool]]:
        """Every frame watched: its batch, row, meta, and whether it was offered. The inbox
        is read under the lock `launched` takes, so that a batch the engine takes from it
        meanwhile is not seen twice."""
        with self._lock:
            batches = dict(self._batches)
            if self.inbox is not None and self.answer is not None:
                with self.inbox.mutex:
                    queued = [b for b in self.inbox.queue if b is not None]
                batches.update((b.batch_index, b) for b in queued if b.batch_index not in batches)
            return [
                (b, row, m, (b.batch_index, row) in self._offered)
                for b in batches.values()
                for row, m in enumerate(b.frames)
            ]

    def _open(self) -> list[tuple[Batch, int, FrameMeta]]:
        """The frames not offered yet that may be: none while an earlier frame of its camera
        waits unanswered (a camera's answers go out in its frames' order)."""
        rows = self._rows()
        earliest: dict[int, int] = {}  # camera -> its earliest frame not answered
        with self._lock:
            for b, row, m, offered in rows:
                if not offered or (b.batch_index, row) in self._held:
                    t = earliest.get(m.camera_index)
                    earliest[m.camera_index] = m.capture_ns if t is None else min(t, m.capture_ns)
        return [
            (b, row, m)
            for b, row, m, offered in rows
            if not offered and earliest[m.camera_index] >= m.capture_ns
        ]

    def next_due_ns(self) -> int | None:
        """When the first watched frame falls due (monotonic ns); None: none watched."""
        first = min((m.capture_ns for _, _, m in self._open()), default=None)
        return None if first is None else first + self.after_ns

    def timeout_s(self, longest_s: float) -> float:
        """How long the completion thread may wait before the next frame falls due."""
        if self.answer is None:  # (before any scan: a run without a deadline asks every batch)
            return longest_s
        due = self.next_due_ns()
        if due is None:
            return min(longest_s, RECHECK_S)
        return min(longest_s, RECHECK_S, max(0.0, (due - time.monotonic_ns()) / 1e9))

    def answer_due(self) -> None:
        """Offer every watched frame that has fallen due (each once, a camera's in order);
        those the answer leaves out wait for the model."""
        if self.answer is None:
            return
        now, after, scanned = time.monotonic_ns(), self.after_ns, self._scanned_ns
        self._scanned_ns = now
        due: dict[int, tuple[Batch, list[tuple[int, FrameMeta]], list[tuple[int, FrameMeta]]]]
        due = {}
        for batch, row, meta in self._open():
            if meta.capture_ns + after <= now:
                sent, other = due.setdefault(batch.batch_index, (batch, [], []))[1:]
                (sent if row < batch.detected else other).append((row, meta))
        for batch, sent, other in sorted(due.values(), key=lambda d: d[0].batch_index):
            rows = (*sent, *other)
            part = dataclasses.replace(batch, frames=tuple(m for _, m in rows), predicted=len(rows))
            times = dict.fromkeys(("compute_start", "inference_done", "postprocessed"), now)
            results = batch_results(
                part,
                np.empty((0, 0, 6), np.float32),
                [],
                self.class_names,
                submit_ns=now,
                copy_done_ns=now,
                times_ns=times,
                emitted_ns=now,
            )
            out = self.answer(results, len(sent))
            answered = {(r.camera_index, r.frame_index) for r in out}
            for r in out:  # how late after its due time: the guard grows by it (not a frame
                # due before the scan before, held back or seen late: no measure of the wait)
                if (due_ns := r.timing.capture_ns + after) >= scanned:
                    late = max(0, r.timing.emitted_ns - due_ns) + MIN_GUARD_NS
                    self._overshoots.append((r.timing.emitted_ns, late))
            with self._lock:
                for row, m in rows:
                    self._offered.add((batch.batch_index, row))
                    if (m.camera_index, m.frame_index) not in answered:
                        self._held.add((batch.batch_index, row))

    def wait(self, finished: Callable[[float], bool], batch: Batch | None) -> None:
        """Wait until `finished(timeout_s)` says `batch`'s model is done (True), answering
        the frames that fall due meanwhile; the caller then takes the outputs. Without a
        deadline (or for the warm-up's batch) it returns at once: the caller's own wait is
        the only one."""
        if self.answer is None or batch is None:
            return
        while not finished(self.timeout_s(3600.0)):
            self.answer_due()
