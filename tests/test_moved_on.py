"""Answers moved on to the moment they are used (`Detections.moved_on`): tracked boxes by
their velocities, others where they were, clipped to the frame, and what leaves it left out
with its other columns."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from drivepercept.types import FrameMeta, FrameResult, FrameTiming, Letterbox
from drivepercept.types.detections import Detections

NAN = float("nan")


def _tracked() -> Detections:
    return Detections(
        np.array([[0, 0, 10, 10], [100, 100, 120, 130], [600, 0, 630, 10]], np.float32),
        np.array([0.9, 0.4, 0.8], np.float32),
        np.array([0, 1, 0]),
        ("car", "pedestrian"),
        track_ids=np.array([3, -1, 7]),
        velocities=np.array([[10, 0, 10, 0], [NAN] * 4, [200, 0, 200, 0]], np.float32),
        global_ids=np.array([12, -1, 15]),
    )


def test_tracked_boxes_move_by_their_velocities_others_stay_and_what_leaves_is_dropped() -> None:
    # given three boxes: one tracked moving right at 10 px/s, one no track took, and one
    # tracked at 200 px/s 10 px from the right edge of a 640-px-wide frame
    moved = _tracked().moved_on(0.5, (640, 360))
    # then half a second later the first moved 5 px, the second stayed, the third left the
    # image and is gone with its score, label and ids
    np.testing.assert_allclose(moved.xyxy, [[5, 0, 15, 10], [100, 100, 120, 130]])
    assert moved.xyxy.dtype == np.float32
    assert moved.track_ids is not None and moved.track_ids.tolist() == [3, -1]
    assert moved.global_ids is not None and moved.global_ids.tolist() == [12, -1]
    np.testing.assert_allclose(moved.scores, [0.9, 0.4])
    assert moved.names == ["car", "pedestrian"]


def test_without_tracking_or_without_a_size_nothing_is_dropped() -> None:
    # given boxes without velocities (no tracking), they stay where they were
    plain = Detections(_tracked().xyxy, _tracked().scores, _tracked().labels)
    np.testing.assert_array_equal(plain.moved_on(1.0, (640, 360)).xyxy, plain.xyxy)
    # and without a size a box may move past the edge: it is not clipped or dropped
    far = _tracked().moved_on(0.5)
    np.testing.assert_allclose(far.xyxy[2], [700, 0, 730, 10])


def test_a_time_that_is_not_finite_is_refused() -> None:
    with pytest.raises(ValueError, match="dt_s must be finite"):
        _tracked().moved_on(NAN)


def test_a_frame_result_moved_on_to_a_later_time_on_its_capture_clock() -> None:
    # given a 640x360 frame captured at t = 1 s, answered with tracked boxes
    meta = FrameMeta(
        "front", 0, 5, 0.33, 1_000_000_000, 0, 0, Letterbox((640, 360), (320, 192), 0.5, 0.5, 0, 6)
    )
    timing = FrameTiming(*([0] * len(fields(FrameTiming))))
    result = FrameResult(meta, 0, 1, _tracked(), timing)
    # then 100 ms after its capture (PYTHON.md's recipe) its first box moved 1 px and the
    # fast one 20 px, clipped to the frame
    now_ns = 1_100_000_000
    at = result.detections.moved_on(
        (now_ns - result.meta.capture_ns) / 1e9, result.meta.letterbox.src_size
    )
    np.testing.assert_allclose(at.xyxy[0], [1, 0, 11, 10])
    np.testing.assert_allclose(at.xyxy[2], [620, 0, 640, 10])
