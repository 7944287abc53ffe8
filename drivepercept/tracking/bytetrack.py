"""ByteTrack (Zhang et al., "ByteTrack: Multi-Object Tracking by Associating Every Detection
Box", ECCV 2022) over each camera's boxes, stepped by time, a batch's cameras at once.

Each `ByteTracker.update` takes one frame from each of some cameras and, for every camera's
tracks and boxes (a box only ever meets its own camera's tracks, and, class-aware, those of
its kind: its own label, or another of its kind at `class_change_cost`):

1. predicts every track to its frame's time (`kalman.BoxKalman`, by the elapsed seconds, so
   frames a live camera dropped make one longer step);
2. matches high-score boxes to confirmed tracks, tracked and lost (IoU, Hungarian; where the
   frames' boxes have features, a pair that looks too unlike never, and of the pairs in
   reach those that look alike first: `appearance_gate`, `appearance_weight`);
3. matches low-score boxes to the confirmed tracks still unmatched that were tracked in the
   previous frame, with a stricter IoU (the "byte" step: an occluded object's weak box keeps
   its track instead of starting a false one; with features, a weak box that looks like the
   track reaches that IoU sooner: `appearance_weight`); tracked ones left over become lost;
3b. finds lost tracks again (`recover_buffer`): the lost tracks left over and the high-score
   boxes left over are matched on boxes widened by their size, each track's box the better
   of its filter's prediction and its last box moved on by its velocity (OC-SORT's
   observation-centric recovery), like sizes only: a filter that coasted through a gap has
   drifted, and its object restarting under a new id was most of the identity switches;
3c. knows lost tracks again by their looks (`recognise_*`: kept up to `recognise_lost_s`,
   found within a wide reach by a box that looks like them), where the frames have features:
   an object hidden for a second or more, and one whose box grew or jumped;
4. matches the remaining high-score boxes to unconfirmed tracks (too few hits so far), by a
   buffered IoU (they know no motion yet); those that miss are dropped;
5. starts an unconfirmed track for each remaining box scoring at least `new_track_score`
   that does not cover a box a track took (`new_track_overlap`: one object, two classes);
6. ends lost tracks unseen for more than `lost_s` (`recognise_lost_s` for those with looks),
   and drops the younger of a tracked and a lost track that cover the same place.

A track's looks are a running mean of its high-score boxes' features
(`appearance_momentum`); they cut the crossing drives' ids per object from 1.37-1.49 to
1.21-1.25 (docs/OBJECTS.md). A track is confirmed, and only then given an id, after
`min_hits` hits (one more if its latest box scored under `sure_score`; at once in its
camera's first frame): ids of one camera count up from 1, are never reused, and a false box
that never got a second one used none. Assignments use scipy's `linear_sum_assignment` with
the reference implementation's rule (its `lap.lapjv(..., cost_limit=...)`): a pair is
matched only if that costs no more than leaving both unmatched.

Why a batch at once: the work is many small numpy calls whose overhead, not arithmetic, is
the cost, and one call over a six-camera batch's tracks costs about what one over one
camera's did (docs/OBJECTS.md, "What it costs"). Cross-camera pairs have no overlap, so
the result is the same as one tracker per camera.

Not thread-safe: one thread calls it (the pipeline's completion thread).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from drivepercept.tracking.appearance import blend, feature_distance, has_features
from drivepercept.tracking.association import box_iou, match, widen
from drivepercept.tracking.kalman import BoxKalman, xywh_to_xyxy, xyxy_to_xywh
from drivepercept.tracking.recovery import by_looks, by_motion
from drivepercept.tracking.track_table import CameraBoxes, TrackTable, batch_features, read_boxes
from drivepercept.tracking.track_types import Prediction as Prediction  # re-exported: the
from drivepercept.tracking.track_types import TrackInfo as TrackInfo  # tracker's API
from drivepercept.tracking.track_types import TrackParams as TrackParams
from drivepercept.tracking.track_types import TrackUpdate as TrackUpdate

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DUPLICATE_IOU = 0.85  # a tracked and a lost track overlapping more than this are one object


def _indices(mask: BoolArray) -> IntArray:
    """Where a 1-D mask is true (`np.flatnonzero` without its wrapper's cost: the tracker
    makes dozens of these calls per batch)."""
    return mask.nonzero()[0]


class ByteTracker:
    """ByteTrack for any number of cameras, a batch of their frames at a time (see the module
    docstring). Each camera's tracks and ids are its own: a box only ever joins a track of
    its own camera, and the result is the same as one tracker per camera, but the numpy work
    of a batch is done once instead of once per camera.

    Args:
        params: the tracker's settings.
        kalman: the motion model's constants.
    """

    def __init__(
        self, params: TrackParams | None = None, *, kalman: BoxKalman | None = None
    ) -> None:
        self.params = params or TrackParams()
        self.kalman = kalman or BoxKalman()
        self._tracks = TrackTable()
        self._last_t: dict[int, float] = {}
        self._next_id: dict[int, int] = {}
        self._ended_s: dict[int, dict[int, float]] = {}  # camera -> ended track id -> lifetime
        self._died_young: dict[int, int] = {}  # camera -> unconfirmed tracks that missed

    def update(self, frames: Sequence[CameraBoxes]) -> list[TrackUpdate]:
        """Track one frame of each of some cameras (at most one frame per camera).

        Returns:
            per frame, in order, each box's confirmed track id and velocity.

        Raises:
            ValueError: two frames of one camera, arrays of mismatched shapes, or a time not
                after its camera's previous one.
        """
        cams = [int(f.camera) for f in frames]
        if len(set(cams)) != len(cams):
            raise ValueError(f"one frame per camera in an update, got cameras {cams}")
        parsed = [read_boxes(f.xyxy, f.scores, f.labels) for f in frames]
        times = [float(f.t_s) for f in frames]
        for cam, t, f in zip(cams, times, frames, strict=True):
            last = self._last_t.get(cam)
            if not math.isfinite(t) or (last is not None and t <= last):
                raise ValueError(
                    f"t_s must be finite and after the previous {last!r}, got {f.t_s!r}"
                )
        if not frames:
            return []
        counts = [len(s) for _, s, _ in parsed]
        feature = batch_features(self._tracks, frames, counts)
        boxes = np.concatenate([b for b, _, _ in parsed])
        score = np.concatenate([s for _, s, _ in parsed])
        label = np.concatenate([lab for _, _, lab in parsed])
        kind = np.concatenate(
            [f.kinds_or_labels(lab) for f, (_, _, lab) in zip(frames, parsed, strict=True)]
        )
        det_cam = np.repeat(np.array(cams, np.int64), counts)
        det_t = np.repeat(np.array(times), counts)
        first = {cam: cam not in self._last_t for cam in cams}
        tracks, p = self._tracks, self.params

        # each track's camera in this batch (active), and that camera's time and elapsed time
        order = np.argsort(cams)
        batch_cams = np.array(cams, np.int64)[order]
        batch_t = np.array(times)[order]
        batch_dt = batch_t - np.array([self._last_t.get(cams[k], math.nan) for k in order])
        pos = np.minimum(np.searchsorted(batch_cams, tracks.cams), len(batch_cams) - 1)
        active = batch_cams[pos] == tracks.cams
        row_t = np.where(active, batch_t[pos], np.nan)
        if active.any():
            rows = _indices(active)  # only cameras with a track have a previous time
            # a lost track keeps drifting, but its size stops changing (as in ByteTrack)
            tracks.mean[rows[tracks.lost[rows]], 6:8] = 0.0
            tracks.mean[rows], tracks.cov[rows] = self.kalman.predict(
                tracks.mean[rows], tracks.cov[rows], batch_dt[pos[rows]]
            )
        for cam, t in zip(cams, times, strict=True):
            self._last_t[cam] = t

        n = len(score)
        with np.errstate(invalid="ignore"):
            valid = np.isfinite(boxes).all(axis=1) & np.isfinite(score)
            valid &= (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        high = valid & (score >= p.high_score)
        low = valid & (score >= p.low_score) & ~high
        track_boxes = xywh_to_xyxy(tracks.mean)
        same = tracks.cams[:, None] == det_cam[None, :]  # a box only joins its camera's tracks
        if p.class_aware:  # (another label of its kind: at `class_change_cost`, below)
            same &= tracks.kinds[:, None] == kind[None, :]
        looks = feature.shape[1] > 0  # (known: both sides have looks; 0 apart where not)
        track_has, box_has = has_features(tracks.feature), has_features(feature)
        known = track_has[:, None] & box_has[None, :]
        distance = feature_distance(tracks.feature, feature, known)
        same &= ~(distance > p.appearance_gate)  # never a box that looks unlike the track
        iou = np.where(same, box_iou(track_boxes, np.where(valid[:, None], boxes, 0.0)), 0.0)
        remembered = self._remembered(row_t)
        iou[remembered] = 0.0  # lost past lost_s: only known again by its looks
        ranked = iou  # of the boxes in reach (both passes), those that look like the track first
        if looks and p.appearance_weight > 0:
            alike = np.where(known, np.clip(1.0 - distance / p.appearance_gate, 0.0, 1.0), 0.0)
            ranked = np.where(iou >= p.match_iou, iou + p.appearance_weight * alike, iou)
        if p.class_aware and p.class_change_cost > 0:
            other = (tracks.labels[:, None] != label[None, :]) & (ranked > 0)
            ranked = np.where(other, np.maximum(ranked - p.class_change_cost, 1e-6), ranked)
        confirmed = active & (tracks.ids > 0)
        unconfirmed = active & (tracks.ids == 0)
        was_tracked = confirmed & ~tracks.lost
        det_row = np.full(n, -1, np.int64)  # each box's track row
        row_det = np.full(len(tracks), -1, np.int64)  # each track's box

        def pair(rows: IntArray, dets: IntArray, fit: FloatArray, least: float) -> None:
            r, c = match(fit, least)
            det_row[dets[c]] = rows[r]
            row_det[rows[r]] = dets[c]

        def associate(
            rows: IntArray, dets: IntArray, min_iou: float, fit: FloatArray = iou
        ) -> None:
            if len(rows) and len(dets):
                pair(rows, dets, fit[rows][:, dets], min_iou)

        associate(_indices(confirmed), _indices(high), p.match_iou, ranked)
        associate(_indices(was_tracked & (row_det < 0)), _indices(low), p.second_match_iou, ranked)
        if p.recover_buffer > 0:
            lost = confirmed & tracks.lost
            rows, dets = (
                _indices(lost & ~remembered & (row_det < 0)),
                _indices(high & (det_row < 0)),
            )
            allowed = same[np.ix_(rows, dets)]  # (no pair allowed: nothing to try)
            if allowed.any():
                gap_s = row_t[rows] - tracks.last_s[rows]
                fit = by_motion(tracks, rows, boxes[dets], gap_s, allowed, p)
                pair(rows, dets, fit, p.recover_iou)
        if looks and p.recognise_buffer > 0:
            lost = confirmed & tracks.lost
            rows = _indices(lost & (row_det < 0) & track_has)
            dets = _indices(high & (det_row < 0))
            block = np.ix_(rows, dets)
            allowed = same[block] & known[block]
            if allowed.any():
                fit = by_looks(tracks, rows, boxes[dets], distance[block], allowed, p)
                pair(rows, dets, fit, 1.0 - p.recognise_distance)
        high_left = _indices(high & (det_row < 0))
        young = _indices(unconfirmed)
        if len(young) and len(high_left):  # buffered IoU: the track has no motion yet
            pairs = np.ix_(young, high_left)
            buffered = box_iou(
                widen(track_boxes[young], p.unconfirmed_buffer),
                widen(boxes[high_left], p.unconfirmed_buffer),
            )
            iou[pairs] = np.where(same[pairs], buffered, 0.0)
        associate(young, high_left, p.unconfirmed_match_iou)

        matched = _indices(row_det >= 0)
        if len(matched):
            z = xyxy_to_xywh(boxes[row_det[matched]])
            tracks.mean[matched], tracks.cov[matched] = self.kalman.update(
                tracks.mean[matched], tracks.cov[matched], z
            )
            tracks.hits[matched] += 1
            tracks.box[matched] = boxes[row_det[matched]]
            tracks.score[matched] = score[row_det[matched]]
            tracks.last_s[matched] = row_t[matched]
            tracks.labels[matched] = label[row_det[matched]]
            tracks.kinds[matched] = kind[row_det[matched]]
            teach = matched[high[row_det[matched]] & box_has[row_det[matched]]]
            if looks and len(teach):  # only sure boxes teach a track its looks
                tracks.feature[teach] = blend(
                    tracks.feature[teach], feature[row_det[teach]], p.appearance_momentum
                )
        missed = row_det < 0
        tracks.lost = np.where(active, confirmed & missed, tracks.lost)
        drop = unconfirmed & missed  # an unconfirmed track that missed
        for cam in tracks.cams[drop].tolist():
            self._died_young[cam] = self._died_young.get(cam, 0) + 1
        promote = _indices(unconfirmed & (tracks.hits >= self._hits_needed(tracks.score)))
        tracks.ids[promote] = self._new_ids(tracks.cams[promote])

        new = self._starts(
            high & (det_row < 0) & (score >= p.new_track_score), boxes, det_row, det_cam
        )
        if len(new):
            mean, cov = self.kalman.initiate(xyxy_to_xywh(boxes[new]))
            confirm = np.array([first[c] for c in det_cam[new].tolist()])
            confirm |= self._hits_needed(score[new]) <= 1
            ids = np.zeros(len(new), np.int64)
            ids[confirm] = self._new_ids(det_cam[new[confirm]])
            det_row[new] = len(tracks) + np.arange(len(new))
            tracks.append(
                det_cam[new],
                mean,
                cov,
                ids,
                label[new],
                det_t[new],
                boxes[new],
                score[new],
                feature[new],
                kind[new],
            )
            grown = np.zeros(len(new), np.bool_)
            drop, active = np.concatenate([drop, grown]), np.concatenate([active, ~grown])
            row_t = np.concatenate([row_t, det_t[new]])

        with np.errstate(invalid="ignore"):  # rows of cameras not in the batch: NaN times
            # a track with an appearance is remembered longer (`recognise_lost_s`)
            remember_s = max(p.lost_s, p.recognise_lost_s) if p.recognise_buffer else p.lost_s
            kept_s = np.where(has_features(tracks.feature), remember_s, p.lost_s)
            drop |= active & tracks.lost & (row_t - tracks.last_s > kept_s)
        drop |= self._duplicates(active, row_t)
        ids_out, velocities = self._finish(det_row, drop)
        bounds = np.cumsum([0, *counts])
        return [
            TrackUpdate(ids_out[a:b], velocities[a:b])
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
        ]

    def _starts(
        self, candidates: BoolArray, boxes: FloatArray, det_row: IntArray, det_cam: IntArray
    ) -> IntArray:
        """The boxes that start tracks: `candidates` but those covering a box of their
        camera that a track took (IoU above `new_track_overlap`): a detector that boxes one
        object as two classes would otherwise give it a second track."""
        taken = _indices(det_row >= 0)
        if self.params.new_track_overlap >= 1.0 or not candidates.any() or not len(taken):
            return _indices(candidates)
        rows = _indices(candidates)
        overlap = box_iou(boxes[rows], boxes[taken])
        overlap *= det_cam[rows][:, None] == det_cam[taken][None, :]
        out: IntArray = rows[~(overlap > self.params.new_track_overlap).any(axis=1)]
        return out

    def _hits_needed(self, scores: FloatArray) -> IntArray:
        """Boxes a new track needs for its id: `min_hits`, one more under `sure_score`."""
        p = self.params
        return np.where(scores < p.sure_score, p.min_hits + 1, p.min_hits)

    def _new_ids(self, cams: IntArray) -> IntArray:
        """The next ids of these cameras' new tracks, in order: each camera counts up from 1."""
        ids = np.empty(len(cams), np.int64)
        for k, cam in enumerate(cams.tolist()):
            ids[k] = self._next_id.get(cam, 1)
            self._next_id[cam] = int(ids[k]) + 1
        return ids

    def _remembered(self, row_t: FloatArray) -> BoolArray:
        """Lost tracks past `lost_s`, kept (`recognise_lost_s`) to be known by their looks
        only (their coasting boxes say nothing any more)."""
        with np.errstate(invalid="ignore"):  # (rows of cameras not in the batch: NaN times)
            out: BoolArray = self._tracks.lost & (row_t - self._tracks.last_s > self.params.lost_s)
        return out

    def _duplicates(self, active: BoolArray, row_t: FloatArray) -> BoolArray:
        """Rows to drop: of a tracked and a lost confirmed track of one camera covering the
        same place, the one followed for less time (the reference implementation's rule),
        unless they look unlike each other (a lost track's coasting box over another object)
        or are of two kinds (a class-aware tracker: a lost pedestrian's track held back a
        new one of the car that stood where it was lost, dropped as soon as confirmed)."""
        tracks = self._tracks
        drop = np.zeros(len(tracks), np.bool_)
        confirmed = active & (tracks.ids > 0)
        tracked = _indices(confirmed & ~tracks.lost)
        lost = _indices(confirmed & tracks.lost & ~self._remembered(row_t))
        if not len(tracked) or not len(lost):
            return drop
        iou = box_iou(xywh_to_xyxy(tracks.mean[tracked]), xywh_to_xyxy(tracks.mean[lost]))
        close = iou > DUPLICATE_IOU
        close &= tracks.cams[tracked][:, None] == tracks.cams[lost][None, :]
        if self.params.class_aware:  # (of two kinds: two objects, one before the other)
            close &= tracks.kinds[tracked][:, None] == tracks.kinds[lost][None, :]
        unlike = feature_distance(tracks.feature[tracked], tracks.feature[lost])
        close &= ~(unlike > self.params.appearance_gate)
        a, b = np.nonzero(close)
        age = tracks.last_s - tracks.first_s
        tracked_older = age[tracked[a]] > age[lost[b]]
        drop[lost[b[tracked_older]]] = True
        drop[tracked[a[~tracked_older]]] = True
        return drop

    def _finish(self, det_row: IntArray, drop: BoolArray) -> tuple[IntArray, FloatArray]:
        """Each box's id and velocity, then the dropped tracks removed (ended ones counted)."""
        tracks = self._tracks
        n = len(det_row)
        ids = np.full(n, -1, np.int64)
        velocities = np.full((n, 4), np.nan)
        has = _indices(det_row >= 0)
        rows = det_row[has]
        shown = (tracks.ids[rows] > 0) & ~drop[rows]
        has, rows = has[shown], rows[shown]
        ids[has] = tracks.ids[rows]
        velocities[has] = tracks.velocities(rows)
        for row in _indices(drop & (tracks.ids > 0)).tolist():
            ended = self._ended_s.setdefault(int(tracks.cams[row]), {})
            ended[int(tracks.ids[row])] = float(tracks.last_s[row] - tracks.first_s[row])
        if drop.any():
            tracks.keep(~drop)
        return ids, velocities

    def last_update_s(self, camera: int) -> float | None:
        """The time of the camera's latest detected frame (None: none yet)."""
        return self._last_t.get(camera)

    def predict(self, camera: int, t_s: float) -> Prediction:
        """The camera's confirmed tracks that took a box in its latest frame, moved by their
        motion model to `t_s` (a frame of that camera that was not detected); nothing is
        changed (the next `update` moves them from the latest frame, as if this one never
        came). Lost tracks are not shown: their object was not seen last time. A camera
        with no frame yet has nothing to predict."""
        tr = self._tracks
        last = self._last_t.get(camera)
        rows = _indices((tr.ids > 0) & (tr.cams == camera) & ~tr.lost)
        if last is None or not math.isfinite(t_s):
            rows, last = rows[:0], t_s
        mean = tr.mean[rows]
        xywh = mean[:, :4] + mean[:, 4:8] * (t_s - last)
        xywh[:, 2:] = np.maximum(xywh[:, 2:], 1.0)  # a shrinking box stays a box
        return Prediction(
            xywh_to_xyxy(xywh),
            tr.score[rows].copy(),
            tr.labels[rows].copy(),
            tr.ids[rows].copy(),
            tr.velocities(rows),
        )

    def tracks(self, camera: int) -> tuple[TrackInfo, ...]:
        """A camera's live confirmed tracks (tracked and lost), by id."""
        tr = self._tracks
        rows = _indices((tr.ids > 0) & (tr.cams == camera))
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

    def lifetimes_s(self, camera: int) -> tuple[float, ...]:
        """How long each of a camera's confirmed tracks, ended or live, has lasted (first to
        latest box), in seconds, by track id."""
        lifetimes = dict(self._ended_s.get(camera, {}))
        tr = self._tracks
        for row in _indices((tr.ids > 0) & (tr.cams == camera)).tolist():
            lifetimes[int(tr.ids[row])] = float(tr.last_s[row] - tr.first_s[row])
        return tuple(lifetimes[k] for k in sorted(lifetimes))

    def died_young(self, camera: int) -> int:
        """How many of a camera's tracks ended unconfirmed (a box that got no second one:
        a false positive, or an object whose id would have started later)."""
        return self._died_young.get(camera, 0)

    def ended_count(self, camera: int) -> int:
        """How many of a camera's confirmed tracks have ended (lost for longer than
        `lost_s`, or `recognise_lost_s` for one with looks, or merged)."""
        return len(self._ended_s.get(camera, {}))
