"""`drivepercept simulate --format mcap`: the synthetic rig as one MCAP file, as a robot
records a drive, with the exact labels inside.

The file (ROS 2 profile, written by `drivepercept.recording.mcapfile.McapOut`) holds, for
each camera `<cam>` of the rig:

* `/<cam>/image/compressed`: `sensor_msgs/msg/CompressedImage`, JPEG at `JPEG_QUALITY`;
* `/<cam>/camera_info`: `sensor_msgs/msg/CameraInfo` of the rig's pinhole intrinsics, with the
  first frame and then once a second (a player that starts late still finds one);
* `/<cam>/ground_truth`: `foxglove.ImageAnnotations`, the labelled boxes with their class and
  track id, drawn over the image in Foxglove's Image panel;

and the whole COCO ground truth (the bytes of `ground_truth.json`) as an attachment of that
name, which `drivepercept eval drive.mcap` scores against; the `[simulation]` settings as the
metadata record `simulation`. Frame k of every camera is stamped (header stamp and log time)
`stamp_ns(k, fps)`: a fixed base plus k / fps, so that the same seed writes the same file.
The rig's geometry (extrinsics) is not in the file: `rig.toml` beside it carries it.

Writing runs on the `encode` thread (`drivepercept.sim.encode`) in the place of the MP4
encoders; `close` always finishes the file, so an interrupted simulation leaves a valid MCAP
of the frames rendered so far.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.errors import OutputError
from drivepercept.recording import messages
from drivepercept.recording.mcapfile import PROFILE_ROS2, McapOut
from drivepercept.rig import CameraConfig
from drivepercept.sim.encode import EncodeThread
from drivepercept.sim.models import Category
from drivepercept.sim.render import GroundTruthBox

MCAP_FILE = "drive.mcap"
# JPEG is intra-only, so no quality matches MP4's size: at 85 a 640x360 frame is ~19 KB and
# 40 dB PSNR (the MP4 path: ~3.5 KB a frame, 37 dB), encoded in ~1 ms
JPEG_QUALITY = 85
STAMP_BASE_NS = 1_767_225_600 * 1_000_000_000  # 2026-01-01T00:00:00Z: never 0, always the same
_JSON = "application/json"

# box colours in Foxglove (RGB, 0-1), one per class
_CLASS_RGB: Mapping[Category, tuple[float, float, float]] = {
    Category.CAR: (0.2, 0.6, 1.0),
    Category.TRUCK: (0.1, 0.3, 0.9),
    Category.BUS: (0.5, 0.2, 0.9),
    Category.PEDESTRIAN: (1.0, 0.3, 0.3),
    Category.CYCLIST: (1.0, 0.6, 0.1),
    Category.TRAFFIC_LIGHT: (0.2, 0.9, 0.3),
    Category.TRAFFIC_SIGN: (1.0, 0.9, 0.2),
}

_Instant = tuple[int, Sequence[npt.NDArray[np.uint8]], Sequence[Sequence[GroundTruthBox]]]


def image_topic(camera: str) -> str:
    """A camera's image topic (`drivepercept.sources.recordings` names the camera from it)."""
    return f"/{camera}/image/compressed"


def info_topic(camera: str) -> str:
    """A camera's calibration topic, in its image topic's namespace."""
    return f"/{camera}/camera_info"


def annotation_topic(camera: str) -> str:
    """A camera's ground-truth boxes (`foxglove.ImageAnnotations`)."""
    return f"/{camera}/ground_truth"


def stamp_ns(frame_index: int, fps: float) -> int:
    """The stamp of frame `frame_index` of every camera, in nanoseconds."""
    return STAMP_BASE_NS + round(frame_index * 1e9 / fps)


class McapClipWriter:
    """Writes rendered instants into one MCAP file on the `encode` thread.

    Args:
        path: the file to create.
        cameras: the rig's cameras, in render order (each with its intrinsics).
        fps: the rig's frame rate (the stamps' spacing).
        metadata: written as the metadata record `simulation`.

    Raises:
        ConfigError: the `[ros]` extra is not installed.
        OutputError: the file cannot be created.
    """

    def __init__(
        self,
        path: Path,
        cameras: Sequence[CameraConfig],
        *,
        fps: float,
        metadata: Mapping[str, object],
    ) -> None:
        self.path = path
        self._cameras = tuple(cameras)
        self._fps = fps
        self._info_every = max(1, round(fps))
        self._out = McapOut(path, profile=PROFILE_ROS2)
        try:
            self._out.metadata("simulation", {k: str(v) for k, v in metadata.items()})
            self._thread: EncodeThread[_Instant] = EncodeThread(self._write, what="MCAP writing")
        except BaseException:
            self._out.close()
            raise

    def submit(
        self,
        frame_index: int,
        images: Sequence[npt.NDArray[np.uint8]],
        boxes: Sequence[Sequence[GroundTruthBox]],
    ) -> None:
        """Queue one instant: camera i's image and ground-truth boxes (blocks while full)."""
        self._thread.submit((frame_index, images, boxes))

    def _write(self, instant: _Instant) -> None:
        """Runs on the `encode` thread: every camera's messages of one instant."""
        k, images, boxes = instant
        stamp = stamp_ns(k, self._fps)
        for cam, image, cam_boxes in zip(self._cameras, images, boxes, strict=True):
            if k % self._info_every == 0:
                self._camera_info(cam, stamp)
            ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
            if not ok:
                raise OutputError(f"cannot JPEG-encode frame {k} of camera {cam.name}")
            msg = messages.compressed_image(stamp, cam.name, "jpeg", jpeg.tobytes())
            self._out.ros2(image_topic(cam.name), messages.COMPRESSED_IMAGE, msg, log_time_ns=stamp)
            self._out.json(
                annotation_topic(cam.name),
                messages.IMAGE_ANNOTATIONS,
                _annotations(stamp, cam_boxes),
                log_time_ns=stamp,
            )

    def _camera_info(self, cam: CameraConfig, stamp: int) -> None:
        k, size = cam.intrinsics, cam.size
        assert k is not None and size is not None, "a simulated camera has intrinsics and a size"
        msg = messages.camera_info(
            stamp,
            cam.name,
            width=size[0],
            height=size[1],
            fx=k.fx,
            fy=k.fy,
            cx=k.cx,
            cy=k.cy,
        )
        self._out.ros2(info_topic(cam.name), messages.CAMERA_INFO, msg, log_time_ns=stamp)

    def close(self, *, ground_truth: Path | None) -> None:
        """Write what is queued, attach `ground_truth` (under its file name; None: the ground
        truth could not be written) and finish the file, which is closed whatever fails.

        Raises:
            OutputError: writing failed (on the thread, or here).
        """
        try:
            self._thread.stop()
            if ground_truth is not None:
                try:
                    data = ground_truth.read_bytes()
                except OSError as exc:
                    raise OutputError(f"cannot read {ground_truth}: {exc.strerror}") from None
                self._out.attach(
                    ground_truth.name, data, media_type=_JSON, log_time_ns=STAMP_BASE_NS
                )
        finally:
            self._out.close()
        self._thread.raise_if_failed()


def _annotations(stamp: int, boxes: Sequence[GroundTruthBox]) -> dict[str, object]:
    xyxy = np.array([b.xyxy for b in boxes], np.float64).reshape(-1, 4)
    labels = [f"{b.category.label} #{b.track_id}" for b in boxes]
    colors = [_CLASS_RGB[b.category] for b in boxes]
    return messages.image_annotations(stamp, xyxy, labels, colors)
