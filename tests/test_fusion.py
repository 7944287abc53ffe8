"""One object list for the rig (issue 29): tracks placed on the ground with the rig's
geometry and joined across cameras (`drivepercept.tracking.fusion`), and the ground
projection itself (`drivepercept.geometry.ground_points`)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest

from drivepercept.errors import ConfigError
from drivepercept.geometry import Extrinsics, Intrinsics, ground_points
from drivepercept.rig import CameraConfig, load_rig
from drivepercept.tracking.fusion import FusionParams, RigFusion
from drivepercept.tracking.places import Observation

RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"


def _cams() -> tuple[CameraConfig, ...]:
    return load_rig(RIG).cameras


def _pixel(cam: CameraConfig, x: float, y: float) -> tuple[float, float]:
    """Where the ground point (x, y) of the ego frame appears in `cam` (simulator maths)."""
    from drivepercept.sim.camera import CameraModel, Pose2D

    model = CameraModel.from_config(cam)
    uv = model.project(model.world_to_camera(np.array([[x, y, 0.0]]), Pose2D(0.0, 0.0, 0.0)))
    return float(uv[0, 0]), float(uv[0, 1])


def _box(cam: CameraConfig, x: float, y: float) -> tuple[float, float, float, float]:
    """A box standing on the ground at (x, y): its bottom centre is that point's pixel."""
    u, v = _pixel(cam, x, y)
    return (u - 20.0, v - 30.0, u + 20.0, v)


def test_ground_points_invert_the_simulators_projection() -> None:
    # given every sample-rig camera and a ground point 15 m out along its axis
    for cam in _cams():
        assert cam.intrinsics is not None and cam.extrinsics is not None
        yaw = math.radians(cam.extrinsics.yaw_deg)
        x = cam.extrinsics.position_m[0] + 15 * math.cos(yaw) + 1.0
        y = cam.extrinsics.position_m[1] + 15 * math.sin(yaw) - 0.5
        # when its pixel is placed back on the ground
        got = ground_points(np.array([_pixel(cam, x, y)]), cam.intrinsics, cam.extrinsics)
        # then it lands where it was, to the millimetre
        assert np.allclose(got[0], (x, y), atol=1e-3), (cam.name, got, x, y)


def test_a_pixel_at_or_above_the_horizon_or_too_far_is_not_placed() -> None:
    k = Intrinsics(fx=300.0, fy=300.0, cx=320.0, cy=180.0)
    level = Extrinsics(position_m=(0.0, 0.0, 1.5), yaw_deg=0.0, pitch_deg=0.0)
    got = ground_points(np.array([[320.0, 100.0], [320.0, 180.0], [320.0, 181.0]]), k, level)
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all()  # above, at the horizon
    assert np.isnan(got[2]).all()  # 450 m away: over max_range_m
    near = ground_points(np.array([[320.0, 240.0]]), k, level)
    assert np.allclose(near[0], (7.5, 0.0))  # 1.5 m * 300 px / 60 px ahead
    sky = Extrinsics(position_m=(0.0, 0.0, 1.5), yaw_deg=0.0, pitch_deg=-60.0)
    assert np.isnan(ground_points(np.array([[320.0, 300.0]]), k, sky)).all()


def test_two_cameras_seeing_one_object_give_it_one_id_held_over_time() -> None:
    cams = {c.name: c for c in _cams()}
    fusion = RigFusion(tuple(cams.values()))
    ids_seen = set()
    # given a car 12 m ahead-left, in both the front and front_left views, driving forward
    for k in range(10):
        x, y = 12.0 + 0.8 * k, 4.0
        obs = [
            Observation("front", 7, "car", _box(cams["front"], x, y), (x + 0.3, y - 0.2)),
            Observation("front_left", 3, "car", _box(cams["front_left"], x, y), (x - 0.4, y + 0.3)),
        ]
        links, objects = fusion.step(k / 10, obs)
        # then both sightings carry one global id, the same at every step
        assert links[("front", 7)] == links[("front_left", 3)]
        ids_seen.add(links[("front", 7)])
        assert len(objects) == 1 and len(objects[0].sightings) == 2
    assert len(ids_seen) == 1
    obj = objects[0]
    assert obj.x_m == pytest.approx(12.0 + 0.8 * 9, abs=0.5) and obj.y_m == pytest.approx(
        4.0, abs=0.5
    )
    assert obj.speed_mps == pytest.approx(8.0, rel=0.1)  # 0.8 m per 0.1 s


def test_an_object_handed_over_to_the_next_camera_keeps_its_id() -> None:
    cams = _cams()
    fusion = RigFusion(cams)
    # given a car passing on the left, seen by back_left until t=0.5 s, then by front_left
    # from t=0.7 s (no camera sees it in between), moving 10 m/s forward
    ids = []
    for k in range(12):
        t = k / 10
        if 5 < k < 7:
            fusion.step(t, [])
            continue
        camera, track = ("back_left", 4) if k <= 5 else ("front_left", 9)
        x, y = -2.0 + 10 * t, 3.5
        links, _ = fusion.step(t, [Observation(camera, track, "car", (0, 0, 1, 1), (x, y))])
        ids.append(links[(camera, track)])
    # then the track of the second camera took the object's id
    assert len(set(ids)) == 1


def test_two_objects_side_by_side_stay_apart() -> None:
    fusion = RigFusion(_cams())
    for k in range(5):
        obs = [
            Observation("front", 1, "car", (0, 0, 1, 1), (15.0, 2.0)),
            Observation("front", 2, "car", (0, 0, 1, 1), (15.0, -2.0)),
            Observation("front_right", 5, "car", (0, 0, 1, 1), (15.2, -2.1)),
            Observation("front", 3, "pedestrian", (0, 0, 1, 1), (15.1, -1.8)),
        ]
        links, objects = fusion.step(k / 10, obs)
    assert links[("front", 1)] != links[("front", 2)]
    assert links[("front_right", 5)] == links[("front", 2)]
    assert links[("front", 3)] not in (links[("front", 1)], links[("front", 2)])  # a person
    assert len(objects) == 3


def test_a_place_off_in_range_joins_its_own_object_not_a_neighbour_beside_it() -> None:
    """A place is sure across the line of sight (the box's column) and unsure along it (one
    pixel row of its bottom): a person at 30 m that `front` places 4 m too far joins the
    person `front_right` sees on its line of sight, not the neighbour 2 m nearer to that
    place but off to the side."""
    fusion = RigFusion(_cams())
    a, b = (30.0, -3.0), (33.0, -5.2)
    r = math.hypot(*a)
    a_far = (a[0] + 4.0 * a[0] / r, a[1] + 4.0 * a[1] / r)  # 4 m on along the line of sight
    assert math.dist(a_far, b) < math.dist(a_far, a) / 1.9  # nearer the neighbour, by far
    for k in range(5):
        links, _ = fusion.step(k / 10, [
            Observation("front_right", 5, "pedestrian", (0, 0, 1, 1), a),
            Observation("front_right", 6, "pedestrian", (0, 0, 1, 1), b),
            Observation("front", 1, "pedestrian", (0, 0, 1, 1), a_far),
        ])  # fmt: skip
        assert links[("front", 1)] == links[("front_right", 5)] != links[("front_right", 6)]


def test_sightings_frames_apart_in_one_step_are_one_object() -> None:
    """A batch can hold frames a few apart (each camera's decoder runs at its own pace): an
    oncoming car at 30 m/s seen by `front` now and by `front_left` three frames (0.2 s)
    earlier is 6 m apart in their frames; moved to one time by the object's speed, they
    are one object, at the step's time, with about the car's speed."""
    fusion = RigFusion(_cams())
    for k in range(15):
        t = k / 15
        obs = [
            Observation("front", 1, "car", (0, 0, 1, 1), (30.0 - 30.0 * t, 4.0), t_s=t),
            Observation("front_left", 2, "car", (0, 0, 1, 1), (36.0 - 30.0 * t, 4.0), t_s=t - 0.2),
        ]
        links, objects = fusion.step(t, obs)
    assert links[("front", 1)] == links[("front_left", 2)]
    (car,) = objects
    assert car.speed_mps is not None and abs(car.speed_mps - 30.0) < 4.5  # early places skew it
    assert abs(car.x_m - (30.0 - 30.0 * 14 / 15)) < 0.5  # its place at the step's time


def test_a_track_that_jumps_to_another_object_is_relinked() -> None:
    fusion = RigFusion(_cams())
    for k in range(3):
        fusion.step(k / 10, [
            Observation("front", 1, "car", (0, 0, 1, 1), (10.0, 0.0)),
            Observation("front_left", 8, "car", (0, 0, 1, 1), (10.2, 0.1)),
        ])  # fmt: skip
    links, _ = fusion.step(0.3, [
        Observation("front", 1, "car", (0, 0, 1, 1), (10.0, 0.0)),
        Observation("front_left", 8, "car", (0, 0, 1, 1), (30.0, 12.0)),  # now another car
    ])  # fmt: skip
    assert links[("front_left", 8)] != links[("front", 1)]


def test_a_rig_without_geometry_says_so_once_and_places_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bare = (CameraConfig(name="a"), CameraConfig(name="b"))
    with caplog.at_level(logging.WARNING):
        fusion = RigFusion(bare)
    assert not fusion.placing
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "tracking per camera only" in lines[0]
    got = fusion.ground.place("a", np.array([[0.0, 0.0, 10.0, 10.0]]), (640, 360))
    assert np.isnan(got).all()


def test_a_camera_pointing_at_the_sky_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    k = Intrinsics(fx=300.0, fy=300.0, cx=320.0, cy=180.0)
    sky = CameraConfig(
        name="up",
        intrinsics=k,
        extrinsics=Extrinsics(position_m=(0.0, 0.0, 1.5), yaw_deg=0.0, pitch_deg=-80.0),
        width=640,
        height=360,
    )
    fusion = RigFusion((sky,))
    with caplog.at_level(logging.WARNING):
        for _ in range(30):
            xy = fusion.ground.place("up", np.array([[300.0, 200.0, 340.0, 260.0]] * 3), (640, 360))
            assert np.isnan(xy).all()
    said = [r.getMessage() for r in caplog.records if "sky" in r.getMessage()]
    assert len(said) == 1 and "camera up" in said[0]


def test_frames_of_another_size_scale_the_intrinsics() -> None:
    cam = _cams()[0]
    fusion = RigFusion((cam,))
    u, v = _pixel(cam, 14.0, 1.0)
    full = fusion.ground.place(cam.name, np.array([[u - 5, v - 10, u + 5, v]]), (640, 360))
    half = fusion.ground.place(
        cam.name, np.array([[u / 2 - 2.5, v / 2 - 5, u / 2 + 2.5, v / 2]]), (320, 180)
    )
    assert np.allclose(full, (14.0, 1.0), atol=1e-3) and np.allclose(half, full, atol=1e-3)


def test_bad_fusion_params_are_named() -> None:
    with pytest.raises(ConfigError, match="gate_m must be > 0"):
        FusionParams(gate_m=0.0)
    with pytest.raises(ConfigError, match="gate_per_m must be >= 0"):
        FusionParams(gate_per_m=-1.0)


def test_two_ids_of_one_object_in_two_cameras_become_one_after_three_steps() -> None:
    # given a car first seen by front alone, then by front_left alone far from where front
    # placed it (its box was cut by the image's side), so that each got an id of its own
    fusion = RigFusion(_cams())
    a, _ = fusion.step(0.0, [Observation("front", 1, "car", (0, 0, 1, 1), (20.0, 8.0))])
    b, _ = fusion.step(0.1, [Observation("front_left", 4, "car", (0, 0, 1, 1), (20.0, 12.0))])
    assert a[("front", 1)] != b[("front_left", 4)]
    # when both then see it at one place, step after step
    both = [
        Observation("front", 1, "car", (0, 0, 1, 1), (20.0, 9.0)),
        Observation("front_left", 4, "car", (0, 0, 1, 1), (20.3, 9.2)),
    ]
    seen = [fusion.step(0.2 + k / 10, both)[0] for k in range(4)]
    # then for two steps they keep their ids, and from the third on share the older one
    assert seen[0][("front", 1)] != seen[0][("front_left", 4)]
    assert seen[1][("front", 1)] != seen[1][("front_left", 4)]
    assert seen[2][("front", 1)] == seen[2][("front_left", 4)] == a[("front", 1)]
    assert seen[3][("front_left", 4)] == a[("front", 1)]


def test_an_objects_speed_follows_its_latest_places_only() -> None:
    """The speed is a line through the last `SPEED_PLACES` places (running sums, the oldest
    taken out): noise-free places give the speed exactly, and after a change of speed, once
    the window holds only new places, the new one (a window that kept old places, or sums
    that failed to drop them, would blend the two)."""
    from drivepercept.tracking.places import SPEED_PLACES, SpeedFit

    fit = SpeedFit()
    fit.add(100.0, 5.0, 1.0)
    fit.add(100.05, 5.5, 1.0)
    assert fit.velocity is None  # two places, 0.05 s: too little to fit
    t, x, y = 100.05, 5.5, 1.0
    for _ in range(30):
        t, x, y = t + 0.1, x + 1.0, y - 0.2  # 10 m/s ahead, 2 m/s to the right
        fit.add(t, x, y)
    assert fit.velocity == pytest.approx((10.0, -2.0), abs=1e-6)
    for k in range(SPEED_PLACES):
        t, x, y = t + 0.1, x - 1.5, y  # now 15 m/s back
        fit.add(t, x, y)
        if k < SPEED_PLACES - 2:
            assert fit.velocity is not None and fit.velocity[0] > -15.0 + 1e-3  # still blended
    assert fit.velocity == pytest.approx((-15.0, 0.0), abs=1e-6)


def test_boxes_cut_by_the_images_side_with_a_width_per_box() -> None:
    from drivepercept.tracking.places import cut_by_side

    boxes = np.array([[0.0, 0, 50, 50], [100, 0, 639, 50], [100, 0, 639, 50], [3, 0, 9, 9]])
    got = cut_by_side(boxes, np.array([640.0, 640.0, 1280.0, 640.0]))
    assert got.tolist() == [True, True, False, False]


def test_two_people_joined_the_wrong_way_round_change_over() -> None:
    """Two pedestrians 1.2 m apart at 25 m, joined crosswise on the step each camera's second
    track appeared (each join was within the gate): step after step, each camera's track
    fits the other object better, and after `swap_steps` steps one camera's pair changes
    over (one only: both changing would undo it)."""
    fusion = RigFusion(_cams())

    def seen(front_left_first: bool) -> list[Observation]:
        obs = [Observation("front", 1, "pedestrian", (0, 0, 1, 1), (25.0, 0.6))]
        obs.append(Observation("front_right", 5, "pedestrian", (0, 0, 1, 1), (25.0, -0.6)))
        if not front_left_first:
            obs.append(Observation("front", 2, "pedestrian", (0, 0, 1, 1), (25.0, -0.6)))
            obs.append(Observation("front_right", 6, "pedestrian", (0, 0, 1, 1), (25.0, 0.6)))
        return obs

    links, _ = fusion.step(0.0, seen(True))
    assert links[("front", 1)] == links[("front_right", 5)]  # one person so far, joined
    links, _ = fusion.step(0.1, seen(False))
    assert links[("front", 2)] == links[("front_right", 6)]  # crosswise: each 1.2 m off
    steps = fusion.params.swap_steps
    for k in range(2, 2 + steps):
        links, _ = fusion.step(k / 10, seen(False))
        right = links[("front", 1)] == links[("front_right", 6)]
        assert right == (k >= steps)  # held for `steps` steps, the joining one counted
    assert links[("front", 2)] == links[("front_right", 5)]
    for k in range(2 + steps, 8 + steps):  # and it stays so
        links, _ = fusion.step(k / 10, seen(False))
    assert links[("front", 1)] == links[("front_right", 6)] != links[("front", 2)]


def test_fusion_settings_out_of_range_are_refused() -> None:
    bad_ones = ({"swap_gain": 1.5}, {"swap_steps": 0}, {"merge_steps": True}, {"gate_m": 0})
    for bad in (*bad_ones, {"lateral_m": 0.0}, {"lateral_per_m": -0.1}):
        with pytest.raises(ConfigError):
            FusionParams(**bad)


def test_the_elliptic_gate_is_long_along_the_line_of_sight_and_one_rule_for_one_or_many() -> None:
    from drivepercept.tracking.fusion import _apart, _apart_many

    params = FusionParams()
    sighting = (30.0, 0.0)  # straight ahead: along is x, across is y
    assert _apart(params, sighting, (36.0, 0.0)) < 1.0  # 6 m in range: inside (6.1 m gate)
    assert _apart(params, sighting, (30.0, 2.0)) > 1.0  # 2 m beside it: outside (1.6 m)
    rng = np.random.default_rng(0)
    for xy in [(0.0, 0.0), (12.0, -5.0), (-40.0, 20.0)]:
        places = rng.uniform(-50, 50, size=(20, 2))
        one = [_apart(params, xy, (float(p[0]), float(p[1]))) for p in places]
        assert np.allclose(_apart_many(params, xy, places), one)


def test_a_step_older_than_an_objects_last_place_does_not_move_it_back() -> None:
    # a frame answered late (`engine.overdue`) can make a rig step older than the one before
    cams = {c.name: c for c in _cams()}
    fusion = RigFusion(tuple(cams.values()))

    def seen(x: float, track: int = 7) -> list[Observation]:
        return [Observation("front", track, "car", _box(cams["front"], x, 4.0), (x, 4.0))]

    for k in range(6):
        _, (before,) = fusion.step(k / 10, seen(12.0 + 0.8 * k))
    # when a sighting from 0.1 s comes after the step at 0.5 s
    _, (late,) = fusion.step(0.1, seen(12.8))
    assert late.id == before.id
    # then the object is still last placed at 0.5 s: kept for `keep_s` (1.5 s) from then, so
    # a new track of it 1.45 s later, where its speed took it, joins it (from 0.1 s it would
    # have been dropped as unseen for 1.85 s)
    _, objects = fusion.step(1.95, seen(16.0 + 8.0 * 1.45, track=9))
    assert [o.id for o in objects] == [before.id]


def _look(*weights: float) -> np.ndarray:
    v = np.array(weights, np.float32)
    out: np.ndarray = v / np.linalg.norm(v)
    return out


RED, BLUE = _look(1, 0.1, 0), _look(0, 0.1, 1)


def test_a_far_pedestrian_placed_far_too_far_joins_by_looks() -> None:
    """Issue 44: a pedestrian at 40 m whose feet `front` does not see is placed 15 m farther
    along its line of sight than `front_left` places it; beyond the gate for places alone
    (7.3 m there), within three gates for a sighting that looks like the object. A person
    who looks different there is not joined."""
    near = (40.0 * math.cos(0.6), 40.0 * math.sin(0.6))
    far = (55.0 * math.cos(0.6), 55.0 * math.sin(0.6))

    def links(front_look: np.ndarray | None) -> tuple[int, int]:
        fusion = RigFusion(_cams())
        for k in range(5):
            got, _ = fusion.step(k / 10, [
                Observation("front_left", 1, "pedestrian", (0, 0, 1, 1), near, look=RED),
                Observation("front", 2, "pedestrian", (0, 0, 1, 1), far, look=front_look),
            ])  # fmt: skip
        return got[("front_left", 1)], got[("front", 2)]

    a, b = links(RED)
    assert a == b
    a, b = links(BLUE)
    assert a != b
    a, b = links(None)  # looks not known: places alone
    assert a != b


def test_a_sighting_that_looks_unlike_an_object_does_not_join_it() -> None:
    """Two cars 1 m apart along one line of sight, red and blue: by places alone front
    could join either; by looks each joins its own, step after step."""
    fusion = RigFusion(_cams())
    for k in range(5):
        got, _ = fusion.step(k / 10, [
            Observation("front_left", 1, "car", (0, 0, 1, 1), (20.0, 8.0), look=RED),
            Observation("front_right", 2, "car", (0, 0, 1, 1), (20.0, -8.0), look=BLUE),
            Observation("front", 3, "car", (0, 0, 1, 1), (20.3, -7.9), look=RED),
        ])  # fmt: skip
        assert got[("front", 3)] != got[("front_right", 2)]


def test_a_long_vehicle_seen_at_both_ends_is_one_object_when_it_looks_alike() -> None:
    """Issue 44: a bus alongside, the camera behind seeing its back end and the one ahead
    its front end: places 10 m apart across their lines of sight, far outside the gate for
    places (1.2 m across there). Alike, within a bus's length: one object, step after step;
    unlike, or cars (not that long), or buses farther apart than a bus: two."""

    def links(
        name: str, ahead_look: np.ndarray, ahead: tuple[float, float] = (13.0, 6.0)
    ) -> tuple[int, int]:
        fusion = RigFusion(_cams())
        for k in range(5):
            got, _ = fusion.step(k / 10, [
                Observation("back_left", 1, name, (0, 0, 1, 1), (3.0, 6.0), look=RED),
                Observation("front_left", 2, name, (0, 0, 1, 1), ahead, look=ahead_look),
            ])  # fmt: skip
        return got[("back_left", 1)], got[("front_left", 2)]

    a, b = links("bus", RED)
    assert a == b
    a, b = links("truck", RED, (11.0, 6.0))  # 8 m: within a truck's length (9 m)
    assert a == b
    for name, look, ahead in (
        ("bus", BLUE, (13.0, 6.0)),
        ("car", RED, (13.0, 6.0)),
        ("truck", RED, (13.0, 6.0)),
        ("bus", RED, (16.0, 6.0)),
    ):
        a, b = links(name, look, ahead)
        assert a != b, (name, ahead)


def test_a_long_vehicle_keeps_its_ends_when_a_nearer_object_comes() -> None:
    """The bus's place is the mean of its two ends, 5 m from each: each end's link holds
    while a car only `back` sees appears beside the back end (a link dropped there would
    be matched to the car, 0.5 m away, not to the bus)."""
    fusion = RigFusion(_cams())
    for k in range(6):
        obs = [
            Observation("back_left", 1, "bus", (0, 0, 1, 1), (3.0, 6.0), look=RED),
            Observation("front_left", 2, "bus", (0, 0, 1, 1), (13.0, 6.0), look=RED),
        ]
        if k >= 1:
            obs.append(Observation("back", 3, "car", (0, 0, 1, 1), (3.5, 6.5), look=RED))
        got, _ = fusion.step(k / 10, obs)
        assert got[("front_left", 2)] == got[("back_left", 1)]
        if k >= 1:
            assert got[("back", 3)] != got[("back_left", 1)]


def test_a_long_vehicles_two_ends_first_seen_apart_merge_when_alike_within_its_length() -> None:
    """The front end is first placed 17 m ahead of the back end (two objects); once within
    a bus's length of each other, alike, for `merge_steps` steps, they are one (the younger
    id joins the older). Unlike, they stay two."""

    def links(front_look: np.ndarray) -> list[tuple[int, int]]:
        fusion, out = RigFusion(_cams()), []
        for k in range(7):
            ahead = (20.0, 6.0) if k < 2 else (13.0, 6.0)
            got, _ = fusion.step(k / 10, [
                Observation("back_left", 1, "bus", (0, 0, 1, 1), (3.0, 6.0), look=RED),
                Observation("front_left", 2, "bus", (0, 0, 1, 1), ahead, look=front_look),
            ])  # fmt: skip
            out.append((got[("back_left", 1)], got[("front_left", 2)]))
        return out

    alike = links(RED)
    assert alike[0][0] != alike[0][1]  # 17 m apart: two
    assert alike[-1][0] == alike[-1][1] == alike[0][0]  # merged, the older id kept
    assert all(a != b for a, b in links(BLUE))


def test_look_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ConfigError, match="look_gate must be in"):
        FusionParams(look_gate=0.0)
    with pytest.raises(ConfigError, match="look_reach must be >= 1"):
        FusionParams(look_reach=0.5)


def test_the_looks_of_every_pair_at_once_are_each_pairs_own() -> None:
    """The merge takes every pair's look distance from one product (`_looks_apart`): the
    same as each pair's own (`_looks`), and 0 where either has no looks, whatever their
    float type."""
    rng = np.random.default_rng(5)
    rows = rng.random((4, 32)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    looks = [rows[0], None, rows[1], rows[2].astype(np.float64), None, rows[3]]
    apart = RigFusion._looks_apart(looks)
    for i, a in enumerate(looks):
        for j, b in enumerate(looks):
            assert apart[i][j] == pytest.approx(RigFusion._looks(a, b), abs=1e-6), (i, j)
            if a is None or b is None:
                assert apart[i][j] == 0.0
    assert apart[0][0] == pytest.approx(0.0, abs=1e-6) and apart[0][2] > 0.01
    assert RigFusion._looks_apart([None, None]) == [[0.0, 0.0], [0.0, 0.0]]
