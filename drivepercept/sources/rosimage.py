"""Image messages of robotics recordings -> frames: ROS 1/2 `sensor_msgs` `CompressedImage`
and `Image`, Foxglove's `CompressedImage` and `RawImage`, however they were decoded (ROS
message objects, protobuf messages, or JSON dicts).

Every message is held to the one frame limit (`imagesize`) before its pixels are touched:
a compressed image's size is read from its header (`frame_refusal`), a raw image's from its
width, height and step, and one too large, or whose header does not say, is refused here
(`CorruptFrameError`: the reader skips and counts it). A compressed image is then handed
over still encoded (`RawFrame.jpeg`): it is decoded on first use, so that a live-paced frame
dropped for a newer one is never decoded. A raw image is converted to BGR at once (a copy
and at most one `cvtColor`; deferring it would not save memory: the message's bytes are as
large as the converted frame, and a `bgr8` frame is a view of them). The Bayer names follow
ROS (`bayer_rggb8`: the first row reads R G); OpenCV names its conversions after the second
row's pattern, hence the table.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.sources.imagesize import MAX_FRAME_BYTES, frame_refusal, size_refusal
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
# bytes a raw image's row may hold beyond its pixels (a driver's alignment: 4 to 4096)
MAX_ROW_PADDING = 4096


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
    """A raw image's bytes as a BGR image, its layout checked first (`raw_layout`).

    Raises:
        UnsupportedEncodingError: an encoding not in `ENCODINGS`.
        CorruptFrameError: a layout `raw_layout` refuses, or bytes that do not hold
            `height` rows of `step` bytes.
    """
    step = raw_layout(width=width, height=height, step=step, encoding=encoding)
    if len(data) < step * height:
        raise CorruptFrameError(
            f"a {width}x{height} {encoding} image needs {height} rows of {step} bytes, "
            f"got {len(data)} bytes"
        )
    enc = encoding.lower()
    channels = _CHANNELS.get(enc, 1)
    rows = np.frombuffer(data, np.uint8, count=step * height).reshape(height, step)
    pixels = rows[:, : width * channels].reshape(height, width, channels)
    code = _TO_BGR[enc]
    if code is None:
        return np.ascontiguousarray(pixels)
    src = pixels[:, :, 0] if channels == 1 else pixels
    return np.asarray(cv2.cvtColor(np.ascontiguousarray(src), code), np.uint8)


def raw_layout(*, width: int, height: int, step: int, encoding: str) -> int:
    """A raw image's row length in bytes (`step`; 0: its pixels alone), checked against the
    frame limit from the message's fields alone, before its data is touched.

    Raises:
        UnsupportedEncodingError: an encoding not in `ENCODINGS`.
        CorruptFrameError: a size over the limit (or not positive), rows shorter than their
            pixels or padded beyond `MAX_ROW_PADDING`, or more bytes than any frame.
    """
    enc = encoding.lower()
    if enc not in _TO_BGR:
        raise UnsupportedEncodingError(
            f"unsupported image encoding {encoding!r}; supported: {', '.join(ENCODINGS)}"
        )
    why = size_refusal(width, height)
    if why is not None:
        raise CorruptFrameError(f"a raw {encoding} image refused: {why}")
    pixels = width * _CHANNELS.get(enc, 1)
    step = step or pixels
    if not pixels <= step <= pixels + MAX_ROW_PADDING or step * height > MAX_FRAME_BYTES:
        raise CorruptFrameError(
            f"a raw {width}x{height} {encoding} image refused: rows of {step} bytes for "
            f"{pixels} bytes of pixels (at most {MAX_ROW_PADDING} of padding)"
        )
    return step


def _length(data: Any) -> int:
    """How many bytes `data` holds, without converting it (base64 text: decoded)."""
    if isinstance(data, str):
        return len(data) * 3 // 4
    if isinstance(data, np.ndarray):
        return int(data.nbytes)
    return len(data)


def to_frame(msg: Any, typename: str, *, log_time_ns: int, arrived_ns: int) -> RawFrame:
    """One image message as a frame stamped with its own time (else its log time).

    Raises:
        UnsupportedEncodingError: a raw image in an encoding not converted.
        CorruptFrameError: a message without image data, raw bytes of the wrong size, or a
            frame refused before decoding (over the frame limit, or a compressed image
            whose header does not say its size).
    """
    stamp = stamp_ns(msg) or log_time_ns
    data = field(msg, "data")
    if data is None:
        raise CorruptFrameError(f"a {typename} message without data")
    if _length(data) > MAX_FRAME_BYTES:
        raise CorruptFrameError(
            f"a {typename} message of {_length(data)} bytes refused: more than the "
            f"{MAX_FRAME_BYTES} a frame may be"
        )
    if typename in COMPRESSED:
        blob = _bytes(data)
        if not blob:
            raise CorruptFrameError(f"an empty {typename} message")
        why = frame_refusal(blob)
        if why is not None:  # dropped here: never held in the reader's reorder window
            raise CorruptFrameError(f"a {typename} refused before decoding: {why}")
        return RawFrame(None, stamp / 1e9, arrived_ns, jpeg=blob, stamp_ns=stamp, checked=True)
    width, height = int(field(msg, "width") or 0), int(field(msg, "height") or 0)
    step, encoding = int(field(msg, "step") or 0), str(field(msg, "encoding") or "")
    raw_layout(width=width, height=height, step=step, encoding=encoding)  # before the data
    # the readers' own uint8 array is read in place: a raw 1080p frame is not copied first
    flat = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 1
    image = raw_to_bgr(
        data if flat else _bytes(data), width=width, height=height, step=step, encoding=encoding
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
