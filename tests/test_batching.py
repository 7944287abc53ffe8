"""Camera queues and the batcher, driven directly with hand-made frames."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

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
