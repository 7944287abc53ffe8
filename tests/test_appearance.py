"""Issue 44: the tracker tells objects apart by their looks. `box_features` (colours read
from the frame), the distance and running mean over them, and what the tracker does with
them: a box that looks unlike a track never joins it, a lost track is known again by its
looks after its motion model lost it, and a tracker given no features tracks as before."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from drivepercept.tracking.appearance import DIM, blend, box_features, feature_distance
from drivepercept.tracking.bytetrack import ByteTracker, TrackParams
from drivepercept.tracking.camera_tracker import CameraTracker
from drivepercept.tracking.track_table import CameraBoxes

RED, BLUE, GREEN, GREY = (30, 30, 200), (200, 60, 30), (40, 180, 40), (128, 128, 128)


def _scene(*boxes: tuple[tuple[int, int, int, int], tuple[int, int, int]]) -> np.ndarray:
    """A grey 640x360 frame with solid boxes of the given BGR colours (xyxy)."""
    img = np.full((360, 640, 3), 90, np.uint8)
    for (x1, y1, x2, y2), colour in boxes:
        img[y1:y2, x1:x2] = colour
    return img


def test_boxes_of_one_colour_look_alike_and_of_others_do_not() -> None:
    img = _scene(((10, 10, 60, 90), RED), ((100, 10, 140, 70), RED), ((200, 10, 250, 90), BLUE))
    f = box_features(
        img, np.array([[10, 10, 60, 90], [100, 10, 140, 70], [200, 10, 250, 90]], float)
    )
    assert f.shape == (3, DIM) and f.dtype == np.float32
    assert np.allclose(np.linalg.norm(f, axis=1), 1.0, atol=1e-5)
    d = feature_distance(f, f)
    assert d[0, 1] < 0.02  # one colour, another size: alike
    assert d[0, 2] > 0.5  # red against blue: far past the tracker's gate (0.2)


def test_the_top_and_bottom_of_a_box_are_told_apart() -> None:
    """A red shirt over blue trousers is not a blue shirt over red trousers."""
    img = _scene(
        ((10, 10, 50, 50), RED), ((10, 50, 50, 90), BLUE),
        ((100, 10, 140, 50), BLUE), ((100, 50, 140, 90), RED),
    )  # fmt: skip
    f = box_features(img, np.array([[10, 10, 50, 90], [100, 10, 140, 90]], float))
    assert feature_distance(f[:1], f[1:])[0, 0] > 0.3


def test_a_box_that_cannot_be_read_has_no_features() -> None:
    img = _scene(((10, 10, 60, 90), RED))
    boxes = np.array(
        [[np.nan, 0, 10, 10], [700, 400, 800, 500], [10, 10, 11, 11], [-50, -50, -5, -5],
         [10, 10, 60, 90], [np.inf, 0, 1e9, 1e9]]
    )  # fmt: skip
    f = box_features(img, boxes)
    assert f[[0, 1, 2, 3, 5]].any(axis=1).tolist() == [False] * 5 and f[4].any()
    # and a pair with an unknown side is not held against each other
    assert feature_distance(f[:1], f[4:5])[0, 0] == 0.0
    assert box_features(img, np.zeros((0, 4))).shape == (0, DIM)


def test_a_frame_that_is_not_an_image_is_refused() -> None:
    with pytest.raises(ValueError, match="uint8"):
        box_features(np.zeros((10, 10, 3), np.float32), np.zeros((0, 4)))
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        box_features(np.zeros((10, 10, 3), np.uint8), np.zeros((3,)))


def test_a_tracks_looks_are_a_running_mean_of_its_boxes() -> None:
    a, b = np.eye(2, dtype=np.float32)[:1], np.eye(2, dtype=np.float32)[1:]
    mixed = blend(a, b, 0.9)
    assert np.allclose(np.linalg.norm(mixed), 1.0) and mixed[0, 0] > 0.99 * mixed[0].max()
    assert np.allclose(blend(np.zeros_like(a), b, 0.9), b)  # no looks yet: the box's own


def _box(x: float, w: float = 40.0) -> np.ndarray:
    return np.array([[x, 100.0, x + w, 180.0]])


def _feature(colour: tuple[int, int, int]) -> np.ndarray:
    return box_features(_scene(((0, 0, 40, 80), colour)), np.array([[0.0, 0.0, 40.0, 80.0]]))


def _walk(
    tracker: CameraTracker, xs: list[float | None], looks: Sequence[np.ndarray | None]
) -> list[int]:
    """Track one car along `xs` (None: not detected that frame), 10 frames/s; its ids."""
    ids = []
    for k, (x, look) in enumerate(zip(xs, looks, strict=True)):
        boxes = _box(x) if x is not None else np.zeros((0, 4))
        f = look if x is not None else (None if look is None else np.zeros((0, DIM), np.float32))
        out = tracker.update(
            boxes, np.full(len(boxes), 0.9), np.zeros(len(boxes), np.int64), k / 10, features=f
        )
        ids += out.track_ids.tolist()
    return ids


def test_a_car_hidden_for_two_seconds_is_known_again_by_its_looks() -> None:
    """Hidden for 2 s, past `lost_s` (1.5 s, when a track known by motion alone ends): by
    its looks (kept up to `recognise_lost_s`) it keeps its id; a car that looks different
    there, or the same car without features (motion alone), gets a new one."""
    xs: list[float | None] = [100.0 + 10 * k for k in range(10)] + [None] * 20
    xs += [400.0 + 10 * k for k in range(5)]
    red = _feature(RED)
    assert _walk(CameraTracker(), xs, [red] * len(xs)) == [1] * 15  # every box, one id
    # (a new track's first box has no id yet: -1)
    blue_after = [red] * 30 + [_feature(BLUE)] * 5
    assert _walk(CameraTracker(), xs, blue_after) == [1] * 10 + [-1] + [2] * 4
    assert _walk(CameraTracker(), xs, [None] * len(xs)) == [1] * 10 + [-1] + [2] * 4


def test_a_box_that_looks_unlike_the_track_never_joins_it() -> None:
    """A red and a blue car side by side pass each other: in one frame each box lands where
    the other car was. Motion alone hands each track the other's box; by their looks each
    keeps its own."""
    red, blue = _feature(RED)[0], _feature(BLUE)[0]

    def ids_of_red(looks: bool) -> list[int]:
        tracker, out = ByteTracker(), []
        for k in range(8):
            a, b = (100.0, 130.0) if k < 5 else (125.0 + 3 * (k - 5), 105.0 - 3 * (k - 5))
            boxes = np.array([[a, 100, a + 40, 180], [b, 100, b + 40, 180]], float)
            feats = np.stack([red, blue]) if looks else None
            frame = CameraBoxes(0, boxes, np.full(2, 0.9), np.zeros(2, np.int64), k / 10, feats)
            out.append(int(tracker.update([frame])[0].track_ids[0]))
        return out

    assert ids_of_red(looks=True) == [1] * 8
    assert ids_of_red(looks=False) == [1] * 5 + [2] * 3  # (motion alone: swapped)


def test_a_second_class_on_one_object_starts_no_second_track() -> None:
    """A detector that boxes one pedestrian as pedestrian and cyclist (per-class NMS) gives
    it one track, not two that hand the object back and forth."""

    def run(tracker: CameraTracker) -> list[int]:
        for k in range(8):  # from its fourth frame the detector sees a cyclist there too
            box = _box(100.0 + 5 * k)
            boxes, scores, labels = box, np.array([0.9]), np.array([3])
            if k >= 3:
                boxes = np.concatenate([box, box + 1.0])
                scores, labels = np.array([0.9, 0.7]), np.array([3, 4])
            out = tracker.update(boxes, scores, labels, k / 10)
        ids: list[int] = out.track_ids.tolist()
        return ids

    tracker = CameraTracker()
    assert run(tracker) == [1, -1] and len(tracker.tracks()) == 1
    # and with the setting off, the cyclist box gets a second track
    assert run(CameraTracker(TrackParams(new_track_overlap=1.0))) == [1, 2]


def test_features_of_the_wrong_shape_are_refused() -> None:
    tracker = CameraTracker()
    with pytest.raises(ValueError, match="features must have shape"):
        tracker.update(
            _box(0.0), np.array([0.9]), np.array([0]), 0.0, features=np.zeros((2, DIM), np.float32)
        )


def test_a_batch_of_frames_is_read_as_each_frame_alone() -> None:
    """The stage reads a batch's boxes in one pass (`frames_features`): the same numbers as
    each frame alone, frames without boxes or with unreadable ones included."""
    from drivepercept.tracking.appearance import frames_features

    a = _scene(((10, 10, 60, 90), RED), ((200, 10, 250, 90), BLUE))
    b = _scene(((300, 100, 340, 200), GREEN))
    boxes_a = np.array([[10, 10, 60, 90], [200, 10, 250, 90], [np.nan, 0, 1, 1]], float)
    boxes_b = np.array([[300, 100, 340, 200]], float)
    together = frames_features([(a, boxes_a), (b, np.zeros((0, 4))), (b, boxes_b)])
    alone = [box_features(a, boxes_a), box_features(b, np.zeros((0, 4))), box_features(b, boxes_b)]
    assert [t.shape for t in together] == [(3, DIM), (0, DIM), (1, DIM)]
    for t, s in zip(together, alone, strict=True):
        assert np.array_equal(t, s)
    assert feature_distance(together[0][:1], together[2])[0, 0] > 0.5  # red against green


def test_frames_of_different_sizes_and_many_boxes_are_read_as_each_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One pass over frames of different sizes (each box read with its own frame's width)
    and frames over the per-frame limit of boxes (each frame's first ones read)."""
    from drivepercept.tracking import appearance

    monkeypatch.setattr(appearance, "MAX_BOXES", 2)
    wide = _scene(((10, 10, 60, 90), RED), ((200, 10, 250, 90), BLUE), ((300, 20, 340, 90), GREEN))
    small = np.full((200, 320, 3), 90, np.uint8)
    small[150:200, 280:320] = BLUE  # a box at the corner, cut by the image
    small[10:60, 10:40] = GREEN
    boxes_wide = np.array([[10, 10, 60, 90], [200, 10, 250, 90], [300, 20, 340, 90]], float)
    boxes_small = np.array([[0, 0, 2, 2], [280, 150, 330, 210], [10, 10, 40, 60]], float)
    frames = [(small, boxes_small), (wide, boxes_wide), (small, boxes_small[::-1].copy())]
    together = appearance.frames_features(frames)
    for (image, boxes), read in zip(frames, together, strict=True):
        assert np.array_equal(read, appearance.frames_features([(image, boxes)])[0])
    # a frame's first two readable boxes are read: the unreadable one does not count
    assert appearance.has_features(together[0]).tolist() == [False, True, True]
    assert appearance.has_features(together[1]).tolist() == [True, True, False]
    assert appearance.has_features(together[2]).tolist() == [True, True, False]
    assert feature_distance(together[0][1:2], together[1][1:2])[0, 0] < 0.05  # blue, blue


def test_a_box_without_looks_is_not_taken_for_one_that_looks_alike() -> None:
    """A box whose looks are not known (no pixels, or too small to read) is neither kept
    from a track nor known again by looks it does not have: a lost track is not handed a
    box six widths away in a frame without features."""
    red = _feature(RED)
    xs: list[float | None] = [100.0 + 10 * k for k in range(8)] + [None] * 5 + [400.0]
    looks: list[np.ndarray | None] = [red] * 13 + [None]
    assert _walk(CameraTracker(), xs, looks)[-1] == -1  # a new track, not id 1


def test_a_weak_box_that_looks_like_the_track_continues_it() -> None:
    """The looks rank both passes' pairs in reach (IoU >= `match_iou`): a low-score box (an
    object half hidden) at IoU 0.33, under the low-score pass's 0.5, continues a track it
    looks like (0.33 + 0.3 for looking alike); one that looks only somewhat like it (a
    darker red, 0.17 away: inside the gate) does not."""

    def after(look: np.ndarray) -> list[int]:
        red = _feature(RED)
        tracker = CameraTracker()
        for k in range(4):
            out = tracker.update(_box(100.0), np.array([0.9]), np.array([0]), k / 10, features=red)
        assert out.track_ids.tolist() == [1]
        moved = _box(120.0)  # IoU with the track's box: 20/60 = 0.33
        ids: list[int] = tracker.update(
            moved, np.array([0.3]), np.array([0]), 0.4, features=look
        ).track_ids.tolist()
        return ids

    assert after(_feature(RED)) == [1]
    assert after(_feature((30, 30, 160))) == [-1]


def test_a_track_kept_for_its_looks_does_not_crowd_out_a_new_one() -> None:
    """A still object hidden for 1.7 s (past `lost_s`) comes back looking a little
    different (0.1-0.2 from its track: not known again, not too unlike either): its new
    track gets an id at its second box, not dropped as a duplicate of the old track that is
    only kept to be known by its looks."""
    red = _feature(RED)
    shade = _feature((30, 30, 160))  # a darker red
    d = float(feature_distance(red, shade)[0, 0])
    assert 0.1 < d < 0.2, d  # (the scene's premise)
    xs: list[float | None] = [100.0] * 10 + [None] * 17 + [100.0] * 6
    ids = _walk(CameraTracker(), xs, [red] * 27 + [shade] * 6)
    assert ids[:10] == [1] * 10 and ids[10] == -1 and ids[11:] == [2] * 5


def test_a_wide_recognise_distance_never_joins_a_pair_it_may_not() -> None:
    """`recognise_distance` may reach 2 (any looks): a lost track is still only known again
    by a box of its own camera, near enough and of like size. A far box in one camera, with
    lost tracks in two, starts its own track (before the fix, a threshold of 1 - 1.5 took
    pairs it had ruled out, given a fit of 0, and the box took a lost track's id at once)."""
    red = _feature(RED)[0]
    tracker = ByteTracker(TrackParams(recognise_distance=1.5))
    for k in range(10):  # a red car in each of two cameras, then neither is seen
        tracker.update([
            CameraBoxes(cam, _box(100.0 + 5 * k), np.full(1, 0.9), np.zeros(1, np.int64),
                        k / 10, red[None, :])
            for cam in (0, 1)
        ])  # fmt: skip
    nothing = np.zeros((0, DIM), np.float32)
    for k in range(10, 13):
        tracker.update([
            CameraBoxes(c, np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), k / 10, nothing)
            for c in (0, 1)
        ])  # fmt: skip
    far = CameraBoxes(1, _box(5000.0), np.full(1, 0.9), np.zeros(1, np.int64), 1.3, red[None, :])
    update = tracker.update([far])[0]
    assert update.track_ids.tolist() == [-1]  # a new track, not yet confirmed
