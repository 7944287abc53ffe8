"""Annotated videos: each camera's frames with their boxes drawn on, as MP4 (mp4v).

`FrameResult` carries no pixels, so this sink takes the original BGR frame through
`write_with_image(result, image_bgr)`; the pipeline calls that instead of `write` for sinks that
satisfy `drivepercept.sinks.ImageSink`.

Two layouts:

* per camera (default): `<camera>.mp4`, opened on the camera's first frame at that frame's size
  (an odd width or height is padded to even with black, as MPEG-4 needs).
* mosaic: one `mosaic.mp4`, a grid of `ceil(sqrt(n))` columns with one tile per camera (slot =
  `camera_index`), each frame letterboxed into the tile. The newest frame of each camera is kept;
  a mosaic frame is written whenever camera 0's frame arrives, showing the round that just ended
  (camera 0's previous frame and the newest frame of every other camera), and once more at
  `close()`. So the mosaic has one frame per camera-0 frame, and runs at camera 0's rate; while
  camera 0 delivers nothing (a dead live camera), the mosaic does not advance.

Encoding happens on the caller's thread (OpenCV releases the GIL while it encodes). An MP4 is
only playable once `close()` has written its index, so the pipeline closes sinks in `finally:`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import cv2
import numpy as np

from drivepercept.errors import OutputError
from drivepercept.sinks._lines import reason
from drivepercept.sinks.annotate import annotated_tile, check_image, draw_detections, frame_header
from drivepercept.sinks.base import ClosingSink
from drivepercept.types import FrameResult, ImageU8

log = logging.getLogger(__name__)

MOSAIC_FILE = "mosaic.mp4"
TILE_SIZE = (480, 270)  # (width, height) of one camera's tile in the mosaic


class _VideoFile:
    """One MP4 opened lazily on its first frame, at that frame's size padded to even."""

    def __init__(self, path: Path, *, fps: float) -> None:
        self.path = path
        self.fps = fps
        self.frames = 0
        self.size: tuple[int, int] | None = None  # (width, height) of the video
        self._writer: cv2.VideoWriter | None = None
        self._resize_warned = False

    def write(self, image: ImageU8) -> None:
        height, width = image.shape[:2]
        if self._writer is None:
            self.size = (width + width % 2, height + height % 2)
            writer = cv2.VideoWriter(
                str(self.path), cv2.VideoWriter.fourcc(*"mp4v"), self.fps, self.size
            )
            if not writer.isOpened():
                writer.release()
                raise OutputError(
                    f"cannot open a video writer for {self.path} "
                    f"({self.size[0]}x{self.size[1]} at {self.fps:g} fps)"
                )
            self._writer = writer
            log.debug("writing %s: %dx%d at %g fps", self.path, *self.size, self.fps)
        assert self.size is not None
        if (width, height) != self.size:
            if width % 2 or height % 2:
                pad = ((0, height % 2), (0, width % 2), (0, 0))
                image = np.pad(image, pad)
                height, width = image.shape[:2]
            if (width, height) != self.size:
                if not self._resize_warned:
                    log.warning(
                        "%s: frame size changed from %dx%d to %dx%d; resizing to the first size",
                        self.path.name,
                        *self.size,
                        width,
                        height,
                    )
                    self._resize_warned = True
                resized = cv2.resize(image, self.size, interpolation=cv2.INTER_AREA)
                image = np.asarray(resized, dtype=np.uint8)
        self._writer.write(np.ascontiguousarray(image))
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.release()
            log.debug("closed %s (%d frames)", self.path, self.frames)


class AnnotatedVideoSink(ClosingSink):
    """Writes annotated MP4s, per camera or as one mosaic (see the module docstring).

    Args:
        out_dir: folder for the videos (made if missing).
        fps: frame rate of every video, or per camera name. With a mapping, a camera missing
            from it is an error when its first frame arrives; the mosaic uses camera 0's rate.
        mosaic: write one `mosaic.mp4` tiling all cameras instead of one video per camera.
        cameras: number of cameras (mosaic layout); defaults to `len(fps)` when fps is a
            mapping. Required for a mosaic with a single fps.
        tile_size: (width, height) of one camera's tile in the mosaic.

    Raises:
        OutputError: `out_dir` cannot be created.
        ValueError: a non-positive fps, tile size or camera count, or a mosaic without a
            camera count.
    """

    def __init__(
        self,
        out_dir: Path | str,
        *,
        fps: float | Mapping[str, float],
        mosaic: bool = False,
        cameras: int | None = None,
        tile_size: tuple[int, int] = TILE_SIZE,
    ) -> None:
        rates = fps.values() if isinstance(fps, Mapping) else [fps]
        bad = [r for r in rates if not (math.isfinite(r) and r > 0)]
        if bad:
            raise ValueError(f"fps must be positive, got {fps!r}")
        if cameras is None and isinstance(fps, Mapping) and fps:
            cameras = len(fps)
        if mosaic and cameras is None:
            raise ValueError("a mosaic needs the camera count: give cameras= or fps per camera")
        if cameras is not None and cameras < 1:
            raise ValueError(f"cameras must be at least 1, got {cameras}")
        if min(tile_size) < 2:
            raise ValueError(f"tile_size must be at least 2x2 pixels, got {tile_size}")
        self.out_dir = Path(out_dir)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create video folder {self.out_dir}: {reason(exc)}") from None
        self._fps = fps
        self._mosaic = mosaic
        self._tile_size = tile_size
        self._cameras = cameras or 0
        self._columns = math.ceil(math.sqrt(self._cameras)) if self._cameras else 0
        self._rows = math.ceil(self._cameras / self._columns) if self._cameras else 0
        self._videos: dict[str, _VideoFile] = {}  # per camera name
        self._mosaic_video: _VideoFile | None = None
        self._tiles: list[ImageU8 | None] = [None] * self._cameras
        self._round_open = False  # camera 0 has a frame in the tiles not yet written
        self._closed = False
        self._warned_no_image = False
        self._warned_cameras: set[int] = set()

    @property
    def paths(self) -> tuple[Path, ...]:
        """The videos opened so far."""
        return tuple(video.path for video in self._all_videos())

    def _all_videos(self) -> list[_VideoFile]:
        videos = list(self._videos.values())
        if self._mosaic_video is not None:
            videos.append(self._mosaic_video)
        return videos

    def _rate(self, camera: str) -> float:
        if not isinstance(self._fps, Mapping):
            return float(self._fps)
        try:
            return float(self._fps[camera])
        except KeyError:
            known = ", ".join(sorted(self._fps)) or "none"
            raise ValueError(f"no fps for camera {camera!r}; cameras with one: {known}") from None

    def _camera_video(self, camera: str) -> _VideoFile:
        video = self._videos.get(camera)
        if video is None:
            video = _VideoFile(self.out_dir / f"{camera}.mp4", fps=self._rate(camera))
            self._videos[camera] = video
        return video

    def write(self, result: FrameResult) -> None:
        """A frame without its pixels cannot be drawn: it is skipped (with one warning).

        The pipeline calls `write_with_image` for this sink; `write` exists so that the sink
        still satisfies the common `Sink` protocol.
        """
        if not self._warned_no_image:
            log.warning(
                "annotated video sink got frames without pixels (use write_with_image); "
                "they are not drawn"
            )
            self._warned_no_image = True

    def write_with_image(self, result: FrameResult, image_bgr: ImageU8) -> None:
        """Draw `result` onto a copy of `image_bgr` (the original frame) and encode it.

        Raises:
            OutputError: a video cannot be opened.
            ValueError: the image is not uint8 BGR, the camera has no fps, or the sink is closed.
        """
        if self._closed:
            raise ValueError(f"annotated video sink for {self.out_dir} is closed")
        check_image(image_bgr)
        if not self._mosaic:
            annotated = draw_detections(image_bgr, result.detections, header=frame_header(result))
            self._camera_video(result.camera).write(annotated)
            return
        index = result.camera_index
        if not 0 <= index < self._cameras:
            if index not in self._warned_cameras:
                log.warning(
                    "camera %r has index %d outside the %d-camera mosaic; not shown",
                    result.camera,
                    index,
                    self._cameras,
                )
                self._warned_cameras.add(index)
            return
        if index == 0:
            if self._round_open:
                self._write_mosaic()
            if self._mosaic_video is None:  # the mosaic runs at camera 0's rate
                path = self.out_dir / MOSAIC_FILE
                self._mosaic_video = _VideoFile(path, fps=self._rate(result.camera))
            self._round_open = True
        self._tiles[index] = self._tile(result, image_bgr)

    def _tile(self, result: FrameResult, image_bgr: ImageU8) -> ImageU8:
        return annotated_tile(result, image_bgr, self._tile_size)

    def _write_mosaic(self) -> None:
        tile_w, tile_h = self._tile_size
        canvas = np.zeros((self._rows * tile_h, self._columns * tile_w, 3), np.uint8)
        for index, tile in enumerate(self._tiles):
            if tile is not None:
                row, col = divmod(index, self._columns)
                canvas[row * tile_h : (row + 1) * tile_h, col * tile_w : (col + 1) * tile_w] = tile
        assert self._mosaic_video is not None, "a round opens with camera 0's frame"
        self._round_open = False
        self._mosaic_video.write(canvas)

    def close(self) -> None:
        """Write the last mosaic frame and finalise every video; closing twice is safe."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._round_open:
                self._write_mosaic()
        finally:
            for video in self._all_videos():
                video.close()
