"""The tracker's value types: its settings (`TrackParams`), what it says of a frame's boxes
(`TrackUpdate`), of a frame it did not see (`Prediction`) and of a live track (`TrackInfo`),
and what the tracking stage did over a run (`TrackingSummary`). Frozen; no numpy work of
their own."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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
        sure_score: a new track whose latest box scores under this needs one box more
            than `min_hits` (0: none does). On the crossing drives a track confirmed on
            boxes the detector was unsure of was most often a second id for an object:
            a duplicate box's track, or a restart its lost track would have taken.
        class_aware: a box only joins a track of its own label, or of another label of its
            kind (`same_kind`) at `class_change_cost`.
        same_kind: groups of class names a detector takes one object for now one, now
            another: a pedestrian's box that comes out as a cyclist's for a few frames (on
            the crossing drives, a track held on the low-score cyclist box while the sure
            pedestrian box started a second id). Only with the boxes' kinds
            (`CameraBoxes.kinds`, which the tracking stage gives from the class names).
        class_change_cost: in both associations, a pair of two labels of one kind has
            this taken off the IoU its threshold tests (0.2: a change of class needs an
            overlap of 0.4 where one of its own label needs 0.2); finding a lost track
            again (`recover_*`, `recognise_*`) takes a box of its kind as one of its label.
        recover_iou: least IoU, on widened boxes, of a lost track and a high-score box the
            first association left over (`recover_buffer`).
        recover_buffer: lost tracks are found again on boxes widened by this fraction of
            their size on each side, the track's box the better of its prediction and its
            last box moved on (OC-SORT's observation-centric recovery); 0: not at all.
        new_track_overlap: a box covering a box of its frame that a track took (IoU above
            this) starts no track (the detector's second class for one object); 1: any may.

    Appearance (boxes with features, `appearance.box_features`; a tracker given none
    tracks by motion alone and these do nothing):
        appearance_gate: a box never joins a track that looks more unlike it than this
            (cosine distance of their features, 0 to 2).
        appearance_weight: in both associations, pairs that overlap at least `match_iou`
            gain this times how alike they look (1 alike, 0 at the gate) on the IoU their
            thresholds test: the low-score pass's 0.5 (`second_match_iou`) is met by a weak
            box at IoU 0.2 that looks just like its track.
        appearance_momentum: a track's appearance is this much its own, the rest its
            newest high-score box's (0: only the newest).
        recognise_distance: a lost track is known again (its looks, not its motion) by a
            high-score box left over that looks at most this unlike it ...
        recognise_buffer: ... lands within reach (both boxes widened by this much of their
            size on each side overlap; 0: not at all) ...
        recognise_area_ratio: ... and is of like size (areas within this factor).
        recognise_lost_s: how long a lost track with an appearance is kept to be known
            again (at least `lost_s`; past `lost_s` only its looks find it).
    """

    high_score: float = 0.5
    low_score: float = 0.1
    new_track_score: float = 0.6
    match_iou: float = 0.2
    second_match_iou: float = 0.5
    unconfirmed_match_iou: float = 0.3
    unconfirmed_buffer: float = 1.0
    lost_s: float = 1.5
    min_hits: int = 2
    sure_score: float = 0.7
    class_aware: bool = True
    same_kind: tuple[tuple[str, ...], ...] = (("pedestrian", "cyclist"),)
    class_change_cost: float = 0.2
    recover_iou: float = 0.25
    recover_buffer: float = 1.5
    new_track_overlap: float = 0.7
    appearance_gate: float = 0.2
    appearance_weight: float = 0.3
    appearance_momentum: float = 0.9
    recognise_distance: float = 0.1
    recognise_buffer: float = 8.0
    recognise_area_ratio: float = 4.0
    recognise_lost_s: float = 3.0

    def __post_init__(self) -> None:
        high = self.high_score
        ranges = {  # name -> (least, most, whether the least is allowed, said as)
            "high_score": (0.0, 1.0, True, "in [0, 1]"),
            "low_score": (0.0, high, True, f"in [0, high_score={high:g}]"),
            "new_track_score": (high, 1.0, True, f"in [high_score={high:g}, 1]"),
            "sure_score": (0.0, 1.0, True, "in [0, 1]"),
            "match_iou": (0.0, 1.0, False, "in (0, 1]"),
            "second_match_iou": (0.0, 1.0, False, "in (0, 1]"),
            "unconfirmed_match_iou": (0.0, 1.0, False, "in (0, 1]"),
            "unconfirmed_buffer": (0.0, 10.0, True, "in [0, 10]"),
            "lost_s": (0.0, math.inf, True, ">= 0 seconds"),
            "class_change_cost": (0.0, 1.0, True, "in [0, 1]"),
            "recover_iou": (0.0, 1.0, False, "in (0, 1]"),
            "recover_buffer": (0.0, 10.0, True, "in [0, 10]"),
            "new_track_overlap": (0.0, 1.0, False, "in (0, 1]"),
            "appearance_gate": (0.0, 2.0, False, "in (0, 2]"),
            "appearance_weight": (0.0, 10.0, True, "in [0, 10]"),
            "appearance_momentum": (0.0, 1.0, True, "in [0, 1]"),
            "recognise_distance": (0.0, 2.0, False, "in (0, 2]"),
            "recognise_buffer": (0.0, 100.0, True, "in [0, 100]"),
            "recognise_area_ratio": (1.0, math.inf, True, ">= 1"),
            "recognise_lost_s": (0.0, math.inf, True, ">= 0 seconds"),
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
        groups = self.same_kind
        if not isinstance(groups, tuple) or not all(
            isinstance(g, tuple) and all(isinstance(n, str) for n in g) for g in groups
        ):
            raise ConfigError(f"same_kind must be a tuple of tuples of class names, got {groups!r}")
        names = [n for g in groups for n in g]
        if len(set(names)) != len(names):
            raise ConfigError(f"same_kind: a class name in two groups, got {groups!r}")

    def kind_of(self, class_name: str) -> str:
        """The kind a class name is of (`same_kind`'s group's first name, else its own)."""
        return next((g[0] for g in self.same_kind if class_name in g), class_name)


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
class Prediction:
    """A camera's tracked objects moved on to a frame that was not detected: the boxes the
    tracker expects there, parallel arrays.

    Attributes:
        xyxy: `(N, 4)` each track's box at the frame's time (its motion model's mean).
        scores: `(N,)` the score of each track's latest box.
        labels: `(N,)` their classes.
        track_ids: `(N,)` their ids (confirmed tracks only, each > 0).
        velocities: `(N, 4)` as `TrackUpdate`'s.
    """

    xyxy: FloatArray
    scores: FloatArray
    labels: IntArray
    track_ids: IntArray
    velocities: FloatArray

    def __post_init__(self) -> None:
        n = len(self.track_ids)
        shapes = {"xyxy": (n, 4), "scores": (n,), "labels": (n,), "velocities": (n, 4)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {getattr(self, name).shape}")

    def __len__(self) -> int:
        return len(self.track_ids)


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


@dataclass(frozen=True)
class CameraTracks:
    """One camera's tracks over a run: how many, and how long they lasted (seconds)."""

    tracks: int
    lifetime_median_s: float
    lifetime_max_s: float
    unconfirmed_died: int = 0  # tracks that ended before their id (one box, no second)


@dataclass(frozen=True)
class TrackingSummary:
    """What tracking did in a run: per camera its tracks, and the rig's objects."""

    cameras: dict[str, CameraTracks]
    rig_objects: int
    placed: bool  # whether the rig had geometry to place objects (else per camera only)
    frames: int = 0  # camera frames tracked
    ms_per_frame: float = 0.0  # the stage's own time per camera frame (wall clock)
    cpu_ms_per_frame: float = 0.0  # the CPU its thread spent in it, per camera frame
