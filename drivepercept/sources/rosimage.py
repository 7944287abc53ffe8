"""Image messages of robotics recordings -> frames: ROS 1/2 `sensor_msgs` `CompressedImage`
and `Image`, Foxglove's `CompressedImage` and `RawImage`, however they were decoded (ROS
message objects, protobuf messages, or JSON dicts).

A compressed image is handed over still encoded (`RawFrame.jpeg`): it is decoded on first
use, so that a live-paced frame dropped for a newer one is never decoded. A raw image is
converted to BGR at once (a copy and at most one `cvtColor`). The Bayer names follow ROS
(`bayer_rggb8`: the first row reads R G); OpenCV names its conversions after the second
row's pattern, hence the table.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.sources.readers import CorruptFrameError, RawFrame, SourceError
from drivepercept.types import ImageU8

COMPRESSED = frozenset(
    {
        "sensor_msgs/msg/CompressedImage",
        "sensor_msgs/CompressedImage",
        "foxglove.CompressedImage",
        "foxglove_msgs/msg/CompressedImage",
    }
)
RAW = frozenset(
    {
        "sensor_msgs/msg/Image",
        "sensor_msgs/Image",
        "foxglove.RawImage",
        "foxglove_msgs/msg/RawImage",
    }
)
IMAGE_TYPES = COMPRESSED | RAW
CAMERA_INFO_TYPES = frozenset(
    {"sensor_msgs/msg/CameraInfo", "sensor_msgs/CameraInfo", "foxglove.CameraCalibration"}
)

_TO_BGR: Mapping[str, int | None] = {
    "bgr8": None,
    "rgb8": cv2.COLOR_RGB2BGR,
    "bgra8": cv2.COLOR_BGRA2BGR,
    "rgba8": cv2.COLOR_RGBA2BGR,
    "mono8": cv2.COLOR_GRAY2BGR,
    "8uc1": cv2.COLOR_GRAY2BGR,
    "8uc3": None,
    "bayer_rggb8": cv2.COLOR_BayerBG2BGR,
    "bayer_bggr8": cv2.COLOR_BayerRG2BGR,
    "bayer_gbrg8": cv2.COLOR_BayerGR2BGR,
    "bayer_grbg8": cv2.COLOR_BayerGB2BGR,
}
_CHANNELS = {"bgra8": 4, "rgba8": 4, "rgb8": 3, "bgr8": 3, "8uc3": 3}
ENCODINGS = tuple(k for k in _TO_BGR if not k.startswith("8uc"))


class UnsupportedEncodingError(SourceError):
    """A raw image in an encoding drivepercept does not convert."""


def field(msg: Any, *names: str) -> Any:
    """The first of `names` that `msg` has (attribute or key); None when it has none."""
    for name in names:
        if isinstance(msg, Mapping):
            if name in msg:
                return msg[name]
        elif hasattr(msg, name):
            return getattr(msg, name)
    return None


def stamp_ns(msg: Any) -> int:
    """The message's own time in ns: `header.stamp` (ROS) or `timestamp` (Foxglove); 0 when
    it has none (the caller then uses the log time)."""
    header = field(msg, "header")
    stamp = field(header, "stamp") if header is not None else field(msg, "timestamp")
    if stamp is None:
        return 0
    sec = field(stamp, "sec", "secs", "seconds") or 0
    nsec = field(stamp, "nanosec", "nsec", "nsecs", "nanos") or 0
    return int(sec) * 1_000_000_000 + int(nsec)


def _bytes(data: Any) -> bytes:
    if isinstance(data, str):  # Foxglove's JSON encoding: base64
        return base64.b64decode(data)
    if isinstance(data, np.ndarray):
        return data.tobytes()
    return bytes(data)


def raw_to_bgr(
    data: bytes | npt.NDArray[np.uint8], *, width: int, height: int, step: int, encoding: str
) -> ImageU8:
    """A raw image's bytes as a BGR image.

    Raises:
        UnsupportedEncodingError: an encoding not in `ENCODINGS`.
        CorruptFrameError: the bytes do not hold `height` rows of `step` bytes.
    """
    enc = encoding.lower()
    if enc not in _TO_BGR:
        raise UnsupportedEncodingError(
            f"unsupported image encoding {encoding!r}; supported: {', '.join(ENCODINGS)}"
        )
    channels = _CHANNELS.get(enc, 1)
    step = step or width * channels
    if width <= 0 or height <= 0 or step < width * channels or len(data) < step * height:
        raise CorruptFrameError(
            f"a {width}x{height} {encoding} image needs {height} rows of {step} bytes, "
            f"got {len(data)} bytes"
        )
    rows = np.frombuffer(data, np.uint8, count=step * height).reshape(height, step)
    pixels = rows[:, : width * channels].reshape(height, width, channels)
    code = _TO_BGR[enc]
    if code is None:
        return np.ascontiguousarray(pixels)
    src = pixels[:, :, 0] if channels == 1 else pixels
    return np.asarray(cv2.cvtColor(np.ascontiguousarray(src), code), np.uint8)


def to_frame(msg: Any, typename: str, *, log_time_ns: int, arrived_ns: int) -> RawFrame:
    """One image message as a frame stamped with its own time (else its log time).

    Raises:
        UnsupportedEncodingError: a raw image in an encoding not converted.
        CorruptFrameError: a message without image data, or raw bytes of the wrong size.
    """
    stamp = stamp_ns(msg) or log_time_ns
    data = field(msg, "data")
    if data is None:
        raise CorruptFrameError(f"a {typename} message without data")
    if typename in COMPRESSED:
        blob = _bytes(data)
        if not blob:
            raise CorruptFrameError(f"an empty {typename} message")
        return RawFrame(None, stamp / 1e9, arrived_ns, jpeg=blob, stamp_ns=stamp)
    # the readers' own uint8 array is read in place: a raw 1080p frame is not copied first
    flat = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1
    image = raw_to_bgr(
        data if flat else _bytes(data),
        width=int(field(msg, "width") or 0),
        height=int(field(msg, "height") or 0),
        step=int(field(msg, "step") or 0),
        encoding=str(field(msg, "encoding") or ""),
    )
    return RawFrame(image, stamp / 1e9, arrived_ns, stamp_ns=stamp)


def intrinsics_of(msg: Any) -> tuple[int, int, float, float, float, float] | None:
    """(width, height, fx, fy, cx, cy) of a `CameraInfo` / `foxglove.CameraCalibration`, or
    None when its K matrix is empty or not a pinhole's."""
    k = field(msg, "k", "K")
    if k is None:
        return None
    values = [float(v) for v in np.asarray(k, np.float64).reshape(-1).tolist()]
    if len(values) != 9 or values[0] <= 0 or values[4] <= 0:
        return None
    width, height = int(field(msg, "width") or 0), int(field(msg, "height") or 0)
    return width, height, values[0], values[4], values[2], values[5]
