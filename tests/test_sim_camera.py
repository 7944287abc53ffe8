"""Pinhole geometry and default rig layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from drivepercept.errors import ConfigError
from drivepercept.geometry import Extrinsics, Intrinsics
from drivepercept.rig import CameraConfig
from drivepercept.sim.camera import CameraModel, Pose2D, default_rig_cameras


def _camera(*, yaw: float = 0.0, pitch: float = 0.0, pos=(1.7, 0.0, 1.55)) -> CameraModel:  # type: ignore[no-untyped-def]
    return CameraModel.from_config(
        CameraConfig(
            name="cam",
            width=640,
            height=360,
            intrinsics=Intrinsics.from_fov(width=640, height=360, fov_deg=70.0),
            extrinsics=Extrinsics(position_m=pos, yaw_deg=yaw, pitch_deg=pitch),
        )
    )


def test_point_projects_where_hand_computed() -> None:
    # given the ego at (10, 5) heading north and a front camera 1.7 m ahead, 1.55 m up
    cam = _camera()
    ego = Pose2D(10.0, 5.0, math.pi / 2)
    # a point 20 m in front of the camera, 2 m to the left, at camera height:
    # ego frame (21.7, 2, 1.55) -> world (10 - 2, 5 + 21.7, 1.55)
    point = np.array([[8.0, 26.7, 1.55]])
    cam_xyz = cam.world_to_camera(point, ego)
    assert cam_xyz[0] == pytest.approx([-2.0, 0.0, 20.0], abs=1e-9)
    u, v = cam.project(cam_xyz)[0]
    fx = 320.0 / math.tan(math.radians(35.0))  # 457.007...
    assert u == pytest.approx(320.0 - fx * 2.0 / 20.0, abs=1e-6)  # 274.2993
    assert v == pytest.approx(180.0, abs=1e-6)


def test_point_below_the_axis_lands_below_the_centre() -> None:
    cam = _camera()
    ego = Pose2D(0.0, 0.0, 0.0)
    u, v = cam.project(cam.world_to_camera(np.array([[11.7, 0.0, 0.55]]), ego))[0]
    fx = 320.0 / math.tan(math.radians(35.0))
    assert (u, v) == pytest.approx((320.0, 180.0 + fx * 1.0 / 10.0))


def test_yaw_and_pitch_turn_the_optical_axis() -> None:
    ego = Pose2D(0.0, 0.0, 0.0)
    left = _camera(yaw=90.0, pos=(0.0, 0.0, 1.5))
    # a point 10 m to the ego's left at camera height is on the left camera's axis
    assert left.project(left.world_to_camera(np.array([[0.0, 10.0, 1.5]]), ego))[
        0
    ] == pytest.approx((320.0, 180.0))
    # and behind the front camera's image plane
    front = _camera(pos=(0.0, 0.0, 1.5))
    assert front.world_to_camera(np.array([[-10.0, 0.0, 1.5]]), ego)[0, 2] < 0
    # a camera pitched 10 deg down sees the ground point on its axis at the centre
    down = _camera(pitch=10.0, pos=(0.0, 0.0, 1.5))
    ground = np.array([[1.5 / math.tan(math.radians(10.0)), 0.0, 0.0]])
    assert down.project(down.world_to_camera(ground, ego))[0] == pytest.approx((320.0, 180.0))


def test_camera_without_geometry_cannot_be_simulated() -> None:
    with pytest.raises(ConfigError, match="intrinsics"):
        CameraModel.from_config(CameraConfig(name="front", width=640, height=360))


def test_default_six_camera_rig_is_nuscenes_like() -> None:
    cams = default_rig_cameras(6, width=640, height=360)
    assert [c.name for c in cams] == [
        "front",
        "front_left",
        "front_right",
        "back",
        "back_left",
        "back_right",
    ]
    back = cams[3]
    assert back.extrinsics is not None and back.extrinsics.yaw_deg == 180.0
    assert back.intrinsics is not None and back.intrinsics.hfov_deg(640) == pytest.approx(110.0)


@pytest.mark.parametrize("count", range(1, 13))
def test_every_camera_count_gives_a_valid_rig(count: int) -> None:
    cams = default_rig_cameras(count, width=800, height=600)
    assert len(cams) == count
    assert len({c.name for c in cams}) == count
    if count >= 3:
        # then every direction around the vehicle is seen by some camera
        covered = np.zeros(360, dtype=bool)
        for c in cams:
            assert c.intrinsics is not None and c.extrinsics is not None
            half = c.intrinsics.hfov_deg(800) / 2
            offset = (np.arange(360) - c.extrinsics.yaw_deg + 180.0) % 360.0 - 180.0
            covered |= np.abs(offset) <= half
        assert covered.all()


@pytest.mark.parametrize("count", [0, 13, -1])
def test_bad_camera_count_is_refused(count: int) -> None:
    with pytest.raises(ConfigError, match="between 1 and 12"):
        default_rig_cameras(count, width=640, height=360)
