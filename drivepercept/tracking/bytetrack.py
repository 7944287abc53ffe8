"""ByteTrack over one camera's boxes (Zhang et al., "ByteTrack: Multi-Object Tracking by
Associating Every Detection Box", ECCV 2022), stepped by time.

Each `CameraTracker.update` takes one frame's boxes and:

1. predicts every track to the frame's time (`kalman.BoxKalman`, by the elapsed seconds, so
   frames a live camera dropped make one longer step);
2. matches high-score boxes to confirmed tracks, tracked and lost (IoU, Hungarian);
3. matches low-score boxes to the confirmed tracks still unmatched that were tracked in the
   previous frame, with a stricter IoU (the "byte" step: an occluded object's weak box keeps
   its track instead of starting a false one); tracked ones left over become lost;
4. matches the remaining high-score boxes to unconfirmed tracks (too few hits so far), by a
   buffered IoU (they know no motion yet); those that miss are dropped;
5. starts an unconfirmed track for each remaining box scoring at least `new_track_score`;
6. ends lost tracks unseen for more than `lost_s`, and drops the younger of a tracked and a
   lost track that cover the same place.

A track is confirmed, and only then given an id, after `min_hits` hits (at once in the
tracker's first frame): ids of one camera count up from 1, are never reused, and a false
box that never got a second one used none. Assignments use scipy's `linear_sum_assignment`
with the reference implementation's rule (its `lap.lapjv(..., cost_limit=...)`): a pair is
matched only if that costs less than leaving both unmatched, not to match the most pairs.

Not thread-safe: one tracker per camera, called by one thread (the pipeline's completion
thread). An update with ~20 tracks and boxes takes a fraction of a millisecond.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from drivepercept.errors import ConfigError
from drivepercept.tracking.kalman import BoxKalman, xywh_to_xyxy, xyxy_to_xywh, xyxy_velocities

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DUPLICATE_IOU = 0.85  # a tracked and a lost track overlapping more than this are one object


@dataclass(frozen=True)
class TrackParams:
    """ByteTrack's settings (the reference implementation's defaults, but for
    `unconfirmed_buffer`).

    Attributes:
        high_score: boxes scoring at least this take part in the first association.
        low_score: boxes scoring at least this (and below `high_score`) can only continue a
            track (second association); lower ones are ignored. The pipeline's own score
            threshold (0.3 by default) usually removes them first.
        new_track_score: an unmatched high-score box starts a track only from this score.
        match_iou: least IoU of a high-score box and a track (first association).
        second_match_iou: least IoU of a low-score box and a tracked track.
        unconfirmed_match_iou: least IoU of a high-score box and an unconfirmed track.
        unconfirmed_buffer: how far an unconfirmed track's second box may land: both boxes
            are widened by this fraction of their size on each side before that IoU (the
            buffered IoU of C-BIoU, Yang et al., WACV 2023). A track of one box knows no
            motion yet, and an object crossing a side camera at 15 frames/s moves more than
            its width per frame. 0 is ByteTrack's plain IoU.
        lost_s: how long a confirmed track survives without boxes, in seconds.
        min_hits: boxes a new track needs to be confirmed (except in the first frame).
        class_aware: a box only joins a track of its own label.
    """

    high_score: float = 0.5
    low_score: float = 0.1
    new_track_score: float = 0.6
    match_iou: float = 0.2
    second_match_iou: float = 0.5
    unconfirmed_match_iou: float = 0.3
    unconfirmed_buffer: float = 1.0
    lost_s: float = 1.0
    min_hits: int = 2
    class_aware: bool = True

    def __post_init__(self) -> None:
        high = self.high_score
        ranges = {  # name -> (least, most, whether the least is allowed, said as)
            "high_score": (0.0, 1.0, True, "in [0, 1]"),
            "low_score": (0.0, high, True, f"in [0, high_score={high:g}]"),
            "new_track_score": (high, 1.0, True, f"in [high_score={high:g}, 1]"),
            "match_iou": (0.0, 1.0, False, "in (0, 1]"),
            "second_match_iou": (0.0, 1.0, False, "in (0, 1]"),
            "unconfirmed_match_iou": (0.0, 1.0, False, "in (0, 1]"),
            "unconfirmed_buffer": (0.0, 10.0, True, "in [0, 10]"),
            "lost_s": (0.0, math.inf, True, ">= 0 seconds"),
        }
        for name, (least, most, closed, said) in ranges.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number {said}, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number {said}, got {value!r}")
            if not (least <= value <= most if closed else least < value <= most):
                raise ConfigError(f"{name} must be {said}, got {value!r}")
        hits = self.min_hits
        if isinstance(hits, bool) or not isinstance(hits, int) or hits < 1:
            raise ConfigError(f"min_hits must be an integer >= 1, got {hits!r}")
        if not isinstance(self.class_aware, bool):
            raise ConfigError(f"class_aware must be true or false, got {self.class_aware!r}")


@dataclass(frozen=True, eq=False)
class TrackUpdate:
    """What tracking said about one frame's boxes, parallel to them.

    Attributes:
        track_ids: `(N,)` the confirmed track each box belongs to; -1 for a box that was
            ignored, left unmatched or only started (or continued) an unconfirmed track.
        velocities: `(N, 4)` `d(x1, y1, x2, y2)/dt` in pixels per second from the track's
            motion model; NaN where the box has no id or its track has one box so far.
    """

    track_ids: IntArray
    velocities: FloatArray

    def __post_init__(self) -> None:
        n = len(self.track_ids)
        if self.track_ids.shape != (n,):
            raise ValueError(f"track_ids must have shape ({n},), got {self.track_ids.shape}")
        if self.velocities.shape != (n, 4):
            raise ValueError(f"velocities must have shape ({n}, 4), got {self.velocities.shape}")

    def __repr__(self) -> str:
        return f"TrackUpdate(n={len(self.track_ids)}, tracked={int((self.track_ids > 0).sum())})"


@dataclass(frozen=True)
class TrackInfo:
    """One live confirmed track, for reports.

    Attributes:
        track_id: its id in its camera (1, 2, ...).
        label: its class index.
        xyxy: its box now (the filter's estimate; predicted if it missed this frame).
        velocity: `d(x1, y1, x2, y2)/dt`, pixels per second (NaN after one box).
        first_seen_s: time of its first box.
        last_seen_s: time of its latest box.
        hits: how many boxes it took.
        lost: whether it missed the latest frame (it ends after `lost_s` of misses).
    """

    track_id: int
    label: int
    xyxy: tuple[float, float, float, float]
    velocity: tuple[float, float, float, float]
    first_seen_s: float
    last_seen_s: float
    hits: int
    lost: bool


def box_iou(a: FloatArray, b: FloatArray) -> FloatArray:
    """IoU of every box in `a` `(T, 4)` with every box in `b` `(N, 4)`, xyxy: `(T, N)`.
    A box of no area overlaps nothing (IoU 0)."""
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0.0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0.0, None), axis=1)
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(iw, 0.0, None) * np.clip(ih, 0.0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / union, 0.0)
    return iou


def widen(xyxy: FloatArray, fraction: float) -> FloatArray:
    """Boxes `(N, 4)` widened by `fraction` of their width and height on each side."""
    margin = fraction * (xyxy[:, 2:] - xyxy[:, :2])
    return np.concatenate([xyxy[:, :2] - margin, xyxy[:, 2:] + margin], axis=1)


def match(iou: FloatArray, min_iou: float) -> tuple[IntArray, IntArray]:
    """Pairs (rows, columns) of an IoU matrix that minimise the total cost `1 - IoU`, where
    a pair below `min_iou` is never taken and a pair is taken only if it costs less than
    leaving its row and its column unmatched (`1 - min_iou` for the two)."""
    empty = np.zeros(0, np.int64)
    ok = iou >= min_iou
    if not ok.any():
        return empty, empty
    rows = np.flatnonzero(ok.any(axis=1))
    cols = np.flatnonzero(ok.any(axis=0))
    ok = ok[np.ix_(rows, cols)]
    if (ok.sum(axis=0) <= 1).all() and (ok.sum(axis=1) <= 1).all():
        r, c = np.nonzero(ok)  # no pair competes with another: take them all
        return rows[r], cols[c]
    limit = 1.0 - min_iou
    t, n = ok.shape
    cost = np.full((t + n, n + t), 0.5 * limit)  # unmatched: half the limit per side
    cost[:t, :n] = np.where(ok, 1.0 - iou[np.ix_(rows, cols)], limit + 1.0)
    cost[t:, n:] = 0.0
    r, c = linear_sum_assignment(cost)
    keep = (r < t) & (c < n)
    r, c = r[keep], c[keep]
    keep = ok[r, c]
    return rows[r[keep]], cols[c[keep]]


_COLUMNS = ("mean", "cov", "ids", "labels", "hits", "first_s", "last_s", "lost")


class _Tracks:
    """The tracks of one camera as parallel arrays (one row per track), so that prediction
    and correction run over all of them at once."""

    def __init__(self) -> None:
        self.mean = np.zeros((0, 8))
        self.cov = np.zeros((0, 8, 8))
        self.ids = np.zeros(0, np.int64)  # 0: not confirmed yet
        self.labels = np.zeros(0, np.int64)
        self.hits = np.zeros(0, np.int64)
        self.first_s = np.zeros(0)
        self.last_s = np.zeros(0)
        self.lost = np.zeros(0, np.bool_)

    def __len__(self) -> int:
        return len(self.ids)

    def append(
        self, mean: FloatArray, cov: FloatArray, ids: IntArray, labels: IntArray, t_s: float
    ) -> None:
        n, seen = len(ids), np.full(len(ids), t_s)
        new = (mean, cov, ids, labels, np.ones(n, np.int64), seen, seen, np.zeros(n, np.bool_))
        for name, rows in zip(_COLUMNS, new, strict=True):
            setattr(self, name, np.concatenate([getattr(self, name), rows]))

    def velocities(self, rows: IntArray) -> FloatArray:
        """`d(x1, y1, x2, y2)/dt` of `rows`; NaN for a track of one box (no motion yet)."""
        velocities = xyxy_velocities(self.mean[rows])
        velocities[self.hits[rows] < 2] = np.nan
        return velocities

    def keep(self, mask: BoolArray) -> None:
        for name in _COLUMNS:
            setattr(self, name, getattr(self, name)[mask])


def _inputs(
    xyxy: object, scores: object, labels: object
) -> tuple[FloatArray, FloatArray, IntArray]:
    boxes = np.asarray(xyxy, np.float64)
    score = np.asarray(scores, np.float64)
    label = np.asarray(labels)
    n = score.shape[0] if score.ndim == 1 else -1
    if boxes.size == 0 and n == 0:
        boxes = boxes.reshape(0, 4)
    if n < 0 or boxes.shape != (n, 4) or label.shape != (n,):
        raise ValueError(
            "xyxy, scores and labels must have shapes (N, 4), (N,) and (N,), "
            f"got {boxes.shape}, {score.shape} and {label.shape}"
        )
    if n and not np.issubdtype(label.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {label.dtype}")
    return boxes, score, label.astype(np.int64, copy=False)


class CameraTracker:
    """ByteTrack for one camera (see the module docstring).

    Args:
        params: the tracker's settings.
        kalman: the motion model's constants.
    """

    def __init__(
        self, params: TrackParams | None = None, *, kalman: BoxKalman | None = None
    ) -> None:
        self.params = params or TrackParams()
        self.kalman = kalman or BoxKalman()
        self._tracks = _Tracks()
        self._last_t: float | None = None
        self._next_id = 1
        self._ended_s: dict[int, float] = {}  # ended confirmed tracks: id -> lifetime

    def update(
        self, xyxy: FloatArray, scores: FloatArray, labels: IntArray, t_s: float
    ) -> TrackUpdate:
        """Track one frame's boxes.

        Args:
            xyxy: `(N, 4)` boxes in pixels; ones with NaN or infinite corners or no area
                are ignored (track id -1).
            scores: `(N,)` their scores.
            labels: `(N,)` their class indices.
            t_s: the frame's time in seconds, later than the previous frame's.

        Returns:
            each box's confirmed track id and velocity.

        Raises:
            ValueError: arrays of mismatched shapes, or `t_s` not after the previous one.
        """
        boxes, score, label = _inputs(xyxy, scores, labels)
        t = float(t_s)
        if not math.isfinite(t) or (self._last_t is not None and t <= self._last_t):
            raise ValueError(
                f"t_s must be finite and after the previous {self._last_t!r}, got {t_s!r}"
            )
        first = self._last_t is None
        tracks, p = self._tracks, self.params
        if len(tracks) and self._last_t is not None:
            # a lost track keeps drifting, but its size stops changing (as in ByteTrack)
            tracks.mean[tracks.lost, 6:8] = 0.0
            tracks.mean, tracks.cov = self.kalman.predict(tracks.mean, tracks.cov, t - self._last_t)
        self._last_t = t

        n = len(score)
        with np.errstate(invalid="ignore"):
            valid = np.isfinite(boxes).all(axis=1) & np.isfinite(score)
            valid &= (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        high = valid & (score >= p.high_score)
        low = valid & (score >= p.low_score) & ~high
        track_boxes = xywh_to_xyxy(tracks.mean)
        same = (tracks.labels[:, None] == label[None, :]) | (not p.class_aware)
        iou = np.where(same, box_iou(track_boxes, np.where(valid[:, None], boxes, 0.0)), 0.0)
        confirmed = tracks.ids > 0
        was_tracked = confirmed & ~tracks.lost
        det_row = np.full(n, -1, np.int64)  # each box's track row
        row_det = np.full(len(tracks), -1, np.int64)  # each track's box

        def associate(rows: IntArray, dets: IntArray, min_iou: float) -> None:
            r, c = match(iou[np.ix_(rows, dets)], min_iou)
            det_row[dets[c]] = rows[r]
            row_det[rows[r]] = dets[c]

        associate(np.flatnonzero(confirmed), np.flatnonzero(high), p.match_iou)
        associate(
            np.flatnonzero(was_tracked & (row_det < 0)), np.flatnonzero(low), p.second_match_iou
        )
        high_left = np.flatnonzero(high & (det_row < 0))
        unconfirmed = np.flatnonzero(~confirmed)
        if len(unconfirmed) and len(high_left):  # buffered IoU: the track has no motion yet
            pairs = np.ix_(unconfirmed, high_left)
            buffered = box_iou(
                widen(track_boxes[unconfirmed], p.unconfirmed_buffer),
                widen(boxes[high_left], p.unconfirmed_buffer),
            )
            iou[pairs] = np.where(same[pairs], buffered, 0.0)
        associate(unconfirmed, high_left, p.unconfirmed_match_iou)

        matched = np.flatnonzero(row_det >= 0)
        if len(matched):
            z = xyxy_to_xywh(boxes[row_det[matched]])
            tracks.mean[matched], tracks.cov[matched] = self.kalman.update(
                tracks.mean[matched], tracks.cov[matched], z
            )
            tracks.hits[matched] += 1
            tracks.last_s[matched] = t
            tracks.labels[matched] = label[row_det[matched]]
        tracks.lost = confirmed & (row_det < 0)
        drop = ~confirmed & (row_det < 0)  # an unconfirmed track that missed
        promote = np.flatnonzero(~confirmed & (tracks.hits >= p.min_hits))
        tracks.ids[promote] = self._new_ids(len(promote))

        new = np.flatnonzero(high & (det_row < 0) & (score >= p.new_track_score))
        if len(new):
            mean, cov = self.kalman.initiate(xyxy_to_xywh(boxes[new]))
            confirm = first or p.min_hits <= 1
            ids = self._new_ids(len(new)) if confirm else np.zeros(len(new), np.int64)
            det_row[new] = len(tracks) + np.arange(len(new))
            tracks.append(mean, cov, ids, label[new], t)
            drop = np.concatenate([drop, np.zeros(len(new), np.bool_)])

        drop |= tracks.lost & (t - tracks.last_s > p.lost_s)
        drop |= self._duplicates()
        return self._finish(det_row, drop)

    def _new_ids(self, count: int) -> IntArray:
        ids = np.arange(self._next_id, self._next_id + count, dtype=np.int64)
        self._next_id += count
        return ids

    def _duplicates(self) -> BoolArray:
        """Rows to drop: of a tracked and a lost confirmed track covering the same place,
        the one followed for less time (the reference implementation's rule)."""
        tracks = self._tracks
        drop = np.zeros(len(tracks), np.bool_)
        confirmed = tracks.ids > 0
        tracked = np.flatnonzero(confirmed & ~tracks.lost)
        lost = np.flatnonzero(confirmed & tracks.lost)
        if not len(tracked) or not len(lost):
            return drop
        boxes = xywh_to_xyxy(tracks.mean)
        a, b = np.nonzero(box_iou(boxes[tracked], boxes[lost]) > DUPLICATE_IOU)
        age = tracks.last_s - tracks.first_s
        tracked_older = age[tracked[a]] > age[lost[b]]
        drop[lost[b[tracked_older]]] = True
        drop[tracked[a[~tracked_older]]] = True
        return drop

    def _finish(self, det_row: IntArray, drop: BoolArray) -> TrackUpdate:
        """Each box's id and velocity, then the dropped tracks removed (ended ones counted)."""
        tracks = self._tracks
        n = len(det_row)
        ids = np.full(n, -1, np.int64)
        velocities = np.full((n, 4), np.nan)
        has = np.flatnonzero(det_row >= 0)
        rows = det_row[has]
        shown = (tracks.ids[rows] > 0) & ~drop[rows]
        has, rows = has[shown], rows[shown]
        ids[has] = tracks.ids[rows]
        velocities[has] = tracks.velocities(rows)
        for row in np.flatnonzero(drop & (tracks.ids > 0)).tolist():
            self._ended_s[int(tracks.ids[row])] = float(tracks.last_s[row] - tracks.first_s[row])
        tracks.keep(~drop)
        return TrackUpdate(ids, velocities)

    def tracks(self) -> tuple[TrackInfo, ...]:
        """The live confirmed tracks (tracked and lost), by id."""
        tr = self._tracks
        rows = np.flatnonzero(tr.ids > 0)
        rows = rows[np.argsort(tr.ids[rows])]
        boxes = xywh_to_xyxy(tr.mean[rows]).tolist()
        velocities = tr.velocities(rows).tolist()
        return tuple(
            TrackInfo(
                track_id=int(tr.ids[row]),
                label=int(tr.labels[row]),
                xyxy=(box[0], box[1], box[2], box[3]),
                velocity=(v[0], v[1], v[2], v[3]),
                first_seen_s=float(tr.first_s[row]),
                last_seen_s=float(tr.last_s[row]),
                hits=int(tr.hits[row]),
                lost=bool(tr.lost[row]),
            )
            for row, box, v in zip(rows.tolist(), boxes, velocities, strict=True)
        )

    def lifetimes_s(self) -> tuple[float, ...]:
        """How long each confirmed track, ended or live, has lasted (first to latest box),
        in seconds, by track id."""
        lifetimes = dict(self._ended_s)
        tr = self._tracks
        for row in np.flatnonzero(tr.ids > 0).tolist():
            lifetimes[int(tr.ids[row])] = float(tr.last_s[row] - tr.first_s[row])
        return tuple(lifetimes[k] for k in sorted(lifetimes))

    @property
    def ended_count(self) -> int:
        """How many confirmed tracks have ended (lost for longer than `lost_s`, or merged)."""
        return len(self._ended_s)
