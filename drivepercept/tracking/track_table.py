"""The state a `ByteTracker` keeps and takes: its tracks as parallel arrays, and one
camera's frame of boxes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.tracking.kalman import xyxy_velocities
from drivepercept.tracking.track_types import TrackParams

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
        kinds: `(N,)` each box's kind (any integers; `TrackParams.same_kind`): a class-aware
            tracker lets a track go on with a box of another label of its kind, at a cost.
            None: each label its own kind.
    """

    camera: int
    xyxy: FloatArray
    scores: FloatArray
    labels: IntArray
    t_s: float
    features: npt.NDArray[np.float32] | None = None
    kinds: IntArray | None = None

    def kinds_or_labels(self, labels: IntArray) -> IntArray:
        """`kinds` as int64, checked against the boxes (`labels`: theirs, read), else them.

        Raises:
            ValueError: kinds that are not integers, one per box.
        """
        if self.kinds is None:
            return labels
        kinds = np.asarray(self.kinds)
        if kinds.shape != labels.shape or (
            len(kinds) and not np.issubdtype(kinds.dtype, np.integer)
        ):
            raise ValueError(
                f"kinds must be {labels.shape[0]} integers, got {kinds.dtype} {kinds.shape}"
            )
        return kinds.astype(np.int64, copy=False)


class KindKeys:
    """Class names to their kinds' keys for `CameraBoxes.kinds` (`TrackParams.same_kind`:
    names of one group share a key), each name looked up once; one per tracker, so that
    its keys mean the same kind from frame to frame."""

    def __init__(self, params: TrackParams) -> None:
        self._params = params
        self._by_name: dict[str, int] = {}
        self._by_kind: dict[str, int] = {}

    def __call__(self, names: Sequence[str]) -> IntArray:
        """`(N,)` the keys of `names`' kinds."""
        return np.array([self._key(n) for n in names], np.int64).reshape(-1)

    def _key(self, name: str) -> int:
        key = self._by_name.get(name)
        if key is None:
            kinds = self._by_kind
            key = self._by_name[name] = kinds.setdefault(self._params.kind_of(name), len(kinds))
        return key


_COLUMNS = (
    *("cams", "mean", "cov", "ids", "labels", "hits", "first_s", "last_s", "lost", "box"),
    *("score", "feature", "kinds"),
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
        self.kinds = np.zeros(0, np.int64)  # its latest box's kind (`CameraBoxes.kinds`)
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
        kinds: IntArray | None = None,
    ) -> None:
        n = len(ids)
        hits, lost = np.ones(n, np.int64), np.zeros(n, np.bool_)
        if feature is None:
            feature = np.zeros((n, self.feature.shape[1]), np.float32)
        self.widen_features(feature.shape[1])
        kinds = labels if kinds is None else kinds
        new = (cams, mean, cov, ids, labels, hits, t_s, t_s, lost, box, score, feature, kinds)
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


def batch_features(
    table: TrackTable, frames: Sequence[CameraBoxes], counts: list[int]
) -> npt.NDArray[np.float32]:
    """The batch's box features `(N, D)` (frames without any: rows of zeros), the track
    table widened to them; `(N, 0)` where no frame and no track has any."""
    if any(f.features is not None and np.ndim(f.features) != 2 for f in frames):
        raise ValueError("features must be 2-D, (boxes, width)")
    dims = {f.features.shape[1] for f in frames if f.features is not None}
    dims.discard(0)
    if len(dims) > 1:
        raise ValueError(f"every frame's features must have one width, got {sorted(dims)}")
    dim = dims.pop() if dims else table.feature.shape[1]
    table.widen_features(dim)
    parts = []
    for f, n in zip(frames, counts, strict=True):
        if f.features is None or not f.features.shape[1]:
            parts.append(np.zeros((n, dim), np.float32))
        elif f.features.shape != (n, dim):
            raise ValueError(f"features must have shape ({n}, {dim}), got {f.features.shape}")
        elif not np.isfinite(f.features).all():
            raise ValueError("features must be finite numbers")
        else:
            parts.append(np.asarray(f.features, np.float32))
    return np.concatenate(parts) if parts else np.zeros((0, dim), np.float32)
