"""`--show`: a tiled live window with boxes, fps and latency per camera (OpenCV highgui).

Drawn on its own `sink-display` thread (a slow sink of the run's SinkSet) at most
`refresh_hz` times a second; between redraws a frame
costs one reference kept (tiles are built only when drawing), so a slow screen never slows the
pipeline by more than one redraw per interval. Every window call (create, show, poll, destroy)
happens on that one thread, as GUI toolkits require. Pressing q or Esc asks the run to stop
(`on_quit`). Where OpenCV has no GUI (opencv-python-headless) the first redraw logs why and the
run goes on without a window. Without a display OpenCV's Qt GUI aborts the process, so the
caller must not create this sink then (the CLI checks).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import cv2
import numpy as np

from drivepercept.sinks.annotate import annotated_tile
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import FrameResult, ImageU8

log = logging.getLogger(__name__)

WINDOW = "drivepercept"
TILE = (480, 270)


class DisplaySink(ClosingSink):
    """Shows the newest annotated frame of every camera in one window.

    Args:
        cameras: camera names, in tile order.
        refresh_hz: most redraws per second.
        on_quit: called once when the user presses q or Esc.

    """

    def __init__(
        self,
        cameras: Sequence[str],
        *,
        refresh_hz: float = 20.0,
        on_quit: Callable[[], object] | None = None,
    ) -> None:
        self.cameras = list(cameras)
        self.columns = math.ceil(math.sqrt(len(self.cameras)))
        self.rows = math.ceil(len(self.cameras) / self.columns)
        self.interval_s = 1.0 / refresh_hz
        self.on_quit = on_quit
        self._latest: list[tuple[FrameResult, ImageU8, str] | None] = [None] * len(self.cameras)
        self._emitted: list[deque[float]] = [deque(maxlen=64) for _ in self.cameras]
        self._last_draw = 0.0
        self._window_thread: threading.Thread | None = None
        self._broken = False
        self._closed = False

    def write(self, result: FrameResult) -> None:
        """Frames without pixels are not shown (the pipeline passes pixels to image sinks)."""

    def write_with_image(self, result: FrameResult, image_bgr: ImageU8) -> None:
        if self._closed:
            return
        i = result.camera_index
        now = time.monotonic()
        times = self._emitted[i]
        times.append(now)
        fps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
        header = f"{result.camera} {fps:.1f} fps {result.timing.end_to_end_ms:.0f} ms"
        self._latest[i] = (result, image_bgr, header)
        if now - self._last_draw >= self.interval_s and not self._broken:
            self._last_draw = now
            try:
                self._draw()
            except cv2.error as exc:
                self._broken = True
                log.warning("--show: no window (%s); running without one", str(exc).strip())

    def _draw(self) -> None:
        if self._window_thread is None:
            cv2.namedWindow(WINDOW, cv2.WINDOW_NORMAL)
            self._window_thread = threading.current_thread()
        tile_w, tile_h = TILE
        canvas = np.zeros((self.rows * tile_h, self.columns * tile_w, 3), np.uint8)
        for index, latest in enumerate(self._latest):
            if latest is not None:
                tile = annotated_tile(latest[0], latest[1], TILE, header=latest[2])
                row, col = divmod(index, self.columns)
                canvas[row * tile_h : (row + 1) * tile_h, col * tile_w : (col + 1) * tile_w] = tile
        cv2.imshow(WINDOW, canvas)
        key = cv2.waitKey(1) & 0xFF
        if key in (ord("q"), 27) and self.on_quit is not None:
            self.on_quit()
            self.on_quit = None

    def close(self) -> None:
        """Stop drawing. The window is destroyed only from the thread that made it; closed
        from another thread it goes with the process."""
        if self._closed:
            return
        self._closed = True
        if self._window_thread is threading.current_thread():
            with contextlib.suppress(cv2.error):
                cv2.destroyWindow(WINDOW)
                cv2.waitKey(1)
