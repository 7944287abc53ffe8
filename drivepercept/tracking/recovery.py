"""Lost tracks found again, the two ways `ByteTracker` tries after its associations: by
motion (a lost track's box moved on) and by looks (its appearance). Each gives how well
each of some lost tracks and some boxes left over fit, 0 where a pair may not be joined;
the tracker assigns on it (by looks: minus infinity there, below any threshold a setting can
give). Pure numpy on the track table; no state of their own."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from drivepercept.tracking.association import box_iou, widen
from drivepercept.tracking.kalman import xywh_to_xyxy
from drivepercept.tracking.track_table import TrackTable
from drivepercept.tracking.track_types import TrackParams

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

RECOVER_AREA_RATIO = 2.0  # a lost track is found by its motion only by a box of like size


def area(xyxy: FloatArray) -> FloatArray:
    """Each box's area (0 for one with no extent)."""
    size = np.maximum(xyxy[:, 2:] - xyxy[:, :2], 0.0)
    out: FloatArray = size[:, 0] * size[:, 1]
    return out


def _like_size(tracks: TrackTable, rows: IntArray, boxes: FloatArray, bound: float) -> BoolArray:
    """`(R, D)`: the track's last box and the box have areas within a factor of `bound`."""
    ratio = area(tracks.box[rows])[:, None] / np.maximum(area(boxes)[None, :], 1e-9)
    out: BoolArray = (ratio <= bound) & (ratio >= 1.0 / bound)
    return out


def by_motion(
    tracks: TrackTable,
    rows: IntArray,
    boxes: FloatArray,
    gap_s: FloatArray,
    allowed: BoolArray,
    params: TrackParams,
) -> FloatArray:
    """How lost tracks `rows` fit `boxes` `(D, 4)` by motion, `(R, D)`: the IoU of the boxes
    widened by `recover_buffer` of their size, each track's box the better of its filter's
    prediction and its last box moved on by its velocity over `gap_s` `(R,)` (OC-SORT's
    observation-centric recovery: a filter that coasted through a gap has drifted, the last
    box has not); 0 for pairs not `allowed` or not of like size (areas within a factor of
    2). A restart under a new id inside the lost buffer was most of ByteTrack's identity
    switches on the crossing drives."""
    velocity = np.nan_to_num(tracks.velocities(rows))
    moved = tracks.box[rows] + velocity * np.nan_to_num(gap_s)[:, None]
    predicted = xywh_to_xyxy(tracks.mean[rows])
    buffer = params.recover_buffer
    wide = widen(boxes, buffer)
    near = np.maximum(box_iou(widen(predicted, buffer), wide), box_iou(widen(moved, buffer), wide))
    ok = allowed & _like_size(tracks, rows, boxes, RECOVER_AREA_RATIO)
    out: FloatArray = np.where(ok, near, 0.0)
    return out


def by_looks(
    tracks: TrackTable,
    rows: IntArray,
    boxes: FloatArray,
    distance: FloatArray,
    allowed: BoolArray,
    params: TrackParams,
) -> FloatArray:
    """How lost tracks `rows` (with an appearance) fit `boxes` by their looks, `(R, D)`:
    1 - their feature distance `distance` `(R, D)`, for pairs within reach (the boxes widened
    by `recognise_buffer` of their size overlap) and of like size (areas within
    `recognise_area_ratio`); minus infinity for the others and those not `allowed` (a
    `recognise_distance` of 1 or more makes the threshold 0 or less). An object hidden for
    a second or more has moved and grown beyond what its coasting filter or its last box
    predict; what it looks like has not changed."""
    buffer = params.recognise_buffer
    near = box_iou(widen(tracks.box[rows], buffer), widen(boxes, buffer)) > 0.0
    ok = allowed & near & _like_size(tracks, rows, boxes, params.recognise_area_ratio)
    out: FloatArray = np.where(ok, 1.0 - distance, -np.inf)
    return out
