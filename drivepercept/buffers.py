"""The staging ring: pre-allocated batch buffers the batcher writes frames straight into.

Slots are allocated once, at start-up: `(max_batch, H, W, 3)` uint8, in pinned (page-locked)
host memory when CUDA is available so that host-to-device copies can be asynchronous. A slot
is handed out by `acquire()` and comes back with `release()` once the device has finished
reading it (after its copy event completed); a slot in flight is never written.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import numpy.typing as npt
import torch


class StagingRing:
    """Fixed set of uint8 NHWC batch buffers with a free list. Thread-safe."""

    def __init__(
        self, *, slots: int, max_batch: int, height: int, width: int, pin_memory: bool
    ) -> None:
        if slots < 1 or max_batch < 1:
            raise ValueError(f"need >= 1 slot and batch >= 1, got {slots}, {max_batch}")
        self.pinned = pin_memory
        self.tensors = [
            torch.empty((max_batch, height, width, 3), dtype=torch.uint8, pin_memory=pin_memory)
            for _ in range(slots)
        ]
        # numpy views of the same memory: the batcher writes rows with np.copyto (no allocation)
        self.arrays: list[npt.NDArray[np.uint8]] = [t.numpy() for t in self.tensors]
        self._free: queue.Queue[int] = queue.Queue(maxsize=slots)
        for i in range(slots):
            self._free.put(i)
        self._lock = threading.Lock()
        self._in_use: set[int] = set()

    @property
    def slots(self) -> int:
        return len(self.tensors)

    def acquire(self, *, timeout: float) -> int | None:
        """A free slot index, or None if none came free within `timeout` seconds."""
        try:
            slot = self._free.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            assert slot not in self._in_use, f"slot {slot} handed out twice"
            self._in_use.add(slot)
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back; the caller guarantees no device work still reads it."""
        with self._lock:
            if slot not in self._in_use:
                raise ValueError(f"slot {slot} released but not in use")
            self._in_use.remove(slot)
        self._free.put_nowait(slot)

    def in_use(self) -> int:
        with self._lock:
            return len(self._in_use)
