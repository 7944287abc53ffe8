"""Bounded per-camera frame queues between the decoder threads and the batcher.

All cameras' queues share one lock and condition, so the batcher can wait for "any camera
has a frame, or the timeout expired" without polling. Each queue has a capacity and a named
drop policy; every dropped frame is counted. (A module of its own because both sides use it:
sources put, the batcher takes, and neither may import the other.)
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

from drivepercept.types import DropPolicy, QueuedFrame

T = TypeVar("T")
_POLL_S = 0.1


def put_until_stopped(q: queue.Queue[T], item: T, stop: threading.Event) -> bool:
    """Put into a bounded queue, waiting for room; give up (False) only once `stop` is set.

    A consumer that dies sets `stop` (through the pipeline's error handler), so a producer
    never blocks forever on a full queue, the failure mode of many video pipelines.
    """
    while True:
        try:
            q.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            if stop.is_set():
                return False


def take_until_stopped(q: queue.Queue[T | None], stop: threading.Event) -> Iterator[T]:
    """The items of a queue as they come, until a None (the producer's end) or until
    `stop` is set while the queue is empty."""
    while True:
        try:
            item = q.get(timeout=_POLL_S)
        except queue.Empty:
            if stop.is_set():
                return
            continue
        if item is None:
            return
        yield item


class CameraQueues:
    """One bounded deque per camera, one condition for all of them. Thread-safe."""

    def __init__(self, cameras: Sequence[str], *, capacity: int, policy: DropPolicy) -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        self.cameras = tuple(cameras)
        self.capacity = capacity
        self.policy = policy
        self._queues: list[collections.deque[tuple[QueuedFrame, int]]] = [
            collections.deque() for _ in self.cameras
        ]
        self._ended = [False] * len(self.cameras)
        self._dropped = [0] * len(self.cameras)
        self._high_water = [0] * len(self.cameras)
        self.cond = threading.Condition()

    def put(self, camera: int, frame: QueuedFrame, *, stop: threading.Event) -> bool:
        """Queue a frame; returns False if `stop` was set while waiting for room (BLOCK).

        DROP_OLDEST never waits: when the queue is full its oldest frame is dropped.
        """
        with self.cond:
            q = self._queues[camera]
            while len(q) >= self.capacity:
                if self.policy is DropPolicy.DROP_OLDEST:
                    q.popleft()
                    self._dropped[camera] += 1
                    break
                if stop.is_set():
                    return False
                self.cond.wait(timeout=0.1)
            q.append((frame, time.monotonic_ns()))
            self._high_water[camera] = max(self._high_water[camera], len(q))
            self.cond.notify_all()
            return True

    def end(self, camera: int) -> None:
        """The camera will put no more frames (end of file, error or stop)."""
        with self.cond:
            self._ended[camera] = True
            self.cond.notify_all()

    # The methods below must be called with `cond` held (the batcher holds it while it decides).

    def waiting(self, camera: int) -> int:
        return len(self._queues[camera])

    def ended(self, camera: int) -> bool:
        return self._ended[camera]

    def oldest_queued_ns(self, camera: int) -> int | None:
        """When the oldest waiting frame of a camera was queued (None if none waits)."""
        q = self._queues[camera]
        return q[0][1] if q else None

    def head(self, camera: int) -> QueuedFrame | None:
        """The frame a BLOCK `take` would return next, left in place (None if none waits)."""
        q = self._queues[camera]
        return q[0][0] if q else None

    def take(self, camera: int) -> tuple[QueuedFrame, int]:
        """Next frame of a camera and the time it was queued.

        BLOCK takes the oldest waiting frame (replay processes every frame in order).
        DROP_OLDEST takes the newest and drops (and counts) the older ones: newest wins.
        """
        q = self._queues[camera]
        if self.policy is DropPolicy.DROP_OLDEST:
            item = q.pop()
            self._dropped[camera] += len(q)
            q.clear()
        else:
            item = q.popleft()
        self.cond.notify_all()  # room for a blocked decoder
        return item

    def waiting_frames(self, camera: int) -> list[QueuedFrame]:
        """The frames waiting for a camera, oldest first, left in place."""
        return [frame for frame, _ in self._queues[camera]]

    def take_oldest(self, camera: int, count: int) -> list[tuple[QueuedFrame, int]]:
        """The `count` oldest waiting frames of a camera and when each was queued, whatever
        the policy: none dropped (the deadline scheduler answers each one)."""
        q = self._queues[camera]
        taken = [q.popleft() for _ in range(min(count, len(q)))]
        self.cond.notify_all()  # room for a blocked decoder
        return taken

    def all_done(self) -> bool:
        """Every camera ended and nothing waits."""
        return all(self._ended) and not any(self._queues)

    def dropped(self) -> list[int]:
        with self.cond:
            return list(self._dropped)

    def high_water(self) -> list[int]:
        """Most frames ever waiting in each queue (it never exceeds the capacity)."""
        with self.cond:
            return list(self._high_water)
