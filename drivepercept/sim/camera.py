"""Pinhole camera geometry for the synthetic rig, and the default rig layouts.

Frames (see `drivepercept.config`): world x east, y north, z up; ego x forward, y left, z up;
camera x right, y down, z forward (OpenCV). `CameraModel` holds the fixed ego-to-camera part;
the ego pose changes every frame and is applied on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError
from drivepercept.geometry import (
    Extrinsics,
    Intrinsics,
    camera_rotation,
    check_camera_count,
    check_size,
)
from drivepercept.rig import CameraConfig

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Pose2D:
    """A pose on the ground plane: position in metres, heading in radians (0 = +x, CCW)."""

    x_m: float
    y_m: float
    heading_rad: float

    def rotation(self) -> FloatArray:
        """3x3 rotation taking vectors from this pose's frame to the world frame."""
        c, s = math.cos(self.heading_rad), math.sin(self.heading_rad)
        return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])

    def to_world(self, points_local: FloatArray) -> FloatArray:
        """(N, 3) points in this pose's frame -> (N, 3) world points."""
        out = points_local @ self.rotation().T + np.array([self.x_m, self.y_m, 0.0])
        return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class CameraModel:
    """A camera of the rig with its matrices precomputed.

    Attributes:
        config: the camera as written in rig.toml.
        K: 3x3 intrinsic matrix.
        R_cam_from_ego: rotation of ego vectors into the camera frame.
        mount_m: camera centre in the ego frame.
    """

    config: CameraConfig
    K: FloatArray
    R_cam_from_ego: FloatArray
    mount_m: FloatArray

    @classmethod
    def from_config(cls, config: CameraConfig) -> CameraModel:
        """Build from a rig camera; it must have a size, intrinsics and extrinsics."""
        if config.size is None or config.intrinsics is None or config.extrinsics is None:
            raise ConfigError(
                f"camera {config.name!r} needs width, height, intrinsics and extrinsics "
                "to be simulated"
            )
        k = config.intrinsics
        K = np.array([[k.fx, 0.0, k.cx], [0.0, k.fy, k.cy], [0.0, 0.0, 1.0]])
        return cls(
            config=config,
            K=K,
            R_cam_from_ego=camera_rotation(config.extrinsics),
            mount_m=np.array(config.extrinsics.position_m, dtype=np.float64),
        )

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def width(self) -> int:
        assert self.config.width is not None
        return self.config.width

    @property
    def height(self) -> int:
        assert self.config.height is not None
        return self.config.height

    def world_to_camera_transform(self, ego: Pose2D) -> tuple[FloatArray, FloatArray]:
        """(R, t) with X_cam = X_world @ R.T + t for the given ego pose."""
        R_world_from_ego = ego.rotation()
        R = self.R_cam_from_ego @ R_world_from_ego.T
        ego_origin = np.array([ego.x_m, ego.y_m, 0.0])
        centre_world = ego_origin + R_world_from_ego @ self.mount_m
        return R, -R @ centre_world

    def centre_world(self, ego: Pose2D) -> FloatArray:
        """Camera centre in world coordinates."""
        return np.array([ego.x_m, ego.y_m, 0.0]) + ego.rotation() @ self.mount_m

    def world_to_camera(self, points_world: FloatArray, ego: Pose2D) -> FloatArray:
        """(N, 3) world points -> (N, 3) camera-frame points."""
        R, t = self.world_to_camera_transform(ego)
        return np.asarray(np.asarray(points_world, dtype=np.float64) @ R.T + t, dtype=np.float64)

    def project(self, points_cam: FloatArray) -> FloatArray:
        """(N, 3) camera-frame points with z > 0 -> (N, 2) pixel coordinates (u, v)."""
        z = points_cam[:, 2:3]
        uv = points_cam[:, :2] / z
        focal = np.array([self.K[0, 0], self.K[1, 1]])
        centre = np.array([self.K[0, 2], self.K[1, 2]])
        return np.asarray(uv * focal + centre, dtype=np.float64)


# --------------------------------------------------------------------------- default rigs

_CAM_HEIGHT_M = 1.55

# nuScenes-like: six cameras around the roof, the back one wider.
_NUSCENES: tuple[tuple[str, tuple[float, float, float], float, float], ...] = (
    ("front", (1.70, 0.00, _CAM_HEIGHT_M), 0.0, 70.0),
    ("front_left", (1.55, 0.50, _CAM_HEIGHT_M), 55.0, 70.0),
    ("front_right", (1.55, -0.50, _CAM_HEIGHT_M), -55.0, 70.0),
    ("back", (0.00, 0.00, _CAM_HEIGHT_M), 180.0, 110.0),
    ("back_left", (1.05, 0.50, _CAM_HEIGHT_M), 110.0, 70.0),
    ("back_right", (1.05, -0.50, _CAM_HEIGHT_M), -110.0, 70.0),
)

_RING_NAMES = {
    4: ("front", "left", "back", "right"),
    8: ("front", "front_left", "left", "back_left", "back", "back_right", "right", "front_right"),
}


def _ring_name(yaw_deg: float) -> str:
    if abs(yaw_deg) < 1e-6:
        return "front"
    if abs(abs(yaw_deg) - 180.0) < 1e-6:
        return "back"
    side = "left" if yaw_deg > 0 else "right"
    return f"{side}_{round(abs(yaw_deg)):03d}"


def default_rig_cameras(
    count: int, *, width: int, height: int, fps: float | None = None
) -> tuple[CameraConfig, ...]:
    """The default layout for `count` cameras (1-12) at the given resolution.

    6 cameras is the nuScenes layout (front, front_left, front_right, back, back_left,
    back_right); 1 is a front camera; 2 is front and back; any other count is a ring of evenly
    spaced cameras whose fields of view overlap by about 15 %.
    """
    check_camera_count(count)
    check_size(width, height)
    layout: list[tuple[str, tuple[float, float, float], float, float]]
    if count == 6:
        layout = list(_NUSCENES)
    elif count == 1:
        layout = [_NUSCENES[0]]
    elif count == 2:
        layout = [_NUSCENES[0], _NUSCENES[3]]
    else:
        step = 360.0 / count
        fov = min(150.0, max(60.0, step * 1.15))
        layout = []
        for i in range(count):
            yaw = i * step
            yaw = yaw - 360.0 if yaw > 180.0 + 1e-9 else yaw
            name = _RING_NAMES[count][i] if count in _RING_NAMES else _ring_name(yaw)
            r = math.radians(yaw)
            # Cameras sit on a 0.5 m roof ring around a point 1.0 m ahead of the rear axle.
            pos = (1.0 + 0.5 * math.cos(r), 0.5 * math.sin(r), _CAM_HEIGHT_M)
            layout.append((name, pos, yaw, fov))
    return tuple(
        CameraConfig(
            name=name,
            fps=fps,
            width=width,
            height=height,
            intrinsics=Intrinsics.from_fov(width=width, height=height, fov_deg=fov),
            extrinsics=Extrinsics(position_m=pos, yaw_deg=yaw, pitch_deg=0.0),
        )
        for name, pos, yaw, fov in layout
    )
