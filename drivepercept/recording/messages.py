"""The messages drivepercept writes into MCAP files, and how each is built.

Two families, each in the encoding its viewers and consumers read:

* **ROS 2** (`cdr`, schema `ros2msg`): `sensor_msgs/msg/CompressedImage`, `CameraInfo` and
  `vision_msgs/msg/Detection2DArray` (vision_msgs 4.x, ROS 2 Humble and later), serialised by
  `rosbags`' type store, which also writes their message definitions.
* **Foxglove** (`json`, schema `jsonschema`): `foxglove.ImageAnnotations` (boxes and labels
  drawn over an image in Foxglove's Image panel), `foxglove.CompressedImage` and plain JSON
  series (latency, load) that its Plot panel reads. Foxglove knows its schemas by name;
  the JSON schemas here describe the fields written, for other readers.

Times are integer nanoseconds on the source's clock (a ROS stamp, or a video's pts).
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from drivepercept.finite import finite

# ------------------------------------------------------------------ ROS 2

COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
RAW_IMAGE = "sensor_msgs/msg/Image"
CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
DETECTION_2D_ARRAY = "vision_msgs/msg/Detection2DArray"

# vision_msgs 4.x (ROS 2 Humble and later): not in rosbags' stores, so declared here
_VISION_MSGS = {
    "vision_msgs/msg/Point2D": "float64 x\nfloat64 y\n",
    "vision_msgs/msg/Pose2D": "vision_msgs/Point2D position\nfloat64 theta\n",
    "vision_msgs/msg/BoundingBox2D": "vision_msgs/Pose2D center\nfloat64 size_x\nfloat64 size_y\n",
    "vision_msgs/msg/ObjectHypothesis": "string class_id\nfloat64 score\n",
    "vision_msgs/msg/ObjectHypothesisWithPose": (
        "vision_msgs/ObjectHypothesis hypothesis\ngeometry_msgs/PoseWithCovariance pose\n"
    ),
    "vision_msgs/msg/Detection2D": (
        "std_msgs/Header header\nvision_msgs/ObjectHypothesisWithPose[] results\n"
        "vision_msgs/BoundingBox2D bbox\nstring id\n"
    ),
    "vision_msgs/msg/Detection2DArray": (
        "std_msgs/Header header\nvision_msgs/Detection2D[] detections\n"
    ),
}


@functools.cache
def typestore() -> Any:
    """rosbags' ROS 2 Humble type store, with vision_msgs registered (built once)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    types: dict[str, Any] = {}
    for name, text in _VISION_MSGS.items():
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return store


def msgdef(typename: str) -> str:
    """The concatenated ROS 2 message definition of `typename` (an MCAP `ros2msg` schema)."""
    text, _ = typestore().generate_msgdef(typename, ros_version=2)
    return str(text)


def serialize(message: Any, typename: str) -> bytes:
    """`message` (a type-store object) as CDR bytes."""
    return bytes(typestore().serialize_cdr(message, typename))


def _header(stamp_ns: int, frame_id: str) -> Any:
    t = typestore().types
    stamp = t["builtin_interfaces/msg/Time"](
        sec=int(stamp_ns // 1_000_000_000), nanosec=int(stamp_ns % 1_000_000_000)
    )
    return t["std_msgs/msg/Header"](stamp=stamp, frame_id=frame_id)


def compressed_image(stamp_ns: int, frame_id: str, fmt: str, data: bytes) -> Any:
    """A `sensor_msgs/msg/CompressedImage` (`fmt`: "jpeg" or "png")."""
    cls = typestore().types[COMPRESSED_IMAGE]
    return cls(
        header=_header(stamp_ns, frame_id),
        format=fmt,
        data=np.frombuffer(data, np.uint8),
    )


def raw_image(stamp_ns: int, frame_id: str, image: npt.NDArray[np.uint8], encoding: str) -> Any:
    """A `sensor_msgs/msg/Image` of a (H, W) or (H, W, C) uint8 array."""
    cls = typestore().types[RAW_IMAGE]
    height, width = image.shape[:2]
    channels = 1 if image.ndim == 2 else image.shape[2]
    return cls(
        header=_header(stamp_ns, frame_id),
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=0,
        step=width * channels,
        data=np.ascontiguousarray(image).reshape(-1),
    )


def camera_info(
    stamp_ns: int,
    frame_id: str,
    *,
    width: int,
    height: int,
    fx: float,
    fy: float,
    cx: float,
    cy: float,
) -> Any:
    """A `sensor_msgs/msg/CameraInfo` of a pinhole camera without distortion."""
    t = typestore().types
    k = np.array([fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0])
    p = np.array([fx, 0.0, cx, 0.0, 0.0, fy, cy, 0.0, 0.0, 0.0, 1.0, 0.0])
    return t[CAMERA_INFO](
        header=_header(stamp_ns, frame_id),
        height=height,
        width=width,
        distortion_model="plumb_bob",
        d=np.zeros(5),
        k=k,
        r=np.eye(3).reshape(-1),
        p=p,
        binning_x=0,
        binning_y=0,
        roi=t["sensor_msgs/msg/RegionOfInterest"](
            x_offset=0, y_offset=0, height=0, width=0, do_rectify=False
        ),
    )


def detection_array(
    stamp_ns: int,
    frame_id: str,
    boxes_xyxy: npt.NDArray[np.floating[Any]],
    class_ids: Sequence[str],
    scores: Sequence[float],
    ids: Sequence[str] | None = None,
) -> Any:
    """A `vision_msgs/msg/Detection2DArray`: each box as centre and size in pixels, its class
    name and score as the one hypothesis (`ids`: a track id per box, where known)."""
    t = typestore().types
    pose = t["geometry_msgs/msg/PoseWithCovariance"](
        pose=t["geometry_msgs/msg/Pose"](
            position=t["geometry_msgs/msg/Point"](x=0.0, y=0.0, z=0.0),
            orientation=t["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0),
        ),
        covariance=np.zeros(36),
    )
    detections = []
    for k, (x1, y1, x2, y2) in enumerate(np.asarray(boxes_xyxy, np.float64).reshape(-1, 4)):
        hypothesis = t["vision_msgs/msg/ObjectHypothesisWithPose"](
            hypothesis=t["vision_msgs/msg/ObjectHypothesis"](
                class_id=str(class_ids[k]), score=float(scores[k])
            ),
            pose=pose,
        )
        bbox = t["vision_msgs/msg/BoundingBox2D"](
            center=t["vision_msgs/msg/Pose2D"](
                position=t["vision_msgs/msg/Point2D"](x=(x1 + x2) / 2, y=(y1 + y2) / 2),
                theta=0.0,
            ),
            size_x=float(x2 - x1),
            size_y=float(y2 - y1),
        )
        detections.append(
            t["vision_msgs/msg/Detection2D"](
                header=_header(stamp_ns, frame_id),
                results=[hypothesis],
                bbox=bbox,
                id=ids[k] if ids is not None else "",
            )
        )
    return t[DETECTION_2D_ARRAY](header=_header(stamp_ns, frame_id), detections=detections)


# ------------------------------------------------------------------ Foxglove (JSON)

IMAGE_ANNOTATIONS = "foxglove.ImageAnnotations"
FOXGLOVE_COMPRESSED_IMAGE = "foxglove.CompressedImage"
LINE_LOOP = 2  # foxglove.PointsAnnotation type: a closed polygon

_TIME = {
    "type": "object",
    "properties": {"sec": {"type": "integer"}, "nsec": {"type": "integer"}},
}
_POINT2 = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}
_COLOR = {
    "type": "object",
    "properties": {k: {"type": "number"} for k in ("r", "g", "b", "a")},
}
SCHEMAS: Mapping[str, Mapping[str, Any]] = {
    IMAGE_ANNOTATIONS: {
        "title": IMAGE_ANNOTATIONS,
        "type": "object",
        "properties": {
            "circles": {"type": "array", "items": {"type": "object"}},
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "timestamp": _TIME,
                        "type": {"type": "integer"},
                        "points": {"type": "array", "items": _POINT2},
                        "outline_color": _COLOR,
                        "outline_colors": {"type": "array", "items": _COLOR},
                        "fill_color": _COLOR,
                        "thickness": {"type": "number"},
                    },
                },
            },
            "texts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "timestamp": _TIME,
                        "position": _POINT2,
                        "text": {"type": "string"},
                        "font_size": {"type": "number"},
                        "text_color": _COLOR,
                        "background_color": _COLOR,
                    },
                },
            },
        },
    },
    FOXGLOVE_COMPRESSED_IMAGE: {
        "title": FOXGLOVE_COMPRESSED_IMAGE,
        "type": "object",
        "properties": {
            "timestamp": _TIME,
            "frame_id": {"type": "string"},
            "data": {"type": "string", "contentEncoding": "base64"},
            "format": {"type": "string"},
        },
    },
}


def series_schema(title: str, fields: Sequence[str]) -> Mapping[str, Any]:
    """The JSON schema of a plain series message: a `timestamp` and numeric `fields`."""
    props: dict[str, Any] = {"timestamp": _TIME}
    props.update({f: {"type": ["number", "null"]} for f in fields})
    return {"title": title, "type": "object", "properties": props}


def foxglove_time(stamp_ns: int) -> dict[str, int]:
    """A Foxglove `time` ({sec, nsec})."""
    return {"sec": int(stamp_ns // 1_000_000_000), "nsec": int(stamp_ns % 1_000_000_000)}


def _rgba(rgb: tuple[float, float, float], a: float = 1.0) -> dict[str, float]:
    return {"r": rgb[0], "g": rgb[1], "b": rgb[2], "a": a}


def image_annotations(
    stamp_ns: int,
    boxes_xyxy: npt.NDArray[np.floating[Any]],
    labels: Sequence[str],
    colors: Sequence[tuple[float, float, float]],
    *,
    thickness: float = 2.0,
) -> dict[str, Any]:
    """A `foxglove.ImageAnnotations`: each box a closed outline in image pixels with its
    label (class and score) written above its top-left corner, in the box's colour, its line
    `thickness` pixels wide."""
    stamp = foxglove_time(stamp_ns)
    points, texts = [], []
    for (x1, y1, x2, y2), label, rgb in zip(
        np.asarray(boxes_xyxy, np.float64).reshape(-1, 4).tolist(), labels, colors, strict=True
    ):
        points.append(
            {
                "timestamp": stamp,
                "type": LINE_LOOP,
                "points": [
                    {"x": x1, "y": y1},
                    {"x": x2, "y": y1},
                    {"x": x2, "y": y2},
                    {"x": x1, "y": y2},
                ],
                "outline_color": _rgba(rgb),
                "outline_colors": [],
                "fill_color": _rgba(rgb, 0.0),
                "thickness": thickness,
            }
        )
        texts.append(
            {
                "timestamp": stamp,
                "position": {"x": x1, "y": max(0.0, y1 - 2.0)},
                "text": label,
                "font_size": 12.0,
                "text_color": _rgba((1.0, 1.0, 1.0)),
                "background_color": _rgba(rgb, 0.7),
            }
        )
    return {"circles": [], "points": points, "texts": texts}


def foxglove_compressed_image(
    stamp_ns: int, frame_id: str, fmt: str, data: bytes
) -> dict[str, Any]:
    """A `foxglove.CompressedImage` in its JSON form (the bytes base64)."""
    return {
        "timestamp": foxglove_time(stamp_ns),
        "frame_id": frame_id,
        "data": base64.b64encode(data).decode("ascii"),
        "format": fmt,
    }


def dumps(message: Mapping[str, Any]) -> bytes:
    """A JSON message's bytes (compact, strict JSON: a non-finite number is written as null)."""
    return json.dumps(finite(message), separators=(",", ":"), allow_nan=False).encode()
