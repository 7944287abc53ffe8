"""A rig's recorded frames read again, by camera and frame index, for offline re-tracking.

The tracking stage reads each box's looks from the frame the model saw (issue 44). A run's
`detections.jsonl` keeps the boxes, not the pixels, so `retrack` over a run's lines tracked
on motion alone, and its ids were not the replay's. `RecordedFrames` opens every camera's
recording with the replay's own readers (`sources.open.open_cameras`, as fast as they
decode: video files, image folders, recorded topics) and hands `retrack` the frame a line
names. Frames are counted as the replay's decoders count them (a frame that does not decode
is skipped and not counted), and a frame whose presentation time is not the line's is not
handed over (a recording that is not the run's): that frame is tracked on motion alone.

Each camera is read forward once and only its latest frame is kept (one frame a camera in
memory), so frames must be asked for in each camera's order, as `retrack` does; a frame
behind the one read, or past the recording's end, is None.
"""

from __future__ import annotations

import logging
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

PTS_TOLERANCE_S = 1e-3  # a line's pts_s (rounded in the jsonl) and its frame's


class _Camera:
    """One camera's reader, read forward: its latest frame, its index and time."""

    def __init__(self, reader: FrameReader) -> None:
        self.reader: FrameReader | None = reader
        self.index = -1  # of the frame held
        self.image: ImageU8 | None = None
        self.pts_s = 0.0

    def at(self, frame_index: int) -> tuple[ImageU8, float] | None:
        while self.reader is not None and self.index < frame_index:
            self._next()
        if self.index != frame_index or self.image is None:
            return None
        return self.image, self.pts_s

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
        except (CorruptFrameError, cv2.error):  # skipped and not counted, as in a replay
            return
        self.index += 1
        self.image, self.pts_s = image, got.pts_s

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.reader, self.image = None, None


class RecordedFrames:
    """`(camera, frame_index, pts_s) -> the frame's BGR pixels or None` over a rig's
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

    def __call__(self, camera: str, frame_index: int, pts_s: float) -> ImageU8 | None:
        cam = self._cameras.get(camera)
        got = None if cam is None else cam.at(frame_index)
        if got is None or abs(got[1] - pts_s) > PTS_TOLERANCE_S:
            self.missed += 1
            return None
        self.handed += 1
        return got[0]

    def close(self) -> None:
        for cam in self._cameras.values():
            cam.close()

    def __enter__(self) -> RecordedFrames:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
