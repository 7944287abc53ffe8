"""Camera queues and the batcher, driven directly with hand-made frames."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from drivepercept.alignment import ALIGN_MAX_SPAN_NS, TimeAligner
from drivepercept.batching import Batcher
from drivepercept.buffers import StagingRing
from drivepercept.queues import CameraQueues
from drivepercept.types import Batch, DropPolicy, Frame, FrameMeta, Letterbox

pytestmark = pytest.mark.timeout(30)


def _frame(camera: int, index: int, value: int = 0) -> Frame:
    box = Letterbox((8, 8), (8, 8), 1.0, 1.0, 0.0, 0.0)
    now = time.monotonic_ns()
    meta = FrameMeta(f"c{camera}", camera, index, 0.0, now, now, now, box)
    return Frame(meta, np.full((8, 8, 3), value, np.uint8))


def test_block_policy_waits_and_drop_oldest_counts() -> None:
    stop = threading.Event()
    q = CameraQueues(["a"], capacity=2, policy=DropPolicy.DROP_OLDEST)
    for k in range(5):
        assert q.put(0, _frame(0, k), stop=stop)
    with q.cond:
        frame, _ = q.take(0)
    assert isinstance(frame, Frame) and frame.frame_index == 4  # newest wins
    assert q.dropped() == [4] and q.high_water() == [2]

    blocking = CameraQueues(["a"], capacity=1, policy=DropPolicy.BLOCK)
    assert blocking.put(0, _frame(0, 0), stop=stop)
    stop_later = threading.Timer(0.2, stop.set)
    stop_later.start()
    t0 = time.monotonic()
    assert not blocking.put(0, _frame(0, 1), stop=stop)  # full: waits until stopped
    assert time.monotonic() - t0 >= 0.15
    assert blocking.dropped() == [0]


def _run_batcher(
    frames_by_camera: dict[int, int], *, timeout_ms: float, n_cams: int, end: set[int]
) -> list[Batch]:
    stop = threading.Event()
    qs = CameraQueues([f"c{i}" for i in range(n_cams)], capacity=8, policy=DropPolicy.BLOCK)
    ring = StagingRing(slots=4, max_batch=n_cams, height=8, width=8, pin_memory=False)
    out: queue.Queue[Batch | None] = queue.Queue(maxsize=4)
    batcher = Batcher(queues=qs, ring=ring, out=out, timeout_ms=timeout_ms, stop=stop)
    batcher.start()
    for cam, count in frames_by_camera.items():
        for k in range(count):
            qs.put(cam, _frame(cam, k, value=10 * cam + k), stop=stop)
    for cam in end:
        qs.end(cam)
    batches = []
    while True:
        item = out.get(timeout=5)
        if item is None:
            break
        rows = ring.arrays[item.slot]
        for row, meta in enumerate(item.frames):  # the slot holds each frame's pixels
            assert rows[row, 0, 0, 0] == 10 * meta.camera_index + meta.frame_index
        batches.append(item)
        ring.release(item.slot)
        if sum(b.size for b in batches) == sum(frames_by_camera.values()) and not end:
            break
    stop.set()
    batcher.thread.join(timeout=2)
    assert not batcher.thread.is_alive()
    return batches


def test_full_batches_go_out_without_waiting_for_the_timeout() -> None:
    t0 = time.monotonic()
    batches = _run_batcher({0: 3, 1: 3, 2: 3}, timeout_ms=5000, n_cams=3, end={0, 1, 2})
    assert time.monotonic() - t0 < 2.0
    assert [b.size for b in batches] == [3, 3, 3]
    assert all(b.complete for b in batches)
    assert [b.cameras for b in batches] == [(0, 1, 2)] * 3
    assert all(b.capture_spread_ns >= 0 for b in batches)


def test_missing_camera_gives_partial_batches_after_the_timeout() -> None:
    # camera 2 never sends a frame and never ends: batches of 0 and 1 go out on timeout
    batches = _run_batcher({0: 2, 1: 2}, timeout_ms=50, n_cams=3, end=set())
    assert [b.cameras for b in batches] == [(0, 1), (0, 1)]
    assert not any(b.complete for b in batches)


def test_ended_camera_is_not_waited_for() -> None:
    t0 = time.monotonic()
    batches = _run_batcher({0: 3, 1: 1}, timeout_ms=5000, n_cams=2, end={0, 1})
    assert time.monotonic() - t0 < 2.0
    assert [b.cameras for b in batches] == [(0, 1), (0,), (0,)]


def _timed_frame(camera: int, index: int, pts_s: float) -> Frame:
    box = Letterbox((8, 8), (8, 8), 1.0, 1.0, 0.0, 0.0)
    now = time.monotonic_ns()
    meta = FrameMeta(f"c{camera}", camera, index, pts_s, now, now, now, box)
    return Frame(meta, np.full((8, 8, 3), 10 * camera + index, np.uint8))


def test_time_aligner_takes_one_frame_period_from_the_earliest() -> None:
    aligner = TimeAligner()
    ms = 1_000_000
    assert aligner.choose({0: 0, 1: 0, 2: 0}) == [0, 1, 2]
    # camera 2 is 4 frames (of 66.7 ms) ahead: it waits while the others catch up
    for k in range(1, 5):
        assert aligner.choose({0: k * 66 * ms, 1: k * 66 * ms + 5 * ms, 2: 5 * 66 * ms}) == [0, 1]
    assert aligner.choose({0: 330 * ms, 1: 335 * ms, 2: 330 * ms}) == [0, 1, 2]
    assert aligner.period_ns() == 66 * ms
    # a frame without a time, or clocks farther apart than ALIGN_MAX_SPAN_NS: all taken
    assert aligner.choose({0: None, 1: 400 * ms}) == [0, 1]
    assert aligner.choose({0: 400 * ms, 1: 400 * ms + ALIGN_MAX_SPAN_NS + 1}) == [0, 1]


def test_replay_batches_frames_of_one_instant_whatever_order_they_arrive_in() -> None:
    """Camera 1's decoder is 3 frames ahead of camera 0's when batching starts (what made
    a replay's batches hold frames 0.2-0.5 s apart): aligned batches pair frame k with k."""
    stop = threading.Event()
    qs = CameraQueues(["c0", "c1"], capacity=8, policy=DropPolicy.BLOCK)
    ring = StagingRing(slots=4, max_batch=2, height=8, width=8, pin_memory=False)
    out: queue.Queue[Batch | None] = queue.Queue(maxsize=4)
    batcher = Batcher(queues=qs, ring=ring, out=out, timeout_ms=5, stop=stop, align=True)
    period = 1 / 15
    for k in range(3):
        qs.put(1, _timed_frame(1, k, k * period), stop=stop)
    batcher.start()
    time.sleep(0.1)  # far past the 5 ms timeout: a replay waits for camera 0 all the same
    for k in range(6):
        qs.put(0, _timed_frame(0, k, k * period), stop=stop)
        if k + 3 < 6:
            qs.put(1, _timed_frame(1, k + 3, (k + 3) * period), stop=stop)
    qs.end(0)
    qs.end(1)
    pairs = []
    while (item := out.get(timeout=5)) is not None:
        rows = ring.arrays[item.slot]
        for row, meta in enumerate(item.frames):
            assert rows[row, 0, 0, 0] == 10 * meta.camera_index + meta.frame_index
        pairs.append(sorted((m.camera_index, m.frame_index) for m in item.frames))
        ring.release(item.slot)
    batcher.thread.join(timeout=2)
    assert pairs == [[(0, k), (1, k)] for k in range(6)]
    spread = batcher.source_spread_ms()
    assert spread is not None and spread["max"] == 0.0


def test_replay_leaves_a_stalled_camera_out_after_the_align_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("drivepercept.batching.ALIGN_WAIT_S", 1.0)
    stop = threading.Event()
    qs = CameraQueues(["c0", "c1"], capacity=8, policy=DropPolicy.BLOCK)
    ring = StagingRing(slots=4, max_batch=2, height=8, width=8, pin_memory=False)
    out: queue.Queue[Batch | None] = queue.Queue(maxsize=4)
    batcher = Batcher(queues=qs, ring=ring, out=out, timeout_ms=5, stop=stop, align=True)
    for k in range(3):
        qs.put(0, _timed_frame(0, k, k / 15), stop=stop)
    t0 = time.monotonic()
    batcher.start()
    first = out.get(timeout=5)
    waited = time.monotonic() - t0
    assert first is not None and first.cameras == (0,) and waited >= 0.95
    ring.release(first.slot)
    second = out.get(timeout=5)  # camera 1 is not waited for again until it delivers
    assert second is not None and second.cameras == (0,)
    assert time.monotonic() - t0 < waited + 0.8  # not a second wait of 1 s
    ring.release(second.slot)
    stop.set()
    batcher.thread.join(timeout=2)
