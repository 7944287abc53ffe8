"""Renderer and ground truth: geometry, occlusion, truncation, pixel-exact boxes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from simworlds import EGO_D, Placed, rig, straight_world

from drivepercept.sim.models import (
    Category,
    make_car,
    make_pedestrian,
    make_truck,
)
from drivepercept.sim.render import GroundTruthBox, RenderedView, Renderer
from drivepercept.sim.road import forward_lane_d
from drivepercept.sim.world import generate_world

RNG_SEED = 1234


def _car(seed: int = RNG_SEED):  # type: ignore[no-untyped-def]
    return make_car(np.random.default_rng(seed))


def _views(world, t_s: float = 0.0, cameras=None) -> dict[str, RenderedView]:  # type: ignore[no-untyped-def]
    renderer = Renderer(world, cameras or rig(), noise=False)
    return {v.camera: v for v in renderer.render(t_s)}


def _box(view: RenderedView, track_id: int) -> GroundTruthBox | None:
    return next((b for b in view.boxes if b.track_id == track_id), None)


def test_object_ahead_is_seen_by_front_not_back() -> None:
    # given a car 20 m ahead and a pedestrian 15 m behind, in the ego lane
    world = straight_world(
        [
            Placed(Category.CAR, _car(), s_m=20.0),
            Placed(Category.PEDESTRIAN, make_pedestrian(np.random.default_rng(1)), s_m=-15.0),
        ]
    )
    # when the six-camera rig renders
    views = _views(world)
    # then the car is in front only and the pedestrian in back only
    assert _box(views["front"], 1) is not None
    assert _box(views["back"], 1) is None
    assert _box(views["back"], 2) is not None
    assert _box(views["front"], 2) is None
    car = _box(views["front"], 1)
    assert car is not None and car.category is Category.CAR
    # straight ahead: the box straddles the image centre column
    assert car.xyxy[0] < 320 < car.xyxy[2]
    assert car.visibility == pytest.approx(1.0)
    # distance from the camera (1.7 m ahead of the rear axle) to the car's centre
    assert 17.0 < car.distance_m < 19.5


def test_box_matches_projection_of_the_solid() -> None:
    # given a car 12 m ahead in the next lane to the left, fully in view
    solid = _car()
    world = straight_world([Placed(Category.CAR, solid, s_m=12.0, d_m=forward_lane_d(0))])
    cam = rig()[0]  # front
    box = _box(_views(world, cameras=[cam])["front"], 1)
    assert box is not None
    # when its labelled corners are projected with the camera's own matrices
    verts = solid.vertices_m[solid.labelled].reshape(-1, 3)
    pose = world.actor_states(0.0)
    verts_world = verts + np.array([pose.x_m[0], pose.y_m[0], 0.0])
    uv = cam.project(cam.world_to_camera(verts_world, world.ego_pose(0.0)))
    # then the rasterised box is their bounding rectangle, to a pixel
    expected = (uv[:, 0].min(), uv[:, 1].min(), uv[:, 0].max(), uv[:, 1].max())
    assert box.xyxy == pytest.approx(expected, abs=1.0)


def test_box_is_the_bounding_rectangle_of_the_objects_pixels() -> None:
    # given a scene with a truck and a car that partly hides it, rendered with and without the car
    truck = Placed(
        Category.TRUCK, make_truck(np.random.default_rng(5)), s_m=30.0, d_m=forward_lane_d(0)
    )
    car = Placed(Category.CAR, _car(), s_m=14.0, d_m=EGO_D)
    with_car = _views(straight_world([truck, car]))
    without_car = _views(straight_world([truck]))
    checked = 0
    for cam in ("front", "front_left"):
        box = _box(with_car[cam], 2)
        if box is None:
            continue
        checked += 1
        # when we find the pixels that change when the car is removed
        diff = np.any(with_car[cam].image != without_car[cam].image, axis=2)
        ys, xs = np.nonzero(diff)
        assert xs.size > 0
        drawn = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        # then the car's ground-truth box is their bounding rectangle within 1 px
        assert box.xyxy == pytest.approx(drawn, abs=1), cam
        # and the instance map holds exactly the car's visible pixels
        assert np.count_nonzero(with_car[cam].instance_map == 2) == box.visible_px
    assert checked >= 1


def test_occluded_object_loses_visibility_or_box() -> None:
    # given a car 25 m ahead, alone and then behind a truck 12 m ahead in the same lane
    far_car = Placed(Category.CAR, _car(), s_m=25.0)
    truck = Placed(Category.TRUCK, make_truck(np.random.default_rng(3)), s_m=12.0)
    alone = _box(_views(straight_world([far_car]))["front"], 1)
    hidden = _box(_views(straight_world([far_car, truck]))["front"], 1)
    # then alone it is fully visible and behind the truck it is hidden
    assert alone is not None and alone.visibility == pytest.approx(1.0)
    assert hidden is None or hidden.visibility < alone.visibility - 0.5

    # given a car partly covered by a pedestrian in front of it
    ped = Placed(
        Category.PEDESTRIAN, make_pedestrian(np.random.default_rng(2)), s_m=6.0, d_m=EGO_D + 0.4
    )
    part = _box(_views(straight_world([far_car, ped]))["front"], 1)
    # then the car keeps its box with less visibility than alone
    assert part is not None
    assert 0.05 < part.visibility < alone.visibility - 0.05


def test_truncated_object_is_clipped_to_the_image() -> None:
    # given a car beside the ego, half in the front-left camera's view
    world = straight_world([Placed(Category.CAR, _car(), s_m=3.0, d_m=forward_lane_d(0))])
    views = _views(world)
    boxes = {name: _box(v, 1) for name, v in views.items()}
    seen = {name: b for name, b in boxes.items() if b is not None}
    # then at least one camera sees it cut by the image border, with visibility below 1
    assert seen
    cut = [b for b in seen.values() if b.xyxy[0] == 0 or b.xyxy[2] == 640 or b.xyxy[3] == 360]
    assert cut
    assert all(b.visibility < 0.999 for b in cut)
    for b in seen.values():
        x0, y0, x1, y1 = b.xyxy
        assert 0 <= x0 < x1 <= 640 and 0 <= y0 < y1 <= 360


def test_object_behind_the_camera_plane_gets_no_box() -> None:
    # given a car that straddles the front camera's plane, beside the ego
    world = straight_world([Placed(Category.CAR, _car(), s_m=-30.0)])
    views = _views(world)
    assert _box(views["front"], 1) is None
    assert _box(views["front_left"], 1) is None
    assert _box(views["front_right"], 1) is None


def test_overtaking_car_keeps_its_track_id_from_back_to_front_cameras() -> None:
    # given a car in the left lane 25 m behind, 6 m/s faster than the ego
    world = straight_world(
        [Placed(Category.CAR, _car(), s_m=-25.0, d_m=forward_lane_d(0), speed_mps=16.0)],
        ego_speed_mps=10.0,
    )
    renderer = Renderer(world, rig(), noise=False)
    seen: list[set[str]] = []
    # when it overtakes over 10 s
    for k in range(0, 100, 5):
        views = renderer.render(k / 10.0)
        seen.append({v.camera for v in views if _box(v, 1) is not None})
    # then it is seen first from the back, then the left side, then the front, always as track 1
    first_back = next(i for i, s in enumerate(seen) if "back" in s)
    first_left = next(i for i, s in enumerate(seen) if s & {"back_left", "front_left"})
    first_front = next(i for i, s in enumerate(seen) if "front" in s)
    assert first_back <= first_left < first_front
    assert all(s for s in seen)


def test_track_ids_persist_across_frames_of_a_generated_world() -> None:
    world = generate_world(21, duration_s=3.0)
    renderer = Renderer(world, rig(2), noise=False)
    frames = [renderer.render(k / 15.0) for k in range(0, 30, 3)]
    category_of: dict[int, Category] = {}
    front_ids = []
    for views in frames:
        ids = set()
        for view in views:
            for box in view.boxes:
                assert category_of.setdefault(box.track_id, box.category) is box.category
                if view.camera == "front":
                    ids.add(box.track_id)
        front_ids.append(ids)
    # most objects seen in one front frame are seen again in the next (0.2 s later)
    for now, later in itertools.pairwise(front_ids):
        assert len(now & later) >= 0.6 * len(now)
    assert len(category_of) >= 5


def test_rendering_is_deterministic_and_seed_dependent() -> None:
    def boxes(seed: int) -> list[tuple[str, tuple[GroundTruthBox, ...]]]:
        world = generate_world(seed, duration_s=2.0)
        return [(v.camera, v.boxes) for v in Renderer(world, rig(3)).render(1.0, frame_index=15)]

    assert boxes(5) == boxes(5)
    assert boxes(5) != boxes(6)
    world = generate_world(5, duration_s=2.0)
    a = Renderer(world, rig(1), noise_seed=5).render(0.5, frame_index=7)[0].image
    b = Renderer(world, rig(1), noise_seed=5).render(0.5, frame_index=7)[0].image
    assert np.array_equal(a, b)


@pytest.mark.parametrize(("count", "size"), [(1, (320, 180)), (12, (64, 48)), (4, (1280, 720))])
def test_any_rig_size_and_resolution_renders(count: int, size: tuple[int, int]) -> None:
    world = generate_world(3, duration_s=1.0)
    views = Renderer(world, rig(count, *size)).render(0.3)
    assert len(views) == count
    for v in views:
        assert v.image.shape == (size[1], size[0], 3) and v.image.dtype == np.uint8
        for b in v.boxes:
            assert 0 <= b.xyxy[0] < b.xyxy[2] <= size[0]
            assert 0 <= b.xyxy[1] < b.xyxy[3] <= size[1]
            assert 0.0 < b.visibility <= 1.0


def test_generated_scene_shows_every_class_somewhere() -> None:
    world = generate_world(11, duration_s=6.0)
    renderer = Renderer(world, rig(), noise=False)
    cats = {
        b.category for k in range(0, 90, 15) for v in renderer.render(k / 15.0) for b in v.boxes
    }
    assert {Category.CAR, Category.PEDESTRIAN, Category.TRAFFIC_SIGN} <= cats
    assert len(cats) >= 5
    assert not math.isnan(world.ego_s(1.0))
