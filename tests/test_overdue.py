"""`engine.overdue.OverdueFrames`: which frames the completion thread offers for an answer
from tracks, and when (issue 45: every frame answered within the budget)."""

from __future__ import annotations

import dataclasses
import queue
import time

import numpy as np
from fakesinks import Collect

from drivepercept.engine.overdue import MIN_GUARD_NS, OverdueFrames
from drivepercept.handoff import Handoff
from drivepercept.rig import CameraConfig
from drivepercept.schedule import DeadlineScheduler
from drivepercept.sinks.fanout import SinkSet
from drivepercept.telemetry.counters import RunCounters
from drivepercept.tracking.stage import RigTracker
from drivepercept.types import (
    DRIVING_CLASSES,
    NO_SLOT,
    Batch,
    Detections,
    FrameMeta,
    FrameResult,
    FrameTiming,
    Letterbox,
)

BUDGET_MS = 100.0
LB = Letterbox((64, 64), (64, 64), 1.0, 1.0, 0, 0)


def _meta(camera: int, frame: int, capture_ns: int) -> FrameMeta:
    return FrameMeta(f"c{camera}", camera, frame, frame / 10, capture_ns, 0, 0, LB)


def _batch(index: int, metas: list[FrameMeta], *, predicted: bool = False) -> Batch:
    slot = NO_SLOT if predicted else 0
    return Batch(index, slot, tuple(metas), 0, complete=True, predicted=len(metas) * predicted)


class Answers:
    """An `answer` that answers every frame but those it is told to leave to the model."""

    def __init__(self, refuse: set[tuple[int, int]] | None = None) -> None:
        self.refuse = refuse or set()
        self.calls: list[tuple[list[tuple[int, int]], int]] = []

    def __call__(self, results: list[FrameResult], sent: int) -> list[FrameResult]:
        self.calls.append(([(r.camera_index, r.frame_index) for r in results], sent))
        return [r for r in results if (r.camera_index, r.frame_index) not in self.refuse]


def test_a_frame_is_offered_once_when_it_falls_due_and_model_rows_first() -> None:
    answers = Answers()
    watch = OverdueFrames(BUDGET_MS, ("a",), answers)
    now = time.monotonic_ns()
    # given a model batch of two cameras' frames: one captured 99 ms ago, one just now
    watch.launched(_batch(3, [_meta(0, 7, now - 99_000_000), _meta(1, 7, now)]))
    # then the first is due (the budget less the guard has passed), the second not yet
    assert watch.next_due_ns() == now - 99_000_000 + watch.after_ns
    assert watch.after_ns == BUDGET_MS * 1e6 - MIN_GUARD_NS  # nothing measured after the model
    watch.answer_due()
    assert answers.calls == [([(0, 7)], 1)]  # given to the model: counted as sent
    # and it is not offered again; the other falls due later
    watch.answer_due()
    assert len(answers.calls) == 1
    due = watch.next_due_ns()
    assert due is not None and due > time.monotonic_ns() + 50_000_000
    # and once the batch is handed on nothing of it is watched
    watch.finished(_batch(3, [_meta(0, 7, 0), _meta(1, 7, 0)]), model_done_ns=None)
    assert watch.next_due_ns() is None


def test_a_batch_waiting_in_the_inbox_is_watched_too() -> None:
    # a batch made while the model is late waits in the engine's inbox, as late as the model
    inbox: queue.Queue[Batch | None] = queue.Queue()
    answers = Answers()
    watch = OverdueFrames(BUDGET_MS, ("a",), answers, inbox=inbox)
    old = time.monotonic_ns() - 120_000_000
    inbox.put(_batch(8, [_meta(0, 3, old), _meta(1, 3, old)], predicted=True))
    watch.answer_due()
    assert answers.calls == [([(0, 3), (1, 3)], 0)]  # none of them was for the model


def test_a_camera_s_later_frame_waits_while_an_earlier_one_is_left_to_the_model() -> None:
    # given camera 0's frame 5 left to the model (forced: the answer refuses it) and its
    # frame 6, predicted, behind it: answers go out in a camera's frame order
    answers = Answers(refuse={(0, 5)})
    watch = OverdueFrames(BUDGET_MS, ("a",), answers)
    t0 = time.monotonic_ns() - 200_000_000
    first = _batch(1, [_meta(0, 5, t0), _meta(1, 5, t0)])
    watch.launched(first)
    watch.launched(_batch(2, [_meta(0, 6, t0 + 66_000_000)], predicted=True))
    watch.answer_due()
    # then camera 1's frame 5 was answered, camera 0's refused, and its frame 6 held back
    assert answers.calls == [([(0, 5), (1, 5)], 2)]
    assert watch.next_due_ns() is None  # nothing open: no busy wait on the held frame
    # and once frame 5 is handed on (the model's boxes), frame 6 is offered
    watch.finished(first, model_done_ns=time.monotonic_ns())
    watch.answer_due()
    assert answers.calls[-1] == ([(0, 6)], 0)


def test_the_guard_is_the_longest_recent_work_after_the_model_within_bounds() -> None:
    watch = OverdueFrames(BUDGET_MS, ("a",), Answers())
    budget_ns = int(BUDGET_MS * 1e6)
    for index, tail_ms in enumerate([2.0, 12.0, 4.0]):
        batch = _batch(index, [_meta(0, index, 0)])
        watch.launched(batch)
        watch.finished(batch, model_done_ns=time.monotonic_ns() - int(tail_ms * 1e6))
    guard_ns = budget_ns - watch.after_ns
    assert 12_000_000 <= guard_ns < 14_000_000
    # and at most 30 % of the budget, whatever a batch took
    batch = _batch(9, [_meta(0, 9, 0)])
    watch.launched(batch)
    watch.finished(batch, model_done_ns=time.monotonic_ns() - 500_000_000)
    assert watch.after_ns == budget_ns - 30_000_000


def test_without_a_deadline_nothing_is_watched() -> None:
    watch = OverdueFrames()
    watch.launched(_batch(0, [_meta(0, 0, 0)]))
    assert watch.next_due_ns() is None and watch.timeout_s(0.1) == 0.1
    watch.answer_due()  # nothing to answer with: a no-op
    asked: list[float] = []

    def finished(timeout_s: float) -> bool:
        asked.append(timeout_s)
        return True

    watch.wait(finished, _batch(0, [_meta(0, 0, 0)]))
    assert asked == []  # the caller's own wait is the only one


def test_a_wait_on_the_model_answers_a_batch_that_comes_while_it_waits() -> None:
    # given a model batch whose frame is answered, and a wait for its outputs during which
    # another batch reaches the engine, already due (it waited behind the slow one)
    answers = Answers()
    watch = OverdueFrames(BUDGET_MS, ("a",), answers)
    now = time.monotonic_ns()
    slow = _batch(1, [_meta(0, 1, now - 99_000_000)])
    watch.launched(slow)
    calls: list[float] = []

    def finished(timeout_s: float) -> bool:
        calls.append(timeout_s)
        if len(calls) == 2:
            watch.launched(_batch(2, [_meta(1, 2, now - 98_000_000)], predicted=True))
        return len(calls) >= 4

    watch.wait(finished, slow)
    # then both were answered before the model was done
    assert [c[0] for c in answers.calls] == [[(0, 1)], [(1, 2)]]
    assert all(t <= 0.005 for t in calls)  # it looked again at least every 5 ms


def test_a_forced_frame_is_left_to_the_model_even_with_tracks_to_predict_from() -> None:
    # given two cameras tracked for a while, and a model batch whose second camera's frame
    # the scheduler forced (its starvation bound): both cameras have fresh tracks
    names = ["c0", "c1"]
    stage = RigTracker([CameraConfig(name=n) for n in names])
    scheduler = DeadlineScheduler(names, budget_ms=BUDGET_MS)
    sink = Collect()
    sinks = SinkSet.of([sink])
    sinks.start()
    handoff = Handoff(stage=stage, scheduler=scheduler, sinks=sinks, counters=RunCounters(names))

    def frame(camera: int, k: int, det: Detections) -> FrameResult:
        meta = FrameMeta(names[camera], camera, k, k / 10, 0, 0, 0, LB)
        return FrameResult(meta, 7, 2, det, FrameTiming(*range(11)))

    box = np.array([[10.0, 10.0, 30.0, 30.0]], np.float32)
    seen = Detections(box, np.array([0.9], np.float32), np.array([0]), DRIVING_CLASSES)
    for k in range(3):
        stage([frame(0, k, seen), frame(1, k, seen)])
    scheduler.decided(
        batch_index=7, detected=[(0, 1), (1, 1)], predicted=[], forced=[1],
        expected_done_ns=0, now_ns=0,
    )  # fmt: skip
    nothing = Detections.empty(DRIVING_CLASSES, predicted=True)
    # when the model is late with the batch
    answered = handoff.overdue([frame(0, 3, nothing), frame(1, 3, nothing)], sent=2)
    sinks.close()
    # then only the camera that was not forced is answered, and counted as overdue
    assert [r.camera for r in answered] == ["c0"] == [r.camera for r in sink.results]
    cameras = scheduler.figures()["cameras"]
    assert isinstance(cameras, dict)
    assert (cameras["c0"]["overdue"], cameras["c1"]["overdue"]) == (1, 0)


def test_a_failed_batch_s_frames_answered_at_their_deadline_are_not_counted_failed() -> None:
    from drivepercept.engine.failures import BatchFailures

    # given a model batch of three frames: two due, of which the answer leaves one to the
    # model (no tracks), and one not due yet
    answers = Answers(refuse={(1, 4)})
    watch = OverdueFrames(BUDGET_MS, ("a",), answers)
    now = time.monotonic_ns()
    metas = [_meta(0, 4, now - 99_000_000), _meta(1, 4, now - 99_000_000), _meta(2, 4, now)]
    watch.launched(_batch(5, metas))
    watch.answer_due()
    # when the model then fails on it, only the answered frame has a result
    answered = watch.finished(_batch(5, metas))
    assert answered == 1
    failures = BatchFailures()
    failures.failed(_batch(5, metas), RuntimeError("out of memory"), answered=answered)
    assert (failures.batches, failures.frames) == (1, 2)
    # and a batch handed on without any answered early says none
    watch.launched(_batch(6, [_meta(0, 5, now)]))
    assert watch.finished(_batch(6, [_meta(0, 5, now)])) == 0


def test_an_answer_handed_on_after_its_due_time_widens_the_guard() -> None:
    # given an answer that gets out 8 ms after the frame's due time (a thread that woke
    # late on a busy machine, a slow sink)
    late_ns = 8_000_000

    def answer(results: list[FrameResult], sent: int) -> list[FrameResult]:
        replace = dataclasses.replace
        return [
            replace(r, timing=replace(r.timing, emitted_ns=r.timing.emitted_ns + late_ns))
            for r in results
        ]

    watch = OverdueFrames(BUDGET_MS, ("a",), answer)
    before = watch.after_ns
    now = time.monotonic_ns()
    watch.launched(_batch(1, [_meta(0, 1, now - 99_000_000)]))
    watch.answer_due()
    # then the next frames fall due at least that much earlier, within the guard's bound
    widened = watch.after_ns
    assert before - late_ns >= widened >= 0.7 * BUDGET_MS * 1e6
    # and a frame that was due before the last look (held back, or seen late) is no measure
    # of the thread's wake-up: answering it 50 ms past its due time widens nothing
    watch.launched(_batch(2, [_meta(0, 2, time.monotonic_ns() - 150_000_000)]))
    watch.answer_due()
    assert watch.after_ns == widened
