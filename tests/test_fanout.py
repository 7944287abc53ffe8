"""SinkSet under faults: stuck and dying slow outputs, and a failing essential one."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from drivepercept.sinks import fanout
from drivepercept.sinks.fanout import OnFailure, SinkPolicy, SinkSet
from drivepercept.types import (
    Detections,
    DropPolicy,
    FrameMeta,
    FrameResult,
    FrameTiming,
    Letterbox,
)

pytestmark = pytest.mark.timeout(60)


def _batch(index: int, size: int = 2) -> list[FrameResult]:
    box = Letterbox((8, 8), (8, 8), 1.0, 1.0, 0.0, 0.0)
    timing = FrameTiming(*range(11))
    return [
        FrameResult(
            FrameMeta(f"c{i}", i, index, 0.0, 0, 0, 0, box),
            index,
            size,
            Detections(
                np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)
            ),
            timing,
        )
        for i in range(size)
    ]


class Stuck:
    """Blocks in write until released: an encoder hung on a full disk."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.closed = False

    def write(self, result: FrameResult) -> None:
        self.entered.set()
        self.release.wait(30)

    def close(self) -> None:
        self.closed = True


def test_close_never_waits_past_its_deadline_for_a_stuck_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a slow output in replay policy (BLOCK) that hangs on its first frame
    monkeypatch.setattr(fanout, "CLOSE_TIMEOUT_S", 0.5)
    stuck = Stuck()
    sinks = SinkSet()
    sinks.add(stuck, SinkPolicy(slow=True, queue_batches=1, when_full=DropPolicy.BLOCK), name="v")
    sinks.start()
    assert sinks.dispatch(_batch(0))
    assert stuck.entered.wait(5)
    assert sinks.dispatch(_batch(1))  # fills the queue
    # when a third batch blocks the completion thread and the run closes meanwhile
    blocked = threading.Thread(target=sinks.dispatch, args=(_batch(2),), name="test-dispatch")
    blocked.start()
    time.sleep(0.3)
    started = time.monotonic()
    errors = sinks.close()
    # then close returns within its deadline, the blocked hand-over gave up, and the stuck
    # output is named (not closed under its writer's feet)
    assert time.monotonic() - started < 2.0 and errors == []
    blocked.join(timeout=2)
    assert not blocked.is_alive()
    report = sinks.report()["v"]
    assert sinks.not_stopped == ("sink-v",) and not stuck.closed
    assert report.frames_dropped == 4 and report.failed is not None
    stuck.release.set()


def test_a_blocked_hand_over_gives_up_when_the_run_stops() -> None:
    stop = threading.Event()
    stuck = Stuck()
    sinks = SinkSet()
    sinks.add(stuck, SinkPolicy(slow=True, queue_batches=1, when_full=DropPolicy.BLOCK), name="v")
    sinks.start(stop=stop)
    sinks.dispatch(_batch(0))
    assert stuck.entered.wait(5)
    sinks.dispatch(_batch(1))
    stop.set()
    started = time.monotonic()
    assert sinks.dispatch(_batch(2))  # returns: the batch is dropped for this output
    assert time.monotonic() - started < 1.0
    assert sinks.report()["v"].frames_dropped == 2
    stuck.release.set()
    sinks.close()


class Fatal(BaseException):
    pass


class Dying:
    def write(self, result: FrameResult) -> None:
        raise Fatal("the encoder thread died")

    def close(self) -> None:
        pass


def test_a_slow_output_whose_thread_dies_is_failed_and_counts_what_it_missed() -> None:
    sinks = SinkSet()
    sinks.add(Dying(), SinkPolicy(slow=True, when_full=DropPolicy.BLOCK), name="v")
    sinks.start()
    sinks.dispatch(_batch(0))
    deadline = time.monotonic() + 5
    while sinks.report()["v"].failed is None and time.monotonic() < deadline:
        time.sleep(0.01)
    for k in range(1, 4):
        sinks.dispatch(_batch(k))  # never blocks on the dead thread
    sinks.close()
    report = sinks.report()["v"]
    assert report.failed == "Fatal: the encoder thread died"
    assert report.frames_written == 0


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def write(self, result: FrameResult) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("slow", [False, True])
def test_an_essential_output_failing_stops_the_run_and_later_batches_are_not_counted(
    slow: bool,
) -> None:
    stops: list[BaseException] = []
    sinks = SinkSet(on_stop=stops.append)
    sinks.add(Broken(), SinkPolicy(slow=slow, on_failure=OnFailure.STOP), name="frames")
    sinks.start()
    first = sinks.dispatch(_batch(0))
    deadline = time.monotonic() + 5
    while not stops and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stops) == 1 and isinstance(stops[0], OSError)
    assert first is (slow is True)  # inline, the failing batch itself is not counted
    assert sinks.dispatch(_batch(1)) is False
    sinks.close()
