"""Small hand-built worlds for the simulator tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from drivepercept.sim.camera import CameraModel, default_rig_cameras
from drivepercept.sim.models import Category, Solid
from drivepercept.sim.road import Road, forward_lane_d
from drivepercept.sim.world import Actor, Lighting, Motion, World

EGO_D = forward_lane_d(1)

PLAIN_LIGHT = Lighting(
    name="test",
    sun_dir=(0.0, 0.6, 0.8),
    ambient=0.6,
    diffuse=0.4,
    sky_top=(200, 150, 90),
    sky_horizon=(230, 210, 190),
    ground=(60, 110, 90),
    asphalt=(85, 85, 88),
    haze=(220, 215, 205),
    visibility_m=1e6,
    noise_sigma=0.0,
    blur_sigma=0.0,
)


@dataclass(frozen=True)
class Placed:
    """An actor for a hand-built world: where it is (road coordinates) and how it moves."""

    category: Category
    solid: Solid
    s_m: float
    d_m: float = EGO_D
    yaw_rad: float = 0.0
    speed_mps: float = 0.0


def straight_world(placed: Sequence[Placed], *, ego_speed_mps: float = 0.0) -> World:
    """A straight road along world x, the ego at s = 0 in the middle lane, no scenery."""
    actors = tuple(
        Actor(
            track_id=i + 1,
            category=p.category,
            solid=p.solid,
            motion=Motion(s0_m=p.s_m, d0_m=p.d_m, speed_s_mps=p.speed_mps, yaw_rad=p.yaw_rad),
        )
        for i, p in enumerate(placed)
    )
    return World(
        road=Road.straight(),
        ego=Motion(s0_m=0.0, d0_m=EGO_D, speed_s_mps=ego_speed_mps),
        actors=actors,
        scenery=(),
        lighting=PLAIN_LIGHT,
    )


def rig(count: int = 6, width: int = 640, height: int = 360) -> list[CameraModel]:
    return [
        CameraModel.from_config(c) for c in default_rig_cameras(count, width=width, height=height)
    ]
