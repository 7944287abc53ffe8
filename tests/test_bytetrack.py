"""Per-camera tracking (drivepercept.tracking.bytetrack, .kalman): ids that follow objects
through motion, misses, weak boxes, crossings and dropped frames; ids that false positives
and bad boxes never get; settings checked; and the sample rig's ground truth tracked."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from drivepercept.errors import ConfigError
from drivepercept.tracking.association import box_iou, match
from drivepercept.tracking.bytetrack import ByteTracker, TrackParams, TrackUpdate
from drivepercept.tracking.camera_tracker import CameraTracker
from drivepercept.tracking.kalman import CHI2_95_4DOF, BoxKalman, xyxy_to_xywh
from drivepercept.tracking.track_table import CameraBoxes, KindKeys

GROUND_TRUTH = Path(__file__).resolve().parents[1] / "sample_videos" / "ground_truth.json"
FPS = 30.0

Box = tuple[float, float, float, float]


def box(cx: float, cy: float, w: float = 40.0, h: float = 80.0) -> Box:
    return (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)


def step(
    tracker: CameraTracker,
    t_s: float,
    boxes: list[Box],
    scores: list[float] | None = None,
    labels: list[int] | None = None,
) -> TrackUpdate:
    """One frame of `boxes` (score 0.9, label 0 unless given) at `t_s`."""
    n = len(boxes)
    return tracker.update(
        np.array(boxes, np.float64).reshape(n, 4),
        np.array(scores if scores is not None else [0.9] * n, np.float64),
        np.array(labels if labels is not None else [0] * n, np.int64),
        t_s,
    )


def ids_of(update: TrackUpdate) -> list[int]:
    return [int(i) for i in update.track_ids]


# -- following objects ---------------------------------------------------------------------


def test_two_objects_moving_in_straight_lines_keep_their_ids() -> None:
    # given two walkers, one going right at 60 px/s, one going up at 45 px/s
    tracker = CameraTracker()
    seen = []
    # when 30 frames go through the tracker
    for k in range(30):
        t = k / FPS
        seen.append(ids_of(step(tracker, t, [box(100 + 60 * t, 200), box(400, 300 - 45 * t)])))
    # then both are confirmed from the first frame on and keep their ids to the end
    assert seen[0] == [1, 2]
    assert all(frame == [1, 2] for frame in seen)
    assert [track.track_id for track in tracker.tracks()] == [1, 2]
    assert all(track.hits == 30 and not track.lost for track in tracker.tracks())


@pytest.mark.parametrize(("gap_s", "same_id"), [(0.5, True), (2.0, False)])
def test_an_object_that_goes_missing_keeps_its_id_only_within_lost_s(
    gap_s: float, same_id: bool
) -> None:
    # given an object moving right at 90 px/s, tracked for 10 frames
    tracker = CameraTracker(TrackParams(lost_s=1.0))
    for k in range(10):
        assert ids_of(step(tracker, k / FPS, [box(100 + 90 * k / FPS, 200)])) == [1]
    # when it is hidden for gap_s (empty frames) and comes back where its motion took it
    k = 10
    while k / FPS < 9 / FPS + gap_s:
        step(tracker, k / FPS, [])
        k += 1
    back = [ids_of(step(tracker, j / FPS, [box(100 + 90 * j / FPS, 200)])) for j in (k, k + 1)]
    # then within lost_s it is the same track; after it, a new one (confirmed on its 2nd box)
    if same_id:
        assert back == [[1], [1]]
        assert tracker.ended_count == 0
    else:
        assert back == [[-1], [2]]
        assert tracker.ended_count == 1
        assert len(tracker.lifetimes_s()) == 2


@pytest.mark.parametrize("recover_buffer", [1.0, 0.0])
def test_a_lost_object_that_stopped_while_hidden_is_found_again(recover_buffer: float) -> None:
    # given a 40 px wide object moving right at 100 px/s, tracked for 10 frames at 15 fps
    tracker = CameraTracker(TrackParams(recover_buffer=recover_buffer))
    fps = 15.0
    for k in range(10):
        assert ids_of(step(tracker, k / fps, [box(100 + 100 * k / fps, 200)])) == [1]
    # when it is hidden for 8 frames (0.53 s) and has stopped meanwhile: its filter coasts
    # 53 px on, past its width (IoU 0 with where it is)
    stopped = 100 + 100 * 9 / fps
    for k in range(10, 18):
        step(tracker, k / fps, [])
    back = [ids_of(step(tracker, k / fps, [box(stopped, 200)])) for k in (18, 19, 20)]
    # then recovery on widened boxes finds it again; without it, a new track starts
    if recover_buffer:
        assert back == [[1], [1], [1]]
    else:
        assert back == [[-1], [2], [2]]


def test_recovery_does_not_take_a_box_of_another_size_or_class() -> None:
    tracker = CameraTracker()
    fps = 15.0
    for k in range(10):
        step(tracker, k / fps, [box(100 + 100 * k / fps, 200)])
    for k in range(10, 14):
        step(tracker, k / fps, [])
    near = 100 + 100 * 13 / fps + 30  # where recovery would look, but three times as large
    assert ids_of(step(tracker, 14 / fps, [box(near, 200, 120, 240)])) == [-1]
    assert ids_of(step(tracker, 15 / fps, [box(near, 200, 120, 240)])) == [2]
    other = CameraTracker()
    for k in range(10):
        step(other, k / fps, [box(100 + 100 * k / fps, 200)])
    for k in range(10, 14):
        step(other, k / fps, [])
    assert ids_of(step(other, 14 / fps, [box(near, 200)], labels=[1])) == [-1]


def test_low_score_boxes_continue_a_track_but_never_start_one() -> None:
    # given a tracked object, and params where low-score boxes are 0.3 <= score < 0.5
    tracker = CameraTracker(TrackParams(low_score=0.3))
    for k in range(5):
        step(tracker, k / FPS, [box(100 + 2 * k, 200)])
    # when its boxes turn weak (an occlusion), and a second, weak-only object shows up
    weak = [
        step(tracker, k / FPS, [box(100 + 2 * k, 200), box(400, 200)], scores=[0.4, 0.45])
        for k in range(5, 15)
    ]
    # then the first keeps its id through the weak boxes; the weak-only one never gets an id
    assert all(ids_of(u) == [1, -1] for u in weak)
    assert [t.track_id for t in tracker.tracks()] == [1]
    # and a box below low_score continues nothing: the track is lost
    below = step(tracker, 15 / FPS, [box(130, 200)], scores=[0.2])
    assert ids_of(below) == [-1]
    assert tracker.tracks()[0].lost


def test_crossing_objects_of_different_classes_do_not_swap_ids() -> None:
    # given a car (label 0) going right and a pedestrian (label 3) going left on one line,
    # with the same box size: their boxes overlap fully when they cross
    tracker = CameraTracker(TrackParams(class_aware=True))
    label_ids: dict[int, set[int]] = {0: set(), 3: set()}
    # when they cross over 40 frames
    for k in range(40):
        t = k / FPS
        update = step(tracker, t, [box(100 + 300 * t, 200), box(500 - 300 * t, 200)], labels=[0, 3])
        label_ids[0].add(int(update.track_ids[0]))
        label_ids[3].add(int(update.track_ids[1]))
    # then each keeps one id, its own
    assert label_ids == {0: {1}, 3: {2}}


@pytest.mark.parametrize("kinds", [True, False])
def test_a_pedestrian_boxed_as_a_cyclist_for_a_while_keeps_its_id_given_kinds(
    kinds: bool,
) -> None:
    # given a pedestrian (label 3) walking right; from frame 5 the detector boxes it as a
    # cyclist (label 4) at 0.8 beside a weak pedestrian box (0.2), and from frame 10 as a
    # cyclist alone; pedestrian and cyclist are one kind when the tracker is told kinds
    tracker = CameraTracker(TrackParams(class_aware=True))
    ids = []
    for k in range(16):
        t = k / FPS
        here = box(100 + 60 * t, 200)
        boxes, scores, labels = [here], [0.9], [3]
        if 5 <= k < 10:
            boxes, scores, labels = [here, here], [0.8, 0.2], [4, 3]
        elif k >= 10:
            labels, scores = [4], [0.8]
        n = len(boxes)
        update = tracker.update(
            np.array(boxes, np.float64).reshape(n, 4),
            np.array(scores),
            np.array(labels, np.int64),
            t,
            kinds=np.zeros(n, np.int64) if kinds else None,
        )
        ids.append(int(update.track_ids[0]))
    # then with kinds it keeps id 1 on the sure box throughout; without, its track holds
    # the weak pedestrian box, is lost when that goes, and the cyclist box starts id 2
    if kinds:
        assert ids == [1] * 16
    else:
        assert ids[:5] == [1] * 5 and ids[5:10] == [-1] * 5 and ids[10:] == [-1] + [2] * 5


def test_a_lost_track_of_another_kind_does_not_hold_back_a_new_one_in_its_place() -> None:
    # given a pedestrian (label 3) standing, then gone, and a car's box (label 0, another
    # kind) at once in the same place (the pedestrian's lost track coasts there)
    tracker = CameraTracker(TrackParams(class_aware=True))
    for k in range(5):
        step(tracker, k / FPS, [box(100, 200)], labels=[3])
    got = [ids_of(step(tracker, k / FPS, [box(100, 200)], labels=[0])) for k in range(5, 9)]
    # then the car gets its own id on its second box, and keeps it (the tracked and the
    # lost track that cover one place are not taken for one object's two tracks)
    assert got == [[-1], [2], [2], [2]]


def test_a_box_of_another_label_of_the_kind_needs_more_overlap() -> None:
    # given a pedestrian track, then a cyclist box of its kind overlapping its prediction
    # by about 0.3: enough for its own label (match_iou 0.2), not for a change of class
    # (class_change_cost 0.2: 0.4)
    def run(label: int) -> int:
        tracker = CameraTracker(TrackParams(class_aware=True))
        one_kind = np.zeros(1, np.int64)  # (pedestrian and cyclist)
        for k in range(6):
            update = tracker.update(
                np.array([box(100 + (22 if k == 5 else 0), 200)]),  # last: IoU 18 / 62 = 0.29
                np.array([0.9]),
                np.array([3 if k < 5 else label]),
                k / FPS,
                kinds=one_kind,
            )
        return int(update.track_ids[0])

    # then its own label's box joins the track, the other label's does not
    assert run(3) == 1
    assert run(4) == -1


def test_velocity_of_a_box_moving_at_30_px_per_s_is_measured_in_xyxy() -> None:
    # given a box moving +30 px/s in x
    tracker = CameraTracker()
    update = step(tracker, 0.0, [box(100, 200)])
    # then a first box says nothing of motion yet
    assert np.isnan(update.velocities).all()
    # when it has been followed for 15 frames (half a second)
    for k in range(1, 16):
        update = step(tracker, k / FPS, [box(100 + 30 * k / FPS, 200)])
    # then its velocity is ~(30, 0, 30, 0) px/s, and the track reports the same
    np.testing.assert_allclose(update.velocities[0], [30, 0, 30, 0], atol=2.0)
    np.testing.assert_allclose(tracker.tracks()[0].velocity, update.velocities[0])


def test_dropped_frames_with_uneven_times_still_track() -> None:
    # given an object moving at 120 px/s, seen at uneven times (a live camera dropping
    # between zero and three frames at a time)
    rng = np.random.default_rng(7)
    gaps = rng.choice([1, 2, 3, 4], size=40) / FPS
    tracker = CameraTracker()
    t, ids = 0.0, []
    # when its boxes go through at those times
    for gap in gaps:
        t += gap
        update = step(tracker, t, [box(50 + 120 * t, 200)])
        ids.append(int(update.track_ids[0]))
    # then it keeps one id, and its speed is measured per second, not per frame
    assert set(ids) == {1}
    np.testing.assert_allclose(update.velocities[0], [120, 0, 120, 0], atol=5.0)


def test_an_object_crossing_a_side_camera_faster_than_its_width_per_frame_is_tracked() -> None:
    # given a pedestrian 22 px wide crossing a side camera at 375 px/s, seen at 15 frames/s
    # (25 px a frame: its consecutive boxes do not overlap at all)
    def crossing(tracker: CameraTracker) -> list[int]:
        step(tracker, 0.0, [])  # the tracker's first frame is past
        return [
            int(step(tracker, k / 15, [box(600 - 25 * k, 200, w=22, h=60)]).track_ids[0])
            for k in range(1, 13)
        ]

    # when it goes through the tracker with its defaults
    ids = crossing(CameraTracker())
    # then its second box confirms it (the buffered match of a new track, the wide velocity
    # prior), and the motion model keeps it from there on
    assert ids == [-1] + [1] * 11
    # where ByteTrack's plain IoU and narrow prior never get past its first box
    plain = CameraTracker(
        TrackParams(unconfirmed_buffer=0.0), kalman=BoxKalman(std_initial_velocity=10 / 160)
    )
    assert crossing(plain) == [-1] * 12


def test_a_one_frame_false_positive_never_gets_a_confirmed_id() -> None:
    # given a tracked object
    tracker = CameraTracker(TrackParams(min_hits=2))
    step(tracker, 0.0, [box(100, 200)])
    # when a confident box appears for one frame only
    flash = step(tracker, 1 / FPS, [box(100, 200), box(400, 100)], scores=[0.9, 0.95])
    after = [step(tracker, k / FPS, [box(100, 200)]) for k in range(2, 10)]
    # then it gets no id, now or later, and no track or lifetime is counted for it
    assert ids_of(flash) == [1, -1]
    assert all(ids_of(u) == [1] for u in after)
    assert [t.track_id for t in tracker.tracks()] == [1]
    assert len(tracker.lifetimes_s()) == 1
    assert tracker.died_young == 1  # counted as a track that died unconfirmed
    # but a box seen twice is confirmed on its second hit
    step(tracker, 10 / FPS, [box(100, 200), box(400, 100)])
    assert ids_of(step(tracker, 11 / FPS, [box(100, 200), box(400, 100)])) == [1, 2]


@pytest.mark.parametrize("sure_score", [0.7, 0.0])
def test_a_box_the_detector_is_unsure_of_needs_one_more_hit_for_its_id(
    sure_score: float,
) -> None:
    # given two new objects in a camera already tracking (not its first frame), one boxed
    # at 0.95, one at 0.65 (both above new_track_score, 0.6)
    tracker = CameraTracker(TrackParams(min_hits=2, sure_score=sure_score))
    step(tracker, 0.0, [box(100, 200)])
    scores = [0.9, 0.95, 0.65]
    frames = [box(100, 200), box(400, 100), box(250, 300)]
    got = [ids_of(step(tracker, k / FPS, frames, scores=scores)) for k in range(1, 4)]
    # then the sure one gets its id on its second box; the unsure one on its third, unless
    # sure_score is 0 (every track on its second box)
    assert got[0] == [1, -1, -1]
    if sure_score:
        assert got[1] == [1, 2, -1] and got[2] == [1, 2, 3]
    else:
        assert got[1] == [1, 2, 3] and got[2] == [1, 2, 3]
    # and with min_hits 1, the unsure one still waits for a second box
    once = CameraTracker(TrackParams(min_hits=1, sure_score=0.7))
    step(once, 0.0, [box(100, 200)])
    first, second = (ids_of(step(once, k / FPS, frames, scores=scores)) for k in (1, 2))
    assert first == [1, 2, -1] and second == [1, 2, 3]


# -- bad input -----------------------------------------------------------------------------


def test_boxes_with_nan_inf_or_no_area_are_ignored_and_others_tracked() -> None:
    # given a frame with a good box, a NaN box, an infinite box, a zero-area box, a NaN score
    tracker = CameraTracker()
    nan, inf = math.nan, math.inf
    boxes = [box(100, 200), (nan, 1, 2, 3), (0, 0, inf, 10), (50, 50, 50, 90), box(300, 200)]
    scores = [0.9, 0.9, 0.9, 0.9, nan]
    # when it goes through, twice
    for t in (0.0, 0.1):
        update = step(tracker, t, boxes, scores=scores)
        # then only the good box has an id; the others have -1 and NaN velocity
        assert ids_of(update) == [1, -1, -1, -1, -1]
        assert np.isnan(update.velocities[1:]).all()
    assert len(tracker.tracks()) == 1


def test_kinds_must_be_integers_one_per_box_and_names_of_a_group_share_a_key() -> None:
    # given a tracker, and boxes whose kinds are the wrong length or not integers
    tracker = CameraTracker()
    args = (np.array([box(100, 200)]), np.array([0.9]), np.array([3]), 0.0)
    # then they are refused
    with pytest.raises(ValueError, match=r"kinds must be 1 integers"):
        tracker.update(*args, kinds=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"kinds must be 1 integers"):
        tracker.update(*args, kinds=np.array([0.5]))
    # and the stage's keys: pedestrian and cyclist one, car another, the same each call
    keys = KindKeys(TrackParams())
    first = keys(["cyclist", "car", "pedestrian"]).tolist()
    assert first[0] == first[2] != first[1]
    assert keys(["pedestrian", "car"]).tolist() == [first[2], first[1]]
    assert keys([]).shape == (0,)


def test_empty_frames_work_and_time_must_move_forward() -> None:
    # given a tracker
    tracker = CameraTracker()
    # when a frame has no boxes (as arrays of shape (0,) for the boxes too)
    update = tracker.update(np.zeros(0), np.zeros(0), np.zeros(0, np.int64), 0.0)
    # then the answer is empty, of the right shapes
    assert update.track_ids.shape == (0,)
    assert update.velocities.shape == (0, 4)
    step(tracker, 0.5, [box(100, 100)])
    # and a repeated or earlier time, or mismatched arrays, is an error
    for t in (0.5, 0.2, math.nan):
        with pytest.raises(ValueError, match="t_s"):
            step(tracker, t, [])
    with pytest.raises(
        ValueError, match=r"must have shapes \(N, 4\), \(N,\) and \(N,\), got \(2, 4\), \(3,\)"
    ):
        tracker.update(np.zeros((2, 4)), np.zeros(3), np.zeros(2, np.int64), 1.0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"high_score": 1.5}, r"high_score must be in \[0, 1\], got 1.5"),
        ({"low_score": 0.7}, r"low_score must be in \[0, high_score=0.5\], got 0.7"),
        ({"new_track_score": 0.4}, r"new_track_score must be in \[high_score=0.5, 1\], got 0.4"),
        ({"match_iou": 0.0}, r"match_iou must be in \(0, 1\], got 0.0"),
        (
            {"second_match_iou": math.nan},
            r"second_match_iou must be a finite number in \(0, 1\], got nan",
        ),
        ({"lost_s": -1.0}, r"lost_s must be >= 0 seconds, got -1.0"),
        ({"lost_s": math.inf}, r"lost_s must be a finite number >= 0 seconds, got inf"),
        ({"unconfirmed_buffer": -0.5}, r"unconfirmed_buffer must be in \[0, 10\], got -0.5"),
        ({"min_hits": 0}, r"min_hits must be an integer >= 1, got 0"),
        ({"sure_score": 1.2}, r"sure_score must be in \[0, 1\], got 1.2"),
        ({"min_hits": 1.5}, r"min_hits must be an integer >= 1, got 1.5"),
        ({"class_aware": "yes"}, r"class_aware must be true or false, got 'yes'"),
        ({"class_change_cost": 1.5}, r"class_change_cost must be in \[0, 1\], got 1.5"),
        ({"same_kind": ["car"]}, r"same_kind must be a tuple of tuples of class names"),
        ({"same_kind": (("car", "bus"), ("bus",))}, r"same_kind: a class name in two groups"),
        ({"high_score": True}, r"high_score must be a number in \[0, 1\], got True"),
    ],
)
def test_bad_params_raise_config_error_naming_expected_and_actual(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        TrackParams(**changes)  # type: ignore[arg-type]


# -- ids -----------------------------------------------------------------------------------


def test_ids_are_never_reused_and_count_up_from_one() -> None:
    # given an object that comes and goes three times, each gap longer than lost_s, and a
    # second one that appears once for good
    tracker = CameraTracker(TrackParams(lost_s=0.3))
    given: list[int] = []
    t = 0.0
    for visit in range(3):
        for _ in range(5):
            t += 1 / FPS
            boxes = [box(100, 200)] + ([box(400, 200)] if visit == 2 else [])
            given += [i for i in ids_of(step(tracker, t, boxes)) if i > 0]
        t += 0.5
        step(tracker, t, [])  # the gap: the track ends
    # then every stay had a fresh id, in order: 1, 2, then 3 and 4 together
    assert sorted(set(given)) == [1, 2, 3, 4]
    first_use = list(dict.fromkeys(given))
    assert first_use == sorted(first_use)
    assert tracker.ended_count == 4
    assert len(tracker.lifetimes_s()) == 4
    # each lasted from its first to its fifth box
    assert tracker.lifetimes_s() == pytest.approx([4 / FPS] * 4)


# -- the parts -----------------------------------------------------------------------------


def test_box_iou_and_match_take_the_best_pairs_only_when_worth_it() -> None:
    # given two tracks and two boxes: track 0 fits box 0 well and box 1 a little;
    # track 1 fits box 0 just above the threshold
    iou = np.array([[0.9, 0.25], [0.22, 0.0]])
    # when matched at IoU >= 0.2
    rows, cols = match(iou, 0.2)
    # then the good pair is kept, not the two poor ones that would match more pairs
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == [(0, 0)]
    a = np.array([[0, 0, 10, 10], [0, 0, 0, 10]], np.float64)
    b = np.array([[5, 0, 15, 10]], np.float64)
    np.testing.assert_allclose(box_iou(a, b), [[50 / 150], [0.0]])


def test_kalman_steps_by_time_and_gates_far_boxes() -> None:
    # given a filter with a box seen twice, 0.1 s apart, 3 px to the right
    kf = BoxKalman()
    first: npt.NDArray[np.float64] = xyxy_to_xywh(np.array([box(100, 200)]))
    mean, cov = kf.initiate(first)
    mean, cov = kf.predict(mean, cov, 0.1)
    mean, cov = kf.update(mean, cov, xyxy_to_xywh(np.array([box(103, 200)])))
    # then it moves right, and one step of dt equals two of dt/2 (in the mean)
    assert mean[0, 4] > 0
    once, _ = kf.predict(mean, cov, 0.2)
    twice, _ = kf.predict(*kf.predict(mean, cov, 0.1), 0.1)
    np.testing.assert_allclose(once, twice)
    # and a longer step is more uncertain
    assert kf.predict(mean, cov, 0.5)[1][0, 0, 0] > kf.predict(mean, cov, 0.1)[1][0, 0, 0]
    # and the gate passes a box near the prediction, not one far away
    near, far = box(once[0, 0], once[0, 1]), box(once[0, 0] + 200, once[0, 1])
    gate = kf.gating_distance(
        once, kf.predict(mean, cov, 0.2)[1], xyxy_to_xywh(np.array([near, far]))
    )
    assert gate.shape == (1, 2)
    assert gate[0, 0] < CHI2_95_4DOF < gate[0, 1]


def test_kalman_velocity_keeps_up_with_an_object_that_speeds_up_across_the_image() -> None:
    # given a car seen from a moving vehicle at 15 frames/s: as it comes closer it speeds
    # up across the picture (x = 100 + 200 t + 300 t^2 px, so 800 px/s after one second)
    kf, dt = BoxKalman(), 1 / 15

    def seen(t: float) -> npt.NDArray[np.float64]:
        return np.array([[100 + 200 * t + 300 * t * t, 200.0, 60.0, 40.0]])

    mean, cov = kf.initiate(seen(0.0))
    for k in range(1, 16):
        mean, cov = kf.predict(mean, cov, dt)
        mean, cov = kf.update(mean, cov, seen(k * dt))
    # then after a second its velocity is within 10 % of the true one (ByteTrack's
    # velocity noise, 1/160, was 21 % behind), and a frame ahead it is off by under 8 px
    # (the streaming forecast and a predicted frame's box; 16 px with 1/160)
    assert mean[0, 4] == pytest.approx(800.0, rel=0.10)
    ahead, _ = kf.predict(mean, cov, dt)
    assert abs(ahead[0, 0] - seen(16 * dt)[0, 0]) < 8.0


# -- the sample rig's ground truth ---------------------------------------------------------


def test_sample_rig_ground_truth_is_tracked_with_few_id_switches() -> None:
    # given the front camera's ground-truth boxes of the sample rig (15 frames/s), those a
    # detector could find (>= 100 px^2), scored 0.9, 5 % dropped at random
    truth = json.loads(GROUND_TRUTH.read_text())
    fps = float(truth["info"]["fps"])
    frames: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ann in truth["annotations"]:
        if ann["camera"] == "front" and ann["area"] >= 100:
            frames[ann["frame_index"]].append(ann)
    rng = np.random.default_rng(0)
    tracker = CameraTracker()
    assigned: dict[int, int] = {}  # ground-truth track -> tracker id of its latest match
    seen: set[int] = set()  # ground-truth tracks fed so far
    switches = matched = later = later_with_id = 0
    # when they go through the tracker frame by frame
    for index in range(int(truth["info"]["frames"])):
        kept = [a for a in frames[index] if rng.random() >= 0.05]
        update = tracker.update(
            np.array([a["bbox_xyxy"] for a in kept], np.float64).reshape(-1, 4),
            np.full(len(kept), 0.9),
            np.array([a["category_id"] for a in kept], np.int64),
            index / fps,
        )
        for ann, tid in zip(kept, update.track_ids.tolist(), strict=True):
            truth_id = int(ann["track_id"])
            if truth_id in seen:
                later += 1
                later_with_id += tid > 0
            seen.add(truth_id)
            if tid > 0:
                matched += 1
                switches += assigned.get(truth_id, tid) != tid
                assigned[truth_id] = tid
    # then (past each object's first box, which a new track needs a second of) >= 95 % of
    # boxes have an id, and fewer than 2 % of matched boxes switched ids
    assert matched > 500
    assert later_with_id / later >= 0.95
    assert switches / matched < 0.02


# -- many cameras at once ------------------------------------------------------------------


def _truth_frames(drop: float, seed: int) -> dict[str, list[list[dict[str, Any]]]]:
    """Per camera, per frame: the sample rig's ground-truth boxes (>= 100 px^2), with a share
    `drop` of them left out at random."""
    truth = json.loads(GROUND_TRUTH.read_text())
    frames: dict[str, list[list[dict[str, Any]]]] = defaultdict(
        lambda: [[] for _ in range(int(truth["info"]["frames"]))]
    )
    rng = np.random.default_rng(seed)
    for ann in truth["annotations"]:
        if ann["area"] >= 100 and rng.random() >= drop:
            frames[ann["camera"]][ann["frame_index"]].append(ann)
    return dict(frames)


def _boxes(key: int, anns: list[dict[str, Any]], t_s: float) -> CameraBoxes:
    rng = np.random.default_rng(len(anns))
    return CameraBoxes(
        key,
        np.array([a["bbox_xyxy"] for a in anns], np.float64).reshape(-1, 4),
        rng.uniform(0.2, 0.95, len(anns)),  # high, low and ignored scores
        np.array([a["category_id"] for a in anns], np.int64),
        t_s,
    )


def test_a_batch_of_cameras_gets_what_one_tracker_per_camera_gets() -> None:
    # given the six cameras of the sample rig, some of each frame's boxes dropped, and every
    # camera's frames skipped in turn now and then (a batch without that camera)
    frames = _truth_frames(0.1, seed=1)
    cameras = sorted(frames)
    alone = {name: CameraTracker() for name in cameras}
    together = ByteTracker()
    # when each batch goes through one ByteTracker, and each frame through its own camera's
    for index in range(len(frames[cameras[0]])):
        batch = [
            _boxes(k, frames[name][index], index / 15)
            for k, name in enumerate(cameras)
            if (index + k) % 7 != 0
        ]
        updates = together.update(batch)
        # then every box gets the same id and velocity
        for frame, update in zip(batch, updates, strict=True):
            expected = alone[cameras[frame.camera]].update(
                frame.xyxy, frame.scores, frame.labels, frame.t_s
            )
            np.testing.assert_array_equal(update.track_ids, expected.track_ids)
            np.testing.assert_allclose(update.velocities, expected.velocities, atol=1e-9)
    # and each camera has its own tracks, ids from 1, and lifetimes
    for k, name in enumerate(cameras):
        assert together.tracks(k) == alone[name].tracks()
        assert together.lifetimes_s(k) == alone[name].lifetimes_s()
        assert together.ended_count(k) == alone[name].ended_count
    assert sum(len(together.lifetimes_s(k)) for k in range(len(cameras))) > 30


def test_a_camera_absent_from_a_batch_keeps_its_tracks_as_they_were() -> None:
    # given two cameras, each with an object tracked for 10 frames
    tracker = ByteTracker(TrackParams(lost_s=0.2))
    for k in range(10):
        tracker.update(
            [
                CameraBoxes(
                    0, np.array([box(100 + 3 * k, 200)]), np.array([0.9]), np.array([0]), k / FPS
                ),
                CameraBoxes(1, np.array([box(300, 200)]), np.array([0.9]), np.array([0]), k / FPS),
            ]
        )
    # when camera 1 is left out of batches for longer than lost_s
    for k in range(10, 30):
        tracker.update(
            [
                CameraBoxes(
                    0, np.array([box(100 + 3 * k, 200)]), np.array([0.9]), np.array([0]), k / FPS
                )
            ]
        )
    # then its track was neither lost nor moved, and its next box keeps the id
    (before,) = tracker.tracks(1)
    assert not before.lost and before.last_seen_s == pytest.approx(9 / FPS)
    (update,) = tracker.update(
        [CameraBoxes(1, np.array([box(300, 200)]), np.array([0.9]), np.array([0]), 30 / FPS)]
    )
    assert update.track_ids.tolist() == [1]
    # and two frames of one camera in one update are refused
    with pytest.raises(ValueError, match="one frame per camera"):
        frame = CameraBoxes(0, np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), 2.0)
        tracker.update([frame, frame])


def test_kalman_steps_each_track_by_its_own_time() -> None:
    # given three tracks
    kf = BoxKalman()
    mean, cov = kf.initiate(xyxy_to_xywh(np.array([box(100, 200), box(50, 60), box(300, 90)])))
    mean, cov = kf.update(*kf.predict(mean, cov, 0.1), mean[:, :4] + 2.0)
    # when stepped by one time each, then each is what a step of its own time alone gives
    dts = np.array([0.0, 0.05, 0.4])
    both = kf.predict(mean, cov, dts)
    for k, dt in enumerate(dts.tolist()):
        one = kf.predict(mean[k : k + 1], cov[k : k + 1], dt)
        np.testing.assert_allclose(both[0][k], one[0][0])
        np.testing.assert_allclose(both[1][k], one[1][0])
    # and the block form equals the motion matrix's product
    motion = np.eye(8)
    motion[:4, 4:] = 0.4 * np.eye(4)
    expected = motion @ cov[2] @ motion.T
    grown = both[1][2] - expected
    assert np.allclose(grown - np.diag(np.diag(grown)), 0.0)
    assert (np.diag(grown) > 0).all()  # the process noise, on the diagonal only


# -- frames that were not detected ---------------------------------------------------------


def test_predict_moves_tracked_boxes_to_the_frames_time_and_changes_nothing() -> None:
    # given one car going right at 60 px/s, tracked for 10 frames at 30 fps
    core = ByteTracker()
    for k in range(10):
        t = k / FPS
        frame = CameraBoxes(
            0, np.array([box(100 + 60 * t, 200)]), np.array([0.8]), np.array([2]), t
        )
        core.update([frame])
    last_t = 9 / FPS
    # when the tracker is asked for a frame 0.5 s later that was not detected
    guess = core.predict(0, last_t + 0.5)
    # then it gives the track's box moved on by its speed (60 px/s * 0.5 s = 30 px), with its
    # id, class, latest score and velocity
    assert guess.track_ids.tolist() == [1] and guess.labels.tolist() == [2]
    assert guess.scores.tolist() == pytest.approx([0.8])
    expected = np.array(box(100 + 60 * (last_t + 0.5), 200))
    assert np.abs(guess.xyxy[0] - expected).max() < 3.0
    assert guess.velocities[0] == pytest.approx([60.0, 0.0, 60.0, 0.0], abs=3.0)
    # and nothing changed: asked again it says the same, and the next detected frame
    # (1 s after the last) continues the same track
    again = core.predict(0, last_t + 0.5)
    assert np.array_equal(again.xyxy, guess.xyxy)
    t = last_t + 1.0
    (update,) = core.update(
        [CameraBoxes(0, np.array([box(100 + 60 * t, 200)]), np.array([0.8]), np.array([2]), t)]
    )
    assert ids_of(update) == [1]
    # and a camera with no frame yet, or a lost track, gives nothing
    assert len(core.predict(5, 1.0)) == 0
    empty = CameraBoxes(0, np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), t + 0.1)
    core.update([empty])
    assert len(core.predict(0, t + 0.2)) == 0
