"""`--show`: a tiled live window with boxes, fps and latency per camera (OpenCV highgui).

Drawn on the completion thread at most `refresh_hz` times a second, so a slow screen never
slows the pipeline by more than one small redraw per interval. Pressing q or Esc in the window
asks the run to stop (`on_quit`). Where OpenCV has no GUI (opencv-python-headless) or there is
no display, creating the sink raises OutputError, and the caller runs without a window.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence

import cv2
import numpy as np

from drivepercept.errors import OutputError
from drivepercept.sinks.base import ClosingSink
from drivepercept.sinks.video import annotated_tile
from drivepercept.types import FrameResult, ImageU8

WINDOW = "drivepercept"
TILE = (480, 270)


class DisplaySink(ClosingSink):
    """Shows the newest annotated frame of every camera in one window.

    Args:
        cameras: camera names, in tile order.
        refresh_hz: most redraws per second.
        on_quit: called once when the user presses q or Esc.

    Raises:
        OutputError: no GUI or no display.
    """

    def __init__(
        self,
        cameras: Sequence[str],
        *,
        refresh_hz: float = 20.0,
        on_quit: Callable[[], None] | None = None,
    ) -> None:
        try:
            cv2.namedWindow(WINDOW, cv2.WINDOW_NORMAL)
        except cv2.error as exc:
            raise OutputError(f"cannot open a window for --show: {str(exc).strip()}") from None
        self.cameras = list(cameras)
        self.columns = math.ceil(math.sqrt(len(self.cameras)))
        self.rows = math.ceil(len(self.cameras) / self.columns)
        self.interval_s = 1.0 / refresh_hz
        self.on_quit = on_quit
        self._tiles: list[ImageU8 | None] = [None] * len(self.cameras)
        self._emitted: list[deque[float]] = [deque(maxlen=64) for _ in self.cameras]
        self._last_draw = 0.0
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
        self._tiles[i] = annotated_tile(result, image_bgr, TILE, header=header)
        if now - self._last_draw >= self.interval_s:
            self._last_draw = now
            self._draw()

    def _draw(self) -> None:
        tile_w, tile_h = TILE
        canvas = np.zeros((self.rows * tile_h, self.columns * tile_w, 3), np.uint8)
        for index, tile in enumerate(self._tiles):
            if tile is not None:
                row, col = divmod(index, self.columns)
                canvas[row * tile_h : (row + 1) * tile_h, col * tile_w : (col + 1) * tile_w] = tile
        cv2.imshow(WINDOW, canvas)
        key = cv2.waitKey(1) & 0xFF
        if key in (ord("q"), 27) and self.on_quit is not None:
            self.on_quit()
            self.on_quit = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            cv2.destroyWindow(WINDOW)
            cv2.waitKey(1)
        except cv2.error:
            pass
