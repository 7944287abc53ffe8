"""The generated world: determinism, road shape, traffic rules the generator promises."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from drivepercept.sim import road as rd
from drivepercept.sim.models import Category
from drivepercept.sim.world import generate_world


def test_same_seed_same_world_other_seed_other_world() -> None:
    a, b, c = (generate_world(s, duration_s=5.0) for s in (4, 4, 5))
    assert [x.motion for x in a.actors] == [x.motion for x in b.actors]
    assert np.array_equal(a.road.x_m, b.road.x_m)
    assert a.lighting == b.lighting
    assert [x.motion for x in a.actors] != [x.motion for x in c.actors]


def test_straight_road_maps_road_to_world_coordinates() -> None:
    road = rd.Road.straight()
    x, y, h = road.pose(np.array([10.0, -3.0]), np.array([2.0, -1.5]))
    assert x == pytest.approx([10.0, -3.0])
    assert y == pytest.approx([2.0, -1.5])
    assert h == pytest.approx([0.0, 0.0])


def test_generated_road_curves_gently_and_keeps_offsets_perpendicular() -> None:
    world = generate_world(9, duration_s=30.0)
    road = world.road
    turn_per_m = np.abs(np.diff(road.heading_rad))
    assert turn_per_m.max() <= 1.0 / 250.0 + 1e-9
    assert np.ptp(road.heading_rad) > 0.05  # it does curve somewhere
    # a point d metres to the side is d metres from the centre line
    s = np.linspace(road.s_m[0], road.s_m[-1], 50)
    cx, cy, _ = road.pose(s, 0.0)
    ox, oy, _ = road.pose(s, 7.0)
    assert np.hypot(ox - cx, oy - cy) == pytest.approx(7.0)


def test_vehicles_in_one_lane_never_overlap() -> None:
    world = generate_world(12, duration_s=20.0)
    lanes: dict[float, list[tuple[float, float, float]]] = {}
    for a in world.actors:
        if a.category in (Category.CAR, Category.TRUCK, Category.BUS, Category.CYCLIST):
            length = float(np.ptp(a.solid.vertices_m[..., 0]))
            lanes.setdefault(round(a.motion.d0_m, 2), []).append(
                (a.motion.s0_m, length, a.motion.speed_s_mps)
            )
    assert len(lanes) >= 6  # five traffic lanes and two bike lanes, minus empty ones
    for vehicles in lanes.values():
        assert len({v for _, _, v in vehicles}) == 1  # one speed per lane
        vehicles.sort()
        for (s0, l0, _), (s1, l1, _) in itertools.pairwise(vehicles):
            assert s1 - s0 >= (l0 + l1) / 2


def test_crossing_pedestrians_are_clear_of_the_ego_lane_when_the_ego_passes() -> None:
    crossings = 0
    for seed in range(6):
        world = generate_world(seed, duration_s=30.0)
        speed = world.ego.speed_s_mps
        for a in world.actors:
            m = a.motion
            if a.category is not Category.PEDESTRIAN or m.speed_d_mps == 0:
                continue
            crossings += 1
            t_pass = m.s0_m / speed  # when the ego is level with the crosswalk
            for t in np.linspace(t_pass - 0.4, t_pass + 0.4, 9):
                d = m.d0_m + m.speed_d_mps * min(max(t - m.t_start_s, 0.0), m.duration_s)
                assert abs(d - world.ego.d0_m) > 2.0, (seed, a.track_id, t)
    assert crossings > 0


def test_world_has_every_kind_of_actor_and_some_scenery() -> None:
    world = generate_world(2, duration_s=20.0)
    kinds = {a.category for a in world.actors}
    assert kinds == set(Category)
    assert len(world.scenery) > 10
    # and traffic both ways: some vehicles drive against the ego's direction
    assert any(a.motion.speed_s_mps < 0 for a in world.actors if a.category is Category.CAR)
    assert any(a.motion.speed_s_mps > world.ego.speed_s_mps for a in world.actors)


def test_traffic_lights_cycle() -> None:
    world = generate_world(2, duration_s=30.0)
    lights = [i for i, a in enumerate(world.actors) if a.category is Category.TRAFFIC_LIGHT]
    assert lights
    seen = {int(world.actor_states(t).lit_lamp[lights[0]]) for t in np.arange(0, 30, 0.5)}
    assert seen == {0, 1, 2}
    assert not math.isnan(world.ego_pose(1.0).x_m)
