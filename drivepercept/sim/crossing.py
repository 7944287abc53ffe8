"""The `crossing` preset: long drives whose objects cross from one camera's view to the next.

Built for multi-camera tracking, where an object must keep one identity while it passes from
camera to camera. The world is the default world's (`drivepercept.sim.world`: same road
cross-section, classes, solids and rendering); only the road's shape and where and how fast
things move differ:

- the road is straight for the first 15 m or more of the drive, then winds: bend after bend
  of 50-100 degrees at a radius of 35-70 m, mostly alternating left and right, taken by the
  ego at 7-10 m/s. The ego yaws through them, so signs, lights, people and slow traffic sweep
  across the cameras (on a straight road the same traffic is seen by two cameras at once less
  than half as often);
- the lanes beside the ego are busy (8-25 m gaps, more trucks and buses) and move at
  1.5-3 m/s relative to it: the left one faster (its vehicles overtake the ego: back,
  back_left, front_left, front), the right one slower (the ego overtakes them: front,
  front_right, back_right, back); they are placed only where they pass the ego in the drive.
  A lead and a following vehicle share the ego's lane, and oncoming traffic passes on the left;
- cyclists ride the right bike lane slower than the ego and the left one towards it,
  pedestrians walk or stand on both sidewalks, and crosswalks with traffic lights come every
  100-220 m. Nobody crosses at them: the generator keeps traffic clear of crossing
  pedestrians by not spawning the vehicles that would meet one, and traffic this close to
  the ego would all meet one.

The road model has no junctions, so "a turn" is an honest sharp curve of the road itself, not
a turn at an intersection. The buildings on the inside of a sharp bend are shortened to fit
it (the inside is shorter than the road); they hide what lies beyond the bend, as in a town.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from drivepercept.sim import road as rd
from drivepercept.sim.world import (
    _EGO_LANE,
    VIEW_RANGE_M,
    Actor,
    Motion,
    World,
    _Builder,
    random_lighting,
)

TRAFFIC_REACH_M = 120.0  # traffic is spawned only where it comes this close to the ego
_SHARP_PER_M = 1.0 / 200.0  # the buildings inside a bend tighter than this are fitted to it
_MIX_FAST = (0.8, 0.1, 0.1)  # car, truck, bus
_MIX_SLOW = (0.45, 0.35, 0.2)
_MIX_SIDE = (0.6, 0.25, 0.15)  # the lanes beside the ego


def winding_road(
    rng: np.random.Generator, *, ego_end_m: float, s_min_m: float, s_max_m: float
) -> rd.Road:
    """Straight behind the ego and for its first 15 m or more, then bend after bend (50-100
    degrees at a radius of 35-70 m, 5-30 m of straight between them), mostly alternating
    left and right, the road's heading kept within 100 degrees of the start (so it never comes
    back on itself). The first bend starts within the first 20 % of the ego's drive."""
    s = np.arange(math.floor(s_min_m), math.ceil(s_max_m) + 1.0, 1.0)
    curvature = np.zeros_like(s)
    start = max(15.0, float(rng.uniform(0.05, 0.2)) * ego_end_m)
    sign = 1.0 if rng.random() < 0.5 else -1.0
    heading = 0.0
    while start < s[-1]:
        radius = float(rng.uniform(35.0, 70.0))
        angle = math.radians(float(rng.uniform(50.0, 100.0)))
        if abs(heading + sign * angle) > math.radians(100.0):
            sign = -sign
        length = radius * angle
        curvature[(s >= start) & (s < start + length)] = sign / radius
        heading += sign * angle
        start += length + float(rng.uniform(5.0, 30.0))
        if rng.random() < 0.75:
            sign = -sign
    return rd.Road.from_curvature(s, curvature)


def _fit_bend_insides(scenery: list[Actor], road: rd.Road) -> list[Actor]:
    """Shorten the buildings on the inside of a sharp bend so that they fit it.

    The inside of a bend is shorter than the road, so the blocks placed along the road would
    overlap each other there, and a long straight block would reach into the sidewalk with its
    ends. Such a block is shortened (along the road) until its back edge fits its share of the
    bend and its front corners keep 0.5 m from the sidewalk; one left shorter than 4 m goes.
    """
    kept = []
    for a in scenery:
        xs = a.solid.vertices_m[..., 0]
        length = float(np.ptp(xs))
        if length <= 6.0:  # a tree (buildings are 10 m or longer)
            kept.append(a)
            continue
        depth = float(np.ptp(a.solid.vertices_m[..., 1]))
        d = abs(a.motion.d0_m)
        span = np.linspace(a.motion.s0_m - length / 2 - 10.0, a.motion.s0_m + length / 2 + 10.0)
        kappa = float((road.curvature_per_m(span) * math.copysign(1.0, a.motion.d0_m)).max())
        if kappa <= _SHARP_PER_M:
            kept.append(a)
            continue
        radius = 1.0 / kappa  # of the centre line
        front = radius - (d - depth / 2)  # of the building's front face
        edge = radius - abs(rd.RIGHT_SIDEWALK_D[0] if a.motion.d0_m < 0 else rd.LEFT_SIDEWALK_D[1])
        half_max = math.sqrt(max((edge - 0.5) ** 2 - front**2, 0.0))
        fitted = min(length * max(1.0 - kappa * (d + depth / 2), 0.0), 2.0 * half_max)
        if fitted < 4.0:
            continue
        scale = np.array([fitted / length, 1.0, 1.0])
        vertices = a.solid.vertices_m * scale
        solid = replace(
            a.solid,
            vertices_m=vertices,
            radius_m=float(np.linalg.norm(vertices.reshape(-1, 3), axis=1).max()),
        )
        kept.append(replace(a, solid=solid))
    return kept


def generate_crossing_world(seed: int, *, duration_s: float) -> World:
    """A `crossing` world for a drive of `duration_s` seconds (see the module docstring).

    The same seed and duration always give the same world; its lighting is the default
    preset's for that seed.
    """
    rng = np.random.default_rng(seed)
    lighting = random_lighting(rng)
    ego_speed = float(rng.uniform(7.0, 10.0))
    ego_end = ego_speed * duration_s
    reach = VIEW_RANGE_M + 60.0
    road = winding_road(rng, ego_end_m=ego_end, s_min_m=-reach, s_max_m=ego_end + reach)
    b = _Builder(rng=rng, duration_s=duration_s, ego_speed=ego_speed, reach_m=TRAFFIC_REACH_M)

    crosswalks: list[float] = []
    s = float(rng.uniform(30.0, 90.0))
    while s < ego_end + 60.0:
        crosswalks.append(s)
        b.crossing(s, walkers=0)  # (crossing walkers would clear the dense traffic away)
        s += float(rng.uniform(100.0, 220.0))

    fast_rel, slow_rel = float(rng.uniform(1.5, 3.0)), float(rng.uniform(1.5, 3.0))
    b.lane_traffic(  # overtakes the ego on its left
        d=rd.forward_lane_d(0),
        speed=ego_speed + fast_rel,
        direction=1,
        gap=(8.0, 25.0),
        mix=_MIX_SIDE,
        keep_clear=None,
        s_range=(-fast_rel * duration_s - 20.0, 30.0),  # all come past the ego
    )
    b.lane_traffic(  # the ego's own lane moves with it; a few metres kept clear around it
        d=rd.forward_lane_d(_EGO_LANE),
        speed=ego_speed,
        direction=1,
        gap=(30.0, 60.0),
        mix=_MIX_FAST,
        keep_clear=(-12.0, 16.0),
        s_range=(-40.0, 50.0),
    )
    b.lane_traffic(  # overtaken by the ego on its right
        d=rd.forward_lane_d(2),
        speed=ego_speed - slow_rel,
        direction=1,
        gap=(8.0, 25.0),
        mix=_MIX_SIDE,
        keep_clear=None,
        s_range=(-30.0, slow_rel * duration_s + 20.0),  # the ego passes them all
    )
    for lane in range(rd.ONCOMING_LANES):
        b.lane_traffic(
            d=rd.oncoming_lane_d(lane),
            speed=float(rng.uniform(8.0, 13.0)),
            direction=-1,
            gap=(30.0, 90.0),
            mix=_MIX_FAST if lane == 0 else _MIX_SLOW,
            keep_clear=None,
        )
    bike = (20.0, 60.0)
    b.cyclists(
        d=sum(rd.RIGHT_BIKE_D) / 2, speed=float(rng.uniform(4.0, 6.0)), direction=1, gap=bike
    )
    b.cyclists(
        d=sum(rd.LEFT_BIKE_D) / 2, speed=float(rng.uniform(3.5, 6.0)), direction=-1, gap=bike
    )

    near_lo, near_hi = -80.0, ego_end + 120.0
    b.walkers(d_range=rd.RIGHT_SIDEWALK_D, s_lo=near_lo, s_hi=near_hi, gap=(6.0, 20.0))
    b.walkers(d_range=rd.LEFT_SIDEWALK_D, s_lo=near_lo, s_hi=near_hi, gap=(6.0, 20.0))
    b.signs(near_lo, near_hi, crosswalks, gap=(20.0, 60.0))
    b.buildings(-reach, ego_end + reach)

    ego = Motion(s0_m=0.0, d0_m=rd.forward_lane_d(_EGO_LANE), speed_s_mps=ego_speed)
    return World(
        road=road,
        ego=ego,
        actors=tuple(b.actors),
        scenery=tuple(_fit_bend_insides(b.scenery, road)),
        lighting=lighting,
        crosswalks_s=tuple(crosswalks),
        seed=seed,
    )
