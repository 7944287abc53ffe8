"""Camera geometry and the checks shared by rigs and the simulator.

Conventions, written once:

* Ego frame: x forward, y left, z up, metres, origin on the ground under the rear axle.
* A camera's yaw turns it to the left (0 looks forward, 90 left, 180 back, -90 right);
  pitch tilts it down (positive looks at the ground).
* Camera frame (OpenCV): x right, y down, z along the optical axis.
* Intrinsics: pixel centres at integer coordinates + 0.5 are not used; (u, v) = (fx x/z + cx,
  fy y/z + cy) with pixel i covering [i, i + 1).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError

MAX_CAMERAS = 12
MIN_SIZE_PX = 32
MAX_SIZE_PX = 8192
MAX_FPS = 240.0


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


MAX_PRIORITY = 1000.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def check_camera_name(name: str) -> str:
    """A camera name: 1-64 letters, digits, '_' or '-', starting with a letter or digit (it
    names files, topics and metrics labels); ConfigError otherwise."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            "camera name must be 1-64 letters, digits, '_' or '-' (starting with a letter "
            f"or digit), got {name!r}"
        )
    return name


MAX_DETECT_EVERY = 100  # detect_every at most: a frame in 100 (6.7 s at 15 fps)


def check_detect_every(value: object, where: str) -> int:
    """A detection interval: a whole number of frames, 1..MAX_DETECT_EVERY (ConfigError
    otherwise; 1: every frame)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DETECT_EVERY:
        raise ConfigError(
            f"{where}detect_every must be 1..{MAX_DETECT_EVERY} (1: every frame), got {value!r}"
        )
    return value


def check_priority(value: object, where: str) -> float:
    """A camera's priority: a finite number in (0, MAX_PRIORITY] (ConfigError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: priority must be a number, got {value!r}")
    if not (math.isfinite(value) and 0 < value <= MAX_PRIORITY):
        raise ConfigError(f"{where}: priority must be in (0, {MAX_PRIORITY:g}], got {value!r}")
    return float(value)


def check_size(width: int, height: int) -> tuple[int, int]:
    """Return (width, height) if it is a usable frame size, else raise ConfigError."""
    if not (MIN_SIZE_PX <= width <= MAX_SIZE_PX and MIN_SIZE_PX <= height <= MAX_SIZE_PX):
        raise ConfigError(
            f"frame size must be between {MIN_SIZE_PX}x{MIN_SIZE_PX} and "
            f"{MAX_SIZE_PX}x{MAX_SIZE_PX} pixels, got {width}x{height}"
        )
    return width, height


_SIZE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")  # WIDTHxHEIGHT


def _split_size(text: str) -> tuple[int, int] | None:
    match = _SIZE.fullmatch(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_size(text: str) -> tuple[int, int]:
    """Parse a camera frame's 'WIDTHxHEIGHT' (e.g. '640x360') and check it."""
    pair = _split_size(text)
    if pair is None:
        raise ConfigError(f"size must look like WIDTHxHEIGHT (e.g. 640x360), got {text!r}")
    return check_size(*pair)


def parse_input_size(value: object) -> tuple[int, int] | None:
    """A model's input size: None, "WIDTHxHEIGHT" or a (width, height) pair -> (width, height)
    of positive whole pixels. Any positive size, not a camera frame's range (`check_size`):
    each model checks the multiples it needs.

    Raises:
        ConfigError: anything else (a word, one number, a zero or a fraction).
    """
    if value is None:
        return None
    pair = (_split_size(value) or value) if isinstance(value, str) else value
    if (
        isinstance(pair, (tuple, list))
        and len(pair) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair)
    ):
        return (int(pair[0]), int(pair[1]))
    raise ConfigError(f"input size must look like WIDTHxHEIGHT (e.g. 640x384), got {value!r}")


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


def camera_rotation(extrinsics: Extrinsics) -> npt.NDArray[np.float64]:
    """3x3 rotation taking ego-frame vectors into the camera frame (rows: the camera's right,
    down and forward axes in the ego frame)."""
    yaw = math.radians(extrinsics.yaw_deg)
    pitch = math.radians(extrinsics.pitch_deg)
    forward = np.array(
        [math.cos(yaw) * math.cos(pitch), math.sin(yaw) * math.cos(pitch), -math.sin(pitch)]
    )
    right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
    down = np.cross(forward, right)
    return np.stack([right, down, forward])


def ground_points(
    uv: npt.NDArray[np.float64],
    intrinsics: Intrinsics,
    extrinsics: Extrinsics,
    *,
    max_range_m: float = 100.0,
    rotation: npt.NDArray[np.float64] | None = None,
) -> npt.NDArray[np.float64]:
    """Pixels -> where their rays meet the ground (z = 0), (N, 2) ego x, y in metres
    (`rotation`: `camera_rotation(extrinsics)`, when the caller keeps it).

    A pixel whose ray does not go down (at or above the horizon), or meets the ground farther
    than `max_range_m` from the camera (where a pixel spans metres), gives NaN: the caller
    cannot place it. A camera below the ground or at it places nothing.
    """
    uv = np.asarray(uv, np.float64).reshape(-1, 2)
    if rotation is None:
        rotation = camera_rotation(extrinsics)
    n = len(uv)
    k = np.array([[intrinsics.fx, intrinsics.fy, intrinsics.cx, intrinsics.cy]])
    return ground_points_of_rows(
        uv,
        np.repeat(k, n, axis=0),
        np.broadcast_to(rotation, (n, 3, 3)),
        np.repeat(np.asarray([extrinsics.position_m], np.float64), n, axis=0),
        max_range_m=max_range_m,
    )


def ground_points_of_rows(
    uv: npt.NDArray[np.float64],
    intrinsics: npt.NDArray[np.float64],
    rotations: npt.NDArray[np.float64],
    positions: npt.NDArray[np.float64],
    *,
    max_range_m: float = 100.0,
) -> npt.NDArray[np.float64]:
    """`ground_points` with each pixel's own camera: `uv` `(N, 2)`, `intrinsics` `(N, 4)`
    as (fx, fy, cx, cy), `rotations` `(N, 3, 3)` (`camera_rotation`) and `positions`
    `(N, 3)` (the mounts, metres), so that the pixels of a whole rig are placed at once."""
    out = np.full((len(uv), 2), np.nan)
    if not len(uv):
        return out
    rays_cam = np.stack(
        [
            (uv[:, 0] - intrinsics[:, 2]) / intrinsics[:, 0],
            (uv[:, 1] - intrinsics[:, 3]) / intrinsics[:, 1],
            np.ones(len(uv)),
        ],
        axis=1,
    )
    rays = np.einsum("nk,nkj->nj", rays_cam, rotations)  # camera -> ego: R^T, row by row
    height = positions[:, 2]
    down = (rays[:, 2] < -1e-9) & (height > 0)  # a camera at or below the ground: nothing
    scale = np.where(down, height / np.where(down, -rays[:, 2], 1.0), np.nan)
    hit = rays[:, :2] * scale[:, None]
    far = ~(np.hypot(hit[:, 0], hit[:, 1]) <= max_range_m)
    hit[far] = np.nan
    return np.asarray(hit + positions[:, :2], np.float64)
