"""In-memory frame readers for pipeline tests: exact pixels, chosen pace, chosen failures."""

from __future__ import annotations

import threading
import time

import numpy as np

from drivepercept.sources.readers import RawFrame, ReaderStatus, SourceInfo
from drivepercept.types import CameraState


class FakeReader:
    """`frames` frames of `size`, each filled with its index; optional pace and failure."""

    def __init__(
        self,
        *,
        size: tuple[int, int] = (64, 48),
        frames: int = 10,
        fps: float = 30.0,
        pace_s: float = 0.0,
        fail_at: int | None = None,
    ) -> None:
        self.info = SourceInfo(size[0], size[1], fps, frames)
        self.frames = frames
        self.pace_s = pace_s
        self.fail_at = fail_at
        self.index = 0
        self.ended = False
        self.closed = threading.Event()

    def read(self) -> RawFrame | None:
        if self.index >= self.frames:
            self.ended = True
            return None
        if self.fail_at is not None and self.index == self.fail_at:
            raise RuntimeError(f"camera broke at frame {self.index}")
        started_ns = time.monotonic_ns()
        if self.pace_s:
            time.sleep(self.pace_s)
        w, h = self.info.width, self.info.height
        image = np.full((h, w, 3), self.index % 256, dtype=np.uint8)
        pts = self.index / self.info.fps
        self.index += 1
        return RawFrame(image, pts, started_ns)

    def status(self) -> ReaderStatus:
        return ReaderStatus(CameraState.ENDED if self.ended else CameraState.STREAMING)

    def close(self) -> None:
        self.closed.set()
