"""Cameras, rigs and the rig file (`rig.toml`), and the one source -> camera resolver.

A rig is the set of cameras on one vehicle. Each camera has a name, optionally a video it was
recorded to or a live source, its frame rate and resolution, and where the geometry is known
(always for simulated rigs) its pinhole intrinsics and its mount on the ego vehicle
(`drivepercept.geometry`). The same file is written by `drivepercept simulate` and read by
every command that replays a drive.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError, OutputError
from drivepercept.geometry import (
    MAX_CAMERAS,
    Extrinsics,
    Intrinsics,
    check_camera_count,
    check_camera_name,
    check_detect_every,
    check_fps,
    check_priority,
    check_size,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


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
    topic: str | None = None  # the image topic read from `video`, a recorded drive (bag, MCAP)
    priority: float = 1.0  # its detections' weight under a latency budget (`schedule`)
    detect_every: int | None = None  # its detection interval (None: the run's setting)

    def __post_init__(self) -> None:
        check_camera_name(self.name)
        if self.fps is not None:
            check_fps(self.fps)
        if (self.width is None) != (self.height is None):
            raise ConfigError(f"camera {self.name!r}: give both width and height, or neither")
        if self.width is not None and self.height is not None:
            check_size(self.width, self.height)
        if self.topic is not None and self.video is None:
            raise ConfigError(f"camera {self.name!r}: a topic is read from a recording (video)")
        check_priority(self.priority, f"camera {self.name!r}")
        if self.detect_every is not None:
            check_detect_every(self.detect_every, f"camera {self.name!r}: ")

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) in pixels, when known."""
        if self.width is None or self.height is None:
            return None
        return self.width, self.height


@dataclass(frozen=True)
class RigConfig:
    """The cameras of one vehicle, in a fixed order (the batch order of the pipeline), and
    optionally the model that runs on them by default (a synthetic rig names the model
    trained on it)."""

    cameras: tuple[CameraConfig, ...]
    source_path: Path | None = field(default=None, compare=False)
    model: str | None = None

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

# The model trained on the synthetic world (drivepercept.models.tiny.NAME; named, not
# imported: rig files are read without torch). A simulated rig runs it by default.
SIMULATED_MODEL = "drivepercept-tiny"
SIMULATOR = "drivepercept simulate"  # the [simulation] generator a simulated rig records

_RIG_KEYS = {"model", "cameras"}
_CAMERA_KEYS = {"name", "video", "topic", "source", "fps", "width", "height", "priority"}
_CAMERA_KEYS |= {"intrinsics", "extrinsics", "detect_every"}


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
    topic = table.get("topic")
    if topic is not None and (not isinstance(topic, str) or not topic):
        raise ConfigError(f"{where}: topic must be a topic name string, got {topic!r}")
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
        topic=topic,
        priority=_number(table, "priority", where) if "priority" in table else 1.0,
        detect_every=table.get("detect_every"),  # checked by CameraConfig
    )


def load_rig(path: str | Path) -> RigConfig:
    """Read a rig file. Relative video paths are resolved against the file's folder.

    Raises:
        ConfigError: the file is missing, is not TOML, or a camera entry is invalid.
    """
    path = Path(path)
    data = read_toml(path, what="rig file")
    # other tables ([simulation]) say how a rig was made and are not read; other keys are typos
    unknown = sorted(k for k, v in data.items() if not (k in _RIG_KEYS or isinstance(v, Mapping)))
    if unknown:
        raise ConfigError(f"rig file {path}: unknown keys {unknown}; expected {sorted(_RIG_KEYS)}")
    cameras = data.get("cameras")
    if not isinstance(cameras, list) or not cameras:
        raise ConfigError(f"rig file {path} has no [[cameras]] entries")
    base_dir = path.resolve().parent
    model = data.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(f"rig file {path}: model must be a model name, got {model!r}")
    simulation = data.get("simulation")
    # clips simulated before rig files named their model: the one trained on that world
    simulated = isinstance(simulation, Mapping) and simulation.get("generator") == SIMULATOR
    if model is None and simulated:
        model = SIMULATED_MODEL
    try:
        return RigConfig(
            cameras=tuple(_camera_from_table(raw, i, base_dir) for i, raw in enumerate(cameras)),
            source_path=path,
            model=model,
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
    given = {"topic": camera.topic, "source": camera.source, "fps": camera.fps}
    given["detect_every"] = camera.detect_every
    table |= {k: v for k, v in given.items() if v is not None}
    if camera.priority != 1.0:
        table["priority"] = camera.priority
    if camera.width is not None and camera.height is not None:
        table["width"] = camera.width
        table["height"] = camera.height
    if camera.intrinsics is not None:
        k = camera.intrinsics
        table["intrinsics"] = {n: round(getattr(k, n), 6) for n in ("fx", "fy", "cx", "cy")}
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
    data: dict[str, Any] = {"model": rig.model} if rig.model else {}
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


# --------------------------------------------------------------------------- sources -> cameras

VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mkv", ".mov", ".m4v", ".webm", ".ts"})
STREAM_PREFIXES = ("rtsp://", "rtsps://", "http://", "https://", "udp://", "tcp://", "rtmp://")


def rig_model(sources: Sequence[str]) -> str | None:
    """The model every rig file among `sources` names, when all sources are rig files that
    name the same one (None otherwise: the caller picks the default)."""
    models = {
        load_rig(s).model if s.lower().endswith(".toml") and "://" not in s else None
        for s in sources
    }
    return models.pop() if len(models) == 1 else None


def is_stream(source: str) -> bool:
    """A network stream OpenCV's FFmpeg backend opens."""
    return source.lower().startswith(STREAM_PREFIXES)


def is_device(source: str) -> bool:
    """A camera device: an index ("0") or a V4L2 path ("/dev/video0")."""
    return source.isdigit() or source.startswith("/dev/video")


def safe_name(text: str) -> str:
    """A camera name from free text: characters other than letters, digits, `_` and `-`
    become `_`, at most 64 characters ("camera" when nothing is left)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", text).strip("_-") or "camera"
    return name[:64]


def _rig_cameras(path: Path, *, live: bool) -> list[CameraConfig]:
    cams = []
    for cam in load_rig(path).cameras:
        if cam.video is None and (not live or cam.source is None):
            what = "neither a source nor a video" if live else "no video"
            raise ConfigError(f"camera {cam.name!r} in {path} has {what}")
        cams.append(cam)
    return cams


def resolve_cameras(
    items: Sequence[str | CameraConfig], *, live: bool = False, folders_of_videos: bool = False
) -> tuple[CameraConfig, ...]:
    """Sources -> named cameras, in the order given: the one resolver of every mode.

    Rules, the same for replay, live and `serve-cameras`:

    * `*.toml`: a rig file; its cameras in order (a camera needs a `video`; live mode also
      takes a camera's `source`, preferred over its video).
    * `NAME=SOURCE`: a camera called NAME reading SOURCE (a file, folder, device or URL).
    * a device ("0", "/dev/video0") or stream URL: a live camera named cam1, cam2, ... by
      position.
    * a folder: with `folders_of_videos` (serve-cameras) each video in it (sorted) is a
      camera; otherwise the folder of images is one camera.
    * any other path: a video file, one camera named after its file stem.
    * a `CameraConfig`: that camera, its name given (a recorded drive's topics, resolved
      by `drivepercept.sources.recordings`, which reads the file).

    Names are made safe (`safe_name`). A repeated name gets `_2`, `_3`, ... except a name
    given explicitly (NAME=SOURCE or a rig's), which must be unique. At most MAX_CAMERAS.

    Raises:
        ConfigError: no sources, a bad rig, a camera without a video, a repeated explicit
            name, too many cameras.
    """
    if not items:
        raise ConfigError("give at least one source: a rig.toml, a video, a folder or a URL")
    cams: list[tuple[CameraConfig, bool]] = []  # (camera, name given explicitly)
    for item in items:
        if isinstance(item, CameraConfig):
            cams.append((item, True))
            continue
        if item.lower().endswith(".toml") and "://" not in item:
            cams += [(c, True) for c in _rig_cameras(Path(item), live=live)]
            continue
        name, sep, source = item.partition("=")
        if sep and name and "://" not in name and "/" not in name:
            if not source:
                raise ConfigError(f"camera {item!r}: expected NAME=SOURCE, the source is empty")
            cams.append((_camera(safe_name(name), source), True))
            continue
        if is_stream(item) or is_device(item):
            cams.append((CameraConfig(name=f"cam{len(cams) + 1}", source=item), False))
            continue
        path = Path(item)
        if folders_of_videos and path.is_dir():
            videos = sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES
            )
            if not videos:
                kinds = ", ".join(sorted(VIDEO_SUFFIXES))
                raise ConfigError(f"expected videos ({kinds}) in {path}, got none")
            cams += [(CameraConfig(name=safe_name(v.stem), video=v), False) for v in videos]
            continue
        stem = path.stem if path.suffix else path.name
        cams.append((CameraConfig(name=safe_name(stem), video=path), False))
    explicit = [c.name for c, given in cams if given]
    repeated = sorted({n for n in explicit if explicit.count(n) > 1})
    if repeated:
        raise ConfigError(f"camera names must be unique, got {repeated} more than once")
    seen: dict[str, int] = {}
    unique = []
    for cam, _ in cams:
        n = seen.get(cam.name, 0)
        seen[cam.name] = n + 1
        unique.append(cam if n == 0 else replace(cam, name=f"{cam.name}_{n + 1}"))
    if len(unique) > MAX_CAMERAS:
        raise ConfigError(f"at most {MAX_CAMERAS} cameras, got {len(unique)}")
    return tuple(unique)


def _camera(name: str, source: str) -> CameraConfig:
    """NAME=SOURCE: a live source (device, URL) or a recorded one (file, folder)."""
    if is_stream(source) or is_device(source):
        return CameraConfig(name=name, source=source)
    return CameraConfig(name=name, video=Path(source))


def camera_source(cam: CameraConfig, *, live: bool = False) -> str:
    """What a camera reads: in live mode its live `source` where it has one, else (replay,
    real-time replay) its recorded `video`; a camera with only one of them reads that."""
    if live and cam.source is not None:
        return cam.source
    if cam.video is not None:
        return str(cam.video)
    if cam.source is not None:
        return cam.source
    raise ConfigError(f"camera {cam.name!r} has neither a source nor a video")
