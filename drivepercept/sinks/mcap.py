"""The run's results as an MCAP file that Foxglove opens beside the source drive (`--mcap`).

Topics, per camera (`<base>` is the camera's source image topic for a recorded drive, e.g.
`/cam_front/image_raw/compressed`, else `/<camera>`):

* `<base>/detections`: `foxglove.ImageAnnotations` (JSON): each box an outline in the
  image's own pixels (xyxy, origin at the top-left corner of the top-left pixel, as
  Foxglove draws them) with its "class score" label, a colour per class (the annotated
  video's); an empty frame writes an empty message, so old boxes never linger. A frame the
  model did not see (`--detect-every`, a latency budget) has the tracker's boxes, drawn
  thinner and labelled "class score predicted";
* `<base>/detections_ros` (only in a ROS 2 file, see below):
  `vision_msgs/msg/Detection2DArray` (vision_msgs 4.x), class_id = class name, the score,
  the box as centre and size in pixels, header frame_id = the camera's name;
* with `--mcap-images`, the original frame as JPEG and the camera's calibration (once, when
  the rig gives intrinsics): a recorded drive's cameras (which already have their images in
  the drive) on `/drivepercept/<camera>/image` and `/drivepercept/<camera>/camera_info`,
  other cameras on `/<camera>/image` and `/<camera>/camera_info`. In a ROS 2 file these are
  `sensor_msgs/msg/CompressedImage` and `sensor_msgs/msg/CameraInfo`, else
  `foxglove.CompressedImage` (JSON, the calibration is then left out);
* `/drivepercept/latency/<camera>`: one JSON message a frame: frame_index, end_to_end_ms,
  the stage spans of `telemetry.timeline.STAGE_SPANS` as `<span>_ms` (null where a stage
  does not apply), detections, batch_size and predicted (1: the tracker's boxes);
* `/drivepercept/load` (JSON): process_cpu_pct, system_cpu_pct, process_rss_mb,
  system_mem_used_mb and per GPU i (NVML index) gpu<i>_util_pct, gpu<i>_mem_util_pct,
  gpu<i>_mem_used_mb, gpu<i>_power_w (null where the hardware does not say; MB = 2**20 B).

Times: every frame's messages are stamped, and logged, at the frame's stamp on its source's
clock (`FrameResult.stamp_ns`: a ROS header stamp, else the video's pts), which is where the
source drive holds its image, so Foxglove shows the boxes over the image they were found on.
A ROS 2 file (the run read a ROS 2 drive) has the MCAP profile "ros2"; other files none.
A metadata record "drivepercept" names the version, the cameras and their topics.

Threads: frames come from one thread (the sink's own, under the slow-output policy),
`load_sink.write` from the `gpu-monitor` thread; `McapOut` is thread-safe and this sink's
own lock guards the load clock. Closing the `load_sink` only stops load samples; the file
is the `McapSink`'s, finished by its `close()`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cv2

from drivepercept import __version__
from drivepercept.errors import OutputError
from drivepercept.recording import messages
from drivepercept.recording.mcapfile import PROFILE_ROS2, McapOut
from drivepercept.sinks.annotate import _PALETTE  # one colour per class in video and Foxglove
from drivepercept.sinks.base import ClosingSink, LoadFace
from drivepercept.types import FrameResult, ImageU8, LoadSample

JPEG_QUALITY = 90
LOAD_TOPIC = "/drivepercept/load"
LATENCY_SCHEMA = "drivepercept.FrameLatency"
LOAD_SCHEMA = "drivepercept.Load"
EARLY_LOAD_SAMPLES = 32  # load samples kept until the first frame sets the clock
_MB = float(1 << 20)

# the spans of `telemetry.timeline.STAGE_SPANS` (sinks do not import telemetry; a test
# checks that the two agree): (field, start stamp, end stamp)
LATENCY_SPANS: tuple[tuple[str, str, str], ...] = (
    ("decode_ms", "capture", "decoded"),
    ("preprocess_ms", "decoded", "preprocessed"),
    ("enqueue_ms", "preprocessed", "queued"),
    ("batch_wait_ms", "queued", "batched"),
    ("engine_wait_ms", "batched", "copy_start"),
    ("upload_ms", "copy_start", "copy_done"),
    ("compute_wait_ms", "copy_done", "compute_start"),
    ("inference_ms", "compute_start", "inference_done"),
    ("postprocess_ms", "inference_done", "postprocessed"),
    ("emit_ms", "postprocessed", "emitted"),
)
LATENCY_FIELDS: tuple[str, ...] = (
    "frame_index",
    "end_to_end_ms",
    *(name for name, _, _ in LATENCY_SPANS),
    "detections",
    "batch_size",
    "predicted",
)
_LATENCY_SERIES = messages.series_schema(LATENCY_SCHEMA, LATENCY_FIELDS)


class _Intrinsics(Protocol):
    @property
    def fx(self) -> float: ...
    @property
    def fy(self) -> float: ...
    @property
    def cx(self) -> float: ...
    @property
    def cy(self) -> float: ...


class CameraLike(Protocol):
    """What the sink reads of a camera (`drivepercept.rig.CameraConfig` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def width(self) -> int | None: ...
    @property
    def height(self) -> int | None: ...
    @property
    def intrinsics(self) -> _Intrinsics | None: ...


@dataclass(frozen=True)
class CameraTopics:
    """Where one camera's messages go (see the module docstring)."""

    detections: str
    detections_ros: str
    image: str
    camera_info: str
    latency: str

    @classmethod
    def of(cls, name: str, topic: str | None = None) -> CameraTopics:
        """The topics of camera `name`, read from source image `topic` (None: not a drive)."""
        base = topic.rstrip("/") if topic else f"/{name}"
        own = f"/drivepercept/{name}" if topic else base
        return cls(
            detections=f"{base}/detections",
            detections_ros=f"{base}/detections_ros",
            image=f"{own}/image",
            camera_info=f"{own}/camera_info",
            latency=f"/drivepercept/latency/{name}",
        )


def _rgb(label: int) -> tuple[float, float, float]:
    b, g, r = _PALETTE[label % len(_PALETTE)]
    return (r / 255.0, g / 255.0, b / 255.0)


def latency_record(result: FrameResult) -> dict[str, Any]:
    """The `/drivepercept/latency/<camera>` message of one frame (without its timestamp)."""
    timing = result.timing
    record: dict[str, Any] = {
        "frame_index": result.frame_index,
        "end_to_end_ms": timing.end_to_end_ms,
    }
    for name, start, end in LATENCY_SPANS:
        t0, t1 = timing.stamp(start), timing.stamp(end)
        record[name] = (t1 - t0) / 1e6 if t0 and t1 else None  # 0: the stage did not apply
    record["detections"] = len(result.detections)
    record["batch_size"] = result.batch_size
    record["predicted"] = int(result.detections.predicted)  # 1: the tracker's boxes
    return record


def load_record(sample: LoadSample) -> dict[str, Any]:
    """The `/drivepercept/load` message of one sample (without its timestamp)."""
    record: dict[str, Any] = {
        "process_cpu_pct": sample.process_cpu_pct,
        "system_cpu_pct": sample.system_cpu_pct,
        "process_rss_mb": sample.process_rss_bytes / _MB,
        "system_mem_used_mb": sample.system_mem_used_bytes / _MB,
    }
    for g in sample.gpus:
        record[f"gpu{g.index}_util_pct"] = g.util_pct
        record[f"gpu{g.index}_mem_util_pct"] = g.mem_util_pct
        record[f"gpu{g.index}_mem_used_mb"] = g.mem_used_bytes / _MB
        record[f"gpu{g.index}_power_w"] = g.power_w
    return record


class McapSink(ClosingSink):
    """Writes each frame's detections, latency (and image) and the run's load to an MCAP
    file (topics, times and threads: see the module docstring).

    Args:
        path: the file to create (truncated if it exists; missing parent folders are made).
        cameras: the run's cameras, in order (their names, source topics and intrinsics).
        images: also write each frame's original image (`write_with_image`); without it an
            image handed in (another sink wanted it) is ignored.
        ros2: the run reads a ROS 2 drive: the file gets the ROS 2 profile, the detections
            also as `vision_msgs/msg/Detection2DArray` and the images as `sensor_msgs`.

    Raises:
        ConfigError: the `[ros]` extra (mcap, rosbags) is not installed.
        OutputError: the file cannot be created.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        cameras: Sequence[CameraLike],
        images: bool = False,
        ros2: bool = False,
    ) -> None:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise OutputError(f"cannot create {path}: {path.parent} is not a folder") from None
        except OSError as exc:
            raise OutputError(f"cannot create {path}: {exc.strerror or exc}") from None
        self.images = images
        self.ros2 = ros2
        self._cameras: dict[str, CameraLike] = {c.name: c for c in cameras}
        self._topics = {c.name: CameraTopics.of(c.name, c.topic) for c in cameras}
        self._out = McapOut(path, profile=PROFILE_ROS2 if ros2 else "")
        self.path = self._out.path
        self._lock = threading.Lock()  # the load clock, the early samples, closing
        self._closed = False
        self._load_closed = False
        # (capture_ns, stamp_ns) of the newest frame: maps a load sample's monotonic time
        # onto the source's clock (see `_load_stamp`)
        self._anchor: tuple[int, int] | None = None
        self._early: collections.deque[LoadSample] = collections.deque(maxlen=EARLY_LOAD_SAMPLES)
        self._last_load_ns = 0
        self._calibrated: set[str] = set()
        self._load_schema: Mapping[str, Any] | None = None
        self.frames_written = 0
        self.images_written = 0
        self.load_samples_written = 0
        try:
            self._out.metadata(
                "drivepercept",
                {
                    "version": __version__,
                    "cameras": ",".join(self._topics),
                    **{f"detections.{n}": t.detections for n, t in self._topics.items()},
                },
            )
        except BaseException:
            self._out.close()
            raise
        self.load_sink = LoadFace(self._write_load, self._stop_load)

    # ------------------------------------------------------------------ frames

    def write(self, result: FrameResult) -> None:
        """Write one frame's detections and latency.

        Raises:
            OutputError: the file cannot be written.
        """
        self._write(result, None)

    def write_with_image(self, result: FrameResult, image_bgr: ImageU8) -> None:
        """As `write`, and the image too when the sink was asked for images."""
        self._write(result, image_bgr if self.images else None)

    def _topics_of(self, camera: str) -> CameraTopics:
        topics = self._topics.get(camera)
        if topics is None:  # a camera not named up front still gets its topics
            topics = self._topics[camera] = CameraTopics.of(camera)
        return topics

    def _write(self, result: FrameResult, image: ImageU8 | None) -> None:
        if self._closed:  # (the file would ignore it too; this saves the encoding)
            return
        stamp = result.stamp_ns
        log_time = max(0, stamp)  # MCAP times are unsigned
        topics = self._topics_of(result.camera)
        det = result.detections
        names = det.names
        scores = [float(s) for s in det.scores.tolist()]
        mark = " predicted" if det.predicted else ""  # the tracker's box, not the model's
        labels = [f"{n} {s:.2f}{mark}" for n, s in zip(names, scores, strict=True)]
        colors = [_rgb(int(k)) for k in det.labels.tolist()]
        self._set_clock(result)
        if image is not None:
            self._write_image(result.camera, topics, stamp, image)
        out = self._out
        thin = 1.0 if det.predicted else 2.0
        annotations = messages.image_annotations(stamp, det.xyxy, labels, colors, thickness=thin)
        out.json(topics.detections, messages.IMAGE_ANNOTATIONS, annotations, log_time_ns=log_time)
        if self.ros2:
            array = messages.detection_array(stamp, result.camera, det.xyxy, names, scores)
            out.ros2(
                topics.detections_ros, messages.DETECTION_2D_ARRAY, array, log_time_ns=log_time
            )
        latency = {"timestamp": messages.foxglove_time(stamp), **latency_record(result)}
        out.json(
            topics.latency,
            LATENCY_SCHEMA,
            latency,
            log_time_ns=log_time,
            schema=_LATENCY_SERIES,
        )
        self.frames_written += 1

    def _write_image(self, camera: str, topics: CameraTopics, stamp: int, image: ImageU8) -> None:
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            raise ValueError(f"cannot encode a {image.dtype} {image.shape} image as JPEG")
        data, log_time = jpeg.tobytes(), max(0, stamp)
        if not self.ros2:
            message = messages.foxglove_compressed_image(stamp, camera, "jpeg", data)
            self._out.json(
                topics.image, messages.FOXGLOVE_COMPRESSED_IMAGE, message, log_time_ns=log_time
            )
        else:
            message = messages.compressed_image(stamp, camera, "jpeg", data)
            self._out.ros2(topics.image, messages.COMPRESSED_IMAGE, message, log_time_ns=log_time)
            self._write_camera_info(camera, topics, stamp, image.shape[1], image.shape[0])
        self.images_written += 1

    def _write_camera_info(
        self, camera: str, topics: CameraTopics, stamp: int, width: int, height: int
    ) -> None:
        """The camera's `CameraInfo`, once, where the rig gives its intrinsics (scaled to
        the image when the rig states another size)."""
        config = self._cameras.get(camera)
        if camera in self._calibrated or config is None or config.intrinsics is None:
            return
        self._calibrated.add(camera)
        k = config.intrinsics
        sx = width / config.width if config.width else 1.0
        sy = height / config.height if config.height else 1.0
        info = messages.camera_info(
            stamp,
            camera,
            width=width,
            height=height,
            fx=k.fx * sx,
            fy=k.fy * sy,
            cx=k.cx * sx,
            cy=k.cy * sy,
        )
        self._out.ros2(topics.camera_info, messages.CAMERA_INFO, info, log_time_ns=max(0, stamp))

    # ------------------------------------------------------------------ load

    def _set_clock(self, result: FrameResult) -> None:
        """Take the newest frame as the load clock's anchor; the first one also writes the
        samples that came before it."""
        with self._lock:
            first = self._anchor is None
            self._anchor = (result.timing.capture_ns, result.stamp_ns)
            if first and not (self._closed or self._load_closed):
                while self._early:
                    self._write_load_locked(self._early.popleft())

    def _load_stamp(self, t_ns: int) -> int:
        # A load sample's time is on the host's monotonic clock, the frames' on the source's.
        # Kept simple: the sample goes where the newest frame's stamp plus the time since
        # its capture puts it, so in a replay faster than real time the load follows the
        # frames being processed (a fixed offset would leave it behind); never backwards.
        # Negative: before the source's time 0.
        assert self._anchor is not None
        capture_ns, stamp_ns = self._anchor
        stamp = stamp_ns + (t_ns - capture_ns)
        return stamp if stamp < 0 else max(stamp, self._last_load_ns)

    def _write_load(self, sample: LoadSample) -> None:
        with self._lock:
            if self._closed or self._load_closed:
                return
            if self._anchor is None:
                self._early.append(sample)  # the oldest go when too many wait
                return
            self._write_load_locked(sample)

    def _write_load_locked(self, sample: LoadSample) -> None:
        stamp = self._load_stamp(sample.t_ns)
        if stamp < 0:  # nowhere to put it in the file
            return
        self._last_load_ns = stamp
        record = load_record(sample)
        if self._load_schema is None:  # the first sample names the GPUs
            self._load_schema = messages.series_schema(LOAD_SCHEMA, tuple(record))
        message = {"timestamp": messages.foxglove_time(stamp), **record}
        self._out.json(
            LOAD_TOPIC, LOAD_SCHEMA, message, log_time_ns=stamp, schema=self._load_schema
        )
        self.load_samples_written += 1

    # ------------------------------------------------------------------ closing

    def _stop_load(self) -> None:
        with self._lock:
            self._load_closed = True

    def close(self) -> None:
        """Finish the file (its summary and index); a second call does nothing.

        Raises:
            OutputError: the summary could not be written (the messages before it read).
        """
        with self._lock:
            self._closed = True
            self._early.clear()
        self._out.close()
