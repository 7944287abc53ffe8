"""A rig's recorded frames read again, by camera and time, for offline re-tracking.

The tracking stage reads each box's looks from the frame the model saw (issue 44). A run's
`detections.jsonl` keeps the boxes, not the pixels, so `retrack` over a run's lines tracked
on motion alone, and its ids were not the replay's. `RecordedFrames` opens every camera's
recording with the replay's own readers (`sources.open.open_cameras`, as fast as they
decode: video files, image folders, recorded topics) and hands `retrack` the frame a line
names, found by its presentation time (`pts_s`, as the line has it): a frame that does not
decode is skipped here, and a run whose decoder deferred decoding (`replay --realtime`,
live) counted it in its frame indices, so the index alone could name the wrong frame. A
line whose time no frame has (a recording that is not the run's) gets None: that frame is
tracked on motion alone.

Each camera is read forward once and only its latest frame is kept (one frame a camera in
memory), so frames must be asked for in each camera's time order, as `retrack` does; a
frame behind the one read, or past the recording's end, is None.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Sequence
from types import TracebackType

import cv2

from drivepercept.config import ReconnectPolicy
from drivepercept.rig import CameraConfig
from drivepercept.sources.open import open_cameras
from drivepercept.sources.readers import CorruptFrameError, FrameReader
from drivepercept.types import ImageU8, Pacing

log = logging.getLogger(__name__)

PTS_TOLERANCE_S = 1e-3  # a line's pts_s and its frame's (the same float, unless the reader's
# time base rounds differently between two reads of one file)


class _Camera:
    """One camera's reader, read forward: its latest frame and that frame's time."""

    def __init__(self, reader: FrameReader) -> None:
        self.reader: FrameReader | None = reader
        self.image: ImageU8 | None = None
        self.pts_s = -math.inf  # of the frame held

    def at(self, pts_s: float) -> ImageU8 | None:
        """The frame at `pts_s` (within `PTS_TOLERANCE_S`), reading forward to it."""
        while self.reader is not None and self.pts_s < pts_s - PTS_TOLERANCE_S:
            self._next()
        if self.image is None or not abs(self.pts_s - pts_s) <= PTS_TOLERANCE_S:
            return None  # (a NaN time matches nothing)
        return self.image

    def _next(self) -> None:
        assert self.reader is not None
        try:
            got = self.reader.read()
        except Exception as exc:  # the replay's decoder ends the camera here too
            log.warning("recorded frames: a camera's reader failed: %s", exc)
            got = None
        if got is None:
            self.close()
            return
        try:
            image = got.image_bgr
        except (CorruptFrameError, cv2.error):  # skipped, as in a replay
            return
        self.image, self.pts_s = image, got.pts_s
        if not math.isfinite(self.pts_s):  # no time to find it by: nothing after it either
            self.close()

    def close(self) -> None:
        reader, self.reader, self.image = self.reader, None, None
        if reader is not None:
            reader.close()


class RecordedFrames:
    """`(camera, pts_s) -> the frame's BGR pixels or None` over a rig's
    recordings (a camera with only a live source has none: None); a context manager (it
    closes the readers).

    Raises:
        ConfigError, SourceError: as a replay's, for a camera that cannot be opened (every
            reader is opened here, before any frame is read).
    """

    def __init__(self, cameras: Sequence[CameraConfig]) -> None:
        recorded = [cam for cam in cameras if cam.video is not None]  # (not a live source)
        names = [cam.name for cam in recorded]
        readers = open_cameras(
            recorded,
            pacing=Pacing.AS_FAST_AS_POSSIBLE,
            policy=ReconnectPolicy(),
            stop=threading.Event(),
        )
        self._cameras = {name: _Camera(r) for name, r in zip(names, readers, strict=True)}
        self.handed = 0  # frames handed over
        self.missed = 0  # frames asked for and not handed over

    def __call__(self, camera: str, pts_s: float) -> ImageU8 | None:
        """The camera's frame at `pts_s` (found by time, not index: the module docstring)."""
        cam = self._cameras.get(camera)
        image = None if cam is None else cam.at(pts_s)
        if image is None:
            self.missed += 1
            return None
        self.handed += 1
        return image

    def close(self) -> None:
        """Every reader closed (one that fails to close does not keep the others open)."""
        with contextlib.ExitStack() as stack:
            for cam in self._cameras.values():
                stack.callback(cam.close)

    def __enter__(self) -> RecordedFrames:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
