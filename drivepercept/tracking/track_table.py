"""The state a `ByteTracker` keeps and takes: its tracks as parallel arrays, and one
camera's frame of boxes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.tracking.kalman import xyxy_velocities

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class CameraBoxes:
    """One camera's frame for `ByteTracker.update`.

    Attributes:
        camera: the camera's key (any integer; each camera's tracks are its own).
        xyxy: `(N, 4)` boxes in pixels; ones with NaN or infinite corners or no area are
            ignored (track id -1).
        scores: `(N,)` their scores.
        labels: `(N,)` their class indices.
        t_s: the frame's time in seconds, later than the camera's previous frame's.
        features: `(N, D)` each box's appearance (unit vectors, `appearance.box_features`;
            a row of zeros: none), or None: boxes alone.
    """

    camera: int
    xyxy: FloatArray
    scores: FloatArray
    labels: IntArray
    t_s: float
    features: npt.NDArray[np.float32] | None = None


_COLUMNS = (
    *("cams", "mean", "cov", "ids", "labels", "hits", "first_s", "last_s", "lost", "box"),
    *("score", "feature"),
)


class TrackTable:
    """The tracks of every camera as parallel arrays (one row per track, `cams` its camera),
    so that prediction, association and correction run over a whole batch at once."""

    def __init__(self) -> None:
        self.cams = np.zeros(0, np.int64)
        self.mean = np.zeros((0, 8))
        self.cov = np.zeros((0, 8, 8))
        self.ids = np.zeros(0, np.int64)  # 0: not confirmed yet
        self.labels = np.zeros(0, np.int64)
        self.hits = np.zeros(0, np.int64)
        self.first_s = np.zeros(0)
        self.last_s = np.zeros(0)
        self.lost = np.zeros(0, np.bool_)
        self.box = np.zeros((0, 4))  # the latest box it took, xyxy (its last observation)
        self.score = np.zeros(0)  # that box's score
        # its appearance: a running mean of its boxes' features (unit vector; zeros: none)
        self.feature = np.zeros((0, 0), np.float32)

    def __len__(self) -> int:
        return len(self.ids)

    def append(
        self,
        cams: IntArray,
        mean: FloatArray,
        cov: FloatArray,
        ids: IntArray,
        labels: IntArray,
        t_s: FloatArray,
        box: FloatArray,
        score: FloatArray,
        feature: npt.NDArray[np.float32] | None = None,
    ) -> None:
        n = len(ids)
        hits, lost = np.ones(n, np.int64), np.zeros(n, np.bool_)
        if feature is None:
            feature = np.zeros((n, self.feature.shape[1]), np.float32)
        self.widen_features(feature.shape[1])
        new = (cams, mean, cov, ids, labels, hits, t_s, t_s, lost, box, score, feature)
        for name, rows in zip(_COLUMNS, new, strict=True):
            setattr(self, name, np.concatenate([getattr(self, name), rows]))

    def velocities(self, rows: IntArray) -> FloatArray:
        """`d(x1, y1, x2, y2)/dt` of `rows`; NaN for a track of one box (no motion yet)."""
        velocities = xyxy_velocities(self.mean[rows])
        velocities[self.hits[rows] < 2] = np.nan
        return velocities

    def widen_features(self, dim: int) -> None:
        """Make the feature column `dim` wide (from none: zeros, no appearance yet).

        Raises:
            ValueError: a width other than the one the tracks already have.
        """
        have = self.feature.shape[1]
        if dim and not have:
            self.feature = np.zeros((len(self), dim), np.float32)
        elif dim and dim != have:
            raise ValueError(f"features must have {have} columns, got {dim}")

    def keep(self, mask: BoolArray) -> None:
        for name in _COLUMNS:
            setattr(self, name, getattr(self, name)[mask])


def read_boxes(
    xyxy: object, scores: object, labels: object
) -> tuple[FloatArray, FloatArray, IntArray]:
    """One frame's boxes, scores and labels as float64, float64 and int64 arrays, checked.

    Raises:
        ValueError: mismatched shapes, or labels that are not integers.
    """
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
