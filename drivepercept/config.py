"""Frozen configuration types and the rig file (`rig.toml`).

A rig is the set of cameras on one vehicle. Each camera has a name, optionally a video it was
recorded to, its frame rate and resolution, and where the geometry is known (always for
simulated rigs) its pinhole intrinsics and its mount on the ego vehicle. The same file is
written by `drivepercept simulate` and read by every command that replays a drive.

Conventions, written once:

* Ego frame: x forward, y left, z up, metres, origin on the ground under the rear axle.
* A camera's yaw turns it to the left (0 looks forward, 90 left, 180 back, -90 right);
  pitch tilts it down (positive looks at the ground).
* Camera frame (OpenCV): x right, y down, z along the optical axis.
* Intrinsics: pixel centres at integer coordinates + 0.5 are not used; (u, v) = (fx x/z + cx,
  fy y/z + cy) with pixel i covering [i, i + 1).
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError, OutputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

MAX_CAMERAS = 12
MIN_SIZE_PX = 32
MAX_SIZE_PX = 8192
MAX_FPS = 240.0

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def check_camera_count(count: int) -> int:
    """Return `count` if a rig may have that many cameras, else raise ConfigError."""
    if not 1 <= count <= MAX_CAMERAS:
        raise ConfigError(f"camera count must be between 1 and {MAX_CAMERAS}, got {count}")
    return count


def check_fps(fps: float) -> float:
    """Return `fps` if it is a usable frame rate, else raise ConfigError."""
    if not (math.isfinite(fps) and 0.0 < fps <= MAX_FPS):
        raise ConfigError(f"fps must be > 0 and <= {MAX_FPS:g}, got {fps:g}")
    return fps


def check_size(width: int, height: int) -> tuple[int, int]:
    """Return (width, height) if it is a usable frame size, else raise ConfigError."""
    if not (MIN_SIZE_PX <= width <= MAX_SIZE_PX and MIN_SIZE_PX <= height <= MAX_SIZE_PX):
        raise ConfigError(
            f"frame size must be between {MIN_SIZE_PX}x{MIN_SIZE_PX} and "
            f"{MAX_SIZE_PX}x{MAX_SIZE_PX} pixels, got {width}x{height}"
        )
    return width, height


def parse_size(text: str) -> tuple[int, int]:
    """Parse 'WIDTHxHEIGHT' (e.g. '640x360') and check it."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None:
        raise ConfigError(f"size must look like WIDTHxHEIGHT (e.g. 640x360), got {text!r}")
    return check_size(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class Intrinsics:
    """Pinhole intrinsics in pixels (no lens distortion)."""

    fx: float
    fy: float
    cx: float
    cy: float

    def __post_init__(self) -> None:
        for key in ("fx", "fy"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"intrinsics.{key} must be a positive number, got {value}")
        for key in ("cx", "cy"):
            if not math.isfinite(getattr(self, key)):
                raise ConfigError(f"intrinsics.{key} must be finite, got {getattr(self, key)}")

    @classmethod
    def from_fov(cls, *, width: int, height: int, fov_deg: float) -> Intrinsics:
        """Square pixels, principal point at the centre, horizontal field of view `fov_deg`."""
        if not 1.0 <= fov_deg <= 170.0:
            raise ConfigError(f"horizontal field of view must be in [1, 170] deg, got {fov_deg}")
        fx = (width / 2.0) / math.tan(math.radians(fov_deg) / 2.0)
        return cls(fx=fx, fy=fx, cx=width / 2.0, cy=height / 2.0)

    def hfov_deg(self, width: int) -> float:
        """Horizontal field of view for an image `width` pixels wide."""
        left = math.atan(self.cx / self.fx)
        right = math.atan((width - self.cx) / self.fx)
        return math.degrees(left + right)


@dataclass(frozen=True)
class Extrinsics:
    """Where a camera sits on the ego vehicle and which way it looks."""

    position_m: tuple[float, float, float]
    yaw_deg: float
    pitch_deg: float = 0.0

    def __post_init__(self) -> None:
        if len(self.position_m) != 3 or not all(math.isfinite(v) for v in self.position_m):
            raise ConfigError(
                f"extrinsics.position_m must be 3 finite numbers, got {self.position_m!r}"
            )
        if not (math.isfinite(self.yaw_deg) and math.isfinite(self.pitch_deg)):
            raise ConfigError("extrinsics yaw_deg and pitch_deg must be finite")
        if not -89.0 <= self.pitch_deg <= 89.0:
            raise ConfigError(f"extrinsics.pitch_deg must be in [-89, 89], got {self.pitch_deg}")


@dataclass(frozen=True)
class CameraConfig:
    """One camera of a rig. Geometry is optional for recorded rigs, required for simulation."""

    name: str
    video: Path | None = None  # a recorded video file
    fps: float | None = None
    width: int | None = None
    height: int | None = None
    intrinsics: Intrinsics | None = None
    extrinsics: Extrinsics | None = None
    source: str | None = None  # a live source: device index, /dev/videoN or stream URL

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ConfigError(
                "camera name must be 1-64 letters, digits, '_' or '-' (starting with a letter "
                f"or digit), got {self.name!r}"
            )
        if self.fps is not None:
            check_fps(self.fps)
        if (self.width is None) != (self.height is None):
            raise ConfigError(f"camera {self.name!r}: give both width and height, or neither")
        if self.width is not None and self.height is not None:
            check_size(self.width, self.height)

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) in pixels, when known."""
        if self.width is None or self.height is None:
            return None
        return self.width, self.height


@dataclass(frozen=True)
class RigConfig:
    """The cameras of one vehicle, in a fixed order (the batch order of the pipeline)."""

    cameras: tuple[CameraConfig, ...]
    source_path: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_camera_count(len(self.cameras))
        names = [camera.name for camera in self.cameras]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ConfigError(f"camera names must be unique, repeated: {', '.join(duplicates)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Camera names in rig order."""
        return tuple(camera.name for camera in self.cameras)

    def camera(self, name: str) -> CameraConfig:
        """The camera called `name`; ConfigError naming the known cameras otherwise."""
        for camera in self.cameras:
            if camera.name == name:
                return camera
        raise ConfigError(f"no camera {name!r} in rig; cameras are: {', '.join(self.names)}")


# --------------------------------------------------------------------------- reading

_CAMERA_KEYS = {"name", "video", "source", "fps", "width", "height", "intrinsics", "extrinsics"}


def _table(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(value).__name__}")
    return value


def _number(table: Mapping[str, Any], key: str, where: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _integer(table: Mapping[str, Any], key: str, where: str) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key} must be an integer, got {value!r}")
    return value


def read_toml(path: Path, *, what: str) -> dict[str, Any]:
    """Parse a TOML file; every failure is a one-line ConfigError naming `what` and the path."""
    try:
        with path.open("rb") as fh:
            return dict(tomllib.load(fh))
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} is a directory, expected a .toml file: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from None


def _camera_from_table(raw: object, index: int, base_dir: Path) -> CameraConfig:
    where = f"cameras[{index}]"
    table = _table(raw, where)
    unknown = sorted(set(table) - _CAMERA_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {unknown}; expected some of {sorted(_CAMERA_KEYS)}"
        )
    name = table.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name must be a string, got {name!r}")
    where = f"camera {name!r}"
    video: Path | None = None
    if "video" in table:
        if not isinstance(table["video"], str) or not table["video"]:
            raise ConfigError(f"{where}: video must be a non-empty path, got {table['video']!r}")
        video = Path(table["video"])
        if not video.is_absolute():
            video = base_dir / video
    source = table.get("source")
    if source is not None and (not isinstance(source, str) or not source):
        raise ConfigError(f"{where}: source must be a device or URL string, got {source!r}")
    fps = _number(table, "fps", where) if "fps" in table else None
    width = _integer(table, "width", where) if "width" in table else None
    height = _integer(table, "height", where) if "height" in table else None
    intrinsics = None
    if "intrinsics" in table:
        t = _table(table["intrinsics"], f"{where}.intrinsics")
        intrinsics = Intrinsics(
            fx=_number(t, "fx", f"{where}.intrinsics"),
            fy=_number(t, "fy", f"{where}.intrinsics"),
            cx=_number(t, "cx", f"{where}.intrinsics"),
            cy=_number(t, "cy", f"{where}.intrinsics"),
        )
    extrinsics = None
    if "extrinsics" in table:
        t = _table(table["extrinsics"], f"{where}.extrinsics")
        position = t.get("position_m")
        if not isinstance(position, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in position
        ):
            raise ConfigError(f"{where}.extrinsics.position_m must be [x, y, z], got {position!r}")
        extrinsics = Extrinsics(
            position_m=tuple(float(v) for v in position),  # type: ignore[arg-type]
            yaw_deg=_number(t, "yaw_deg", f"{where}.extrinsics"),
            pitch_deg=_number(t, "pitch_deg", f"{where}.extrinsics") if "pitch_deg" in t else 0.0,
        )
    return CameraConfig(
        name=name,
        video=video,
        fps=fps,
        width=width,
        height=height,
        intrinsics=intrinsics,
        extrinsics=extrinsics,
        source=source,
    )


def load_rig(path: str | Path) -> RigConfig:
    """Read a rig file. Relative video paths are resolved against the file's folder.

    Raises:
        ConfigError: the file is missing, is not TOML, or a camera entry is invalid.
    """
    path = Path(path)
    data = read_toml(path, what="rig file")
    cameras = data.get("cameras")
    if not isinstance(cameras, list) or not cameras:
        raise ConfigError(f"rig file {path} has no [[cameras]] entries")
    base_dir = path.resolve().parent
    try:
        return RigConfig(
            cameras=tuple(_camera_from_table(raw, i, base_dir) for i, raw in enumerate(cameras)),
            source_path=path,
        )
    except ConfigError as exc:
        raise ConfigError(f"rig file {path}: {exc}") from None


# --------------------------------------------------------------------------- writing


def _camera_to_table(camera: CameraConfig, base_dir: Path) -> dict[str, Any]:
    table: dict[str, Any] = {"name": camera.name}
    if camera.video is not None:
        video = camera.video
        with contextlib.suppress(ValueError):
            video = video.resolve().relative_to(base_dir.resolve())
        table["video"] = video.as_posix()
    if camera.source is not None:
        table["source"] = camera.source
    if camera.fps is not None:
        table["fps"] = camera.fps
    if camera.width is not None and camera.height is not None:
        table["width"] = camera.width
        table["height"] = camera.height
    if camera.intrinsics is not None:
        k = camera.intrinsics
        table["intrinsics"] = {
            "fx": round(k.fx, 6),
            "fy": round(k.fy, 6),
            "cx": round(k.cx, 6),
            "cy": round(k.cy, 6),
        }
        if camera.width is not None:
            table["intrinsics"]["hfov_deg"] = round(k.hfov_deg(camera.width), 4)
    if camera.extrinsics is not None:
        e = camera.extrinsics
        table["extrinsics"] = {
            "position_m": [round(v, 6) for v in e.position_m],
            "yaw_deg": round(e.yaw_deg, 6),
            "pitch_deg": round(e.pitch_deg, 6),
        }
    return table


def write_rig(
    rig: RigConfig, path: str | Path, *, extra: Mapping[str, Mapping[str, Any]] | None = None
) -> Path:
    """Write `rig` as TOML; videos are stored relative to the file's folder when inside it.

    Args:
        rig: the cameras to write.
        path: the file to write.
        extra: additional top-level tables (e.g. how a simulated rig was made); readers ignore
            them.
    """
    path = Path(path)
    data: dict[str, Any] = {}
    for key, table in (extra or {}).items():
        data[key] = dict(table)
    data["cameras"] = [_camera_to_table(c, path.parent) for c in rig.cameras]
    # Hand-editing hints are cheaper to read than a schema document.
    header = (
        "# drivepercept rig: one [[cameras]] entry per camera, in batch order.\n"
        "# Ego frame: x forward, y left, z up (m). yaw_deg turns left, pitch_deg tilts down.\n"
        "# Intrinsics are pinhole pixels: u = fx*x/z + cx, v = fy*y/z + cy (OpenCV camera frame).\n"
    )
    try:
        import tomli_w  # only here: reading configs and running needs no TOML writer

        path.write_text(header + tomli_w.dumps(data), encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write rig file {path}: {exc.strerror or exc}") from None
    return path


# --------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class SimulationConfig:
    """What `drivepercept simulate` renders: a rig of `cameras` cameras for `seconds` seconds."""

    out_dir: Path
    cameras: int = 6
    seconds: float = 8.0
    fps: float = 15.0
    width: int = 640
    height: int = 360
    seed: int = 0
    noise: bool = True

    def __post_init__(self) -> None:
        check_camera_count(self.cameras)
        check_fps(self.fps)
        check_size(self.width, self.height)
        if self.width % 2 or self.height % 2:
            raise ConfigError(
                f"frame size must have an even width and height for the MP4 encoder, "
                f"got {self.width}x{self.height}"
            )
        if not (math.isfinite(self.seconds) and 0.0 < self.seconds <= 3600.0):
            raise ConfigError(f"seconds must be > 0 and <= 3600, got {self.seconds:g}")
        if self.frame_count < 1:
            raise ConfigError(f"{self.seconds:g} s at {self.fps:g} fps is less than one frame")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be a non-negative 64-bit integer, got {self.seed}")

    @property
    def frame_count(self) -> int:
        """Frames per camera: frame k shows the world at k / fps seconds."""
        return round(self.seconds * self.fps)


# --------------------------------------------------------------------------- pipeline

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class PipelineConfig:
    """Knobs of the replay pipeline (TOML keys and CLI flags have the same names).

    Attributes:
        batch_timeout_ms: a batch is sent when every live camera has a frame or when this
            much time passed since its first frame arrived.
        queue_capacity: frames waiting per camera between its decoder and the batcher.
        drop_policy: "block" (replay: never lose a frame) or "drop_oldest" (live).
        device: "auto", "cpu", "cuda" or "cuda:N".
        precision: "fp32", "fp16" or "bf16" (autocast; fp16/bf16 need CUDA for speed).
        channels_last: run the model on NHWC memory layout (faster convolutions on GPUs with
            fp16/bf16, and for MobileNet-style models on CPUs too: 35 vs 55 ms a frame for
            ssdlite at batch 1 on the 2-core development machine).
        score_threshold, iou_threshold, max_detections: post-processing.
        ring_slots: staging buffers (>= max_in_flight; one more lets the next batch be staged
            while the last is in flight).
        max_in_flight: batches submitted to the device and not yet completed.
        max_frames: stop each camera after this many frames (0 = all).
        sample_hz: load samples (GPU through NVML, CPU, memory) per second; 0 = no sampler.
        warmup: run one full batch and one single frame through the engine before capture
            starts (CUDA lazy loading, cuDNN/cuBLAS set-up), kept out of every figure.
    """

    batch_timeout_ms: float = 20.0
    queue_capacity: int = 4
    drop_policy: str = "block"
    device: str = "auto"
    precision: str = "fp32"
    channels_last: bool = True
    score_threshold: float = 0.3
    iou_threshold: float = 0.5
    max_detections: int = 100
    ring_slots: int = 4
    max_in_flight: int = 2
    max_frames: int = 0
    sample_hz: float = 10.0
    warmup: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.batch_timeout_ms) and 0.0 <= self.batch_timeout_ms <= 60_000):
            raise ConfigError(
                f"batch_timeout_ms must be between 0 and 60000, got {self.batch_timeout_ms:g}"
            )
        if not 1 <= self.queue_capacity <= 1024:
            raise ConfigError(f"queue_capacity must be 1..1024, got {self.queue_capacity}")
        if self.drop_policy not in ("block", "drop_oldest"):
            raise ConfigError(
                f"drop_policy must be 'block' or 'drop_oldest', got {self.drop_policy!r}"
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ConfigError(f"score_threshold must be in [0, 1], got {self.score_threshold}")
        if not 0.0 < self.iou_threshold <= 1.0:
            raise ConfigError(f"iou_threshold must be in (0, 1], got {self.iou_threshold}")
        if not 1 <= self.max_detections <= 10_000:
            raise ConfigError(f"max_detections must be 1..10000, got {self.max_detections}")
        if not 1 <= self.max_in_flight <= 16:
            raise ConfigError(f"max_in_flight must be 1..16, got {self.max_in_flight}")
        if self.ring_slots < self.max_in_flight:
            raise ConfigError(
                f"ring_slots must be at least max_in_flight = {self.max_in_flight}, "
                f"got {self.ring_slots}"
            )
        if self.max_frames < 0:
            raise ConfigError(f"max_frames must be >= 0, got {self.max_frames}")
        if not (math.isfinite(self.sample_hz) and 0.0 <= self.sample_hz <= 1000.0):
            raise ConfigError(f"sample_hz must be between 0 and 1000, got {self.sample_hz:g}")


def load_pipeline_toml(path: str | Path) -> dict[str, Any]:
    """Read a replay config file: a TOML table of PipelineConfig keys (and replay options).

    Returns the raw mapping; the CLI merges it under its flags and validates the result.
    """
    data = read_toml(Path(path), what="config file")
    return dict(data.get("replay", data))


@dataclass(frozen=True)
class ReconnectPolicy:
    """How a live camera retries after a failed open or read (exponential backoff).

    Attributes:
        initial_s: the first wait before a retry.
        max_s: the longest wait between retries (the wait doubles up to it).
        max_attempts: failed attempts in a row before the camera is `failed` for good
            (0 = retry forever).
        open_timeout_s: how long one open of a network stream may take.
        read_timeout_s: how long one read may block before the stream counts as lost.
    """

    initial_s: float = 0.25
    max_s: float = 4.0
    max_attempts: int = 8
    open_timeout_s: float = 5.0
    read_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s", "open_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 3600.0):
                raise ConfigError(f"reconnect {name} must be in (0, 3600] s, got {value:g}")
        if self.max_s < self.initial_s:
            raise ConfigError(
                f"reconnect max_s ({self.max_s:g}) must be >= initial_s ({self.initial_s:g})"
            )
        if not 0 <= self.max_attempts <= 1_000_000:
            raise ConfigError(f"reconnect max_attempts must be >= 0, got {self.max_attempts}")

    def delay_s(self, attempt: int) -> float:
        """The wait before retry number `attempt` (1, 2, ...): initial, doubled, capped."""
        return float(min(self.max_s, self.initial_s * 2.0 ** max(0, attempt - 1)))
