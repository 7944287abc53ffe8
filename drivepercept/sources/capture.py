"""One connection attempt to a live source: an MJPEG URL read part by part (`mjpeg.py`),
any other stream or a device through OpenCV with open and read timeouts (`CaptureReader`), a
file as a file. `LiveSource` (`live.py`) makes the attempts and reconnects."""

from __future__ import annotations

import time

import cv2
import numpy as np

from drivepercept.config import ReconnectPolicy
from drivepercept.rig import is_device, is_stream
from drivepercept.sources.mjpeg import MjpegReader, NotMjpegError
from drivepercept.sources.probe import why_not_open
from drivepercept.sources.readers import (
    AUTO_THREADS,
    FrameReader,
    RawFrame,
    SourceError,
    SourceInfo,
    open_reader,
)
from drivepercept.types import CameraState, ImageU8, ReaderStatus


class CaptureReader:
    """A device or network stream read with cv2.VideoCapture, with open and read timeouts
    (FFmpeg backend) so that a dead server is noticed instead of blocking forever."""

    def __init__(self, source: str, *, policy: ReconnectPolicy) -> None:
        self.source = source
        if is_device(source):
            target: int | str = int(source) if source.isdigit() else source
            self._cap = cv2.VideoCapture(target)
        else:
            params = [
                cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
                int(policy.open_timeout_s * 1000),
                cv2.CAP_PROP_READ_TIMEOUT_MSEC,
                int(policy.read_timeout_s * 1000),
            ]
            self._cap = cv2.VideoCapture(source, cv2.CAP_FFMPEG, params)
        if not self._cap.isOpened():
            self._cap.release()
            # OpenCV does not say why: ask the server (HTTP 404, refused, unauthorized, ...)
            why = why_not_open(source, timeout_s=min(3.0, policy.open_timeout_s))
            raise SourceError(f"cannot open {source}" + (f": {why}" if why else ""))
        fps = self._cap.get(cv2.CAP_PROP_FPS)
        self.info = SourceInfo(
            int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
            int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
            fps if 0 < fps < 1000 else 0.0,
            -1,
        )
        self._t0 = time.monotonic_ns() / 1e9

    def read(self) -> RawFrame | None:
        ok, raw = self._cap.read()
        if not ok or raw is None:
            return None
        # a live read waits for the camera: the frame was captured when it arrived
        arrived_ns = time.monotonic_ns()
        image: ImageU8 = np.asarray(raw, dtype=np.uint8)
        return RawFrame(image, arrived_ns / 1e9 - self._t0, arrived_ns)

    def status(self) -> ReaderStatus:
        return ReaderStatus(CameraState.STREAMING, live=True)

    def close(self) -> None:
        self._cap.release()


def open_live_reader(
    source: str, policy: ReconnectPolicy, *, threads: int = AUTO_THREADS
) -> FrameReader:
    """One connection attempt (a video file decoded on `threads` FFmpeg threads). Raises
    SourceError when it fails.

    An http(s) URL is first read as MJPEG by `MjpegReader` (frames handed over undecoded, so
    that only the ones used are decoded); a URL that answers with anything else, and every
    other stream or device, is read by OpenCV.
    """
    if source.lower().startswith(("http://", "https://")):
        try:
            return MjpegReader(source, policy=policy)
        except NotMjpegError:
            pass
    if is_stream(source) or is_device(source):
        return CaptureReader(source, policy=policy)
    return open_reader(source, threads=threads)
