"""`Detections`: the boxes found in one camera frame, as parallel arrays (supervision's
shape), with the identities tracking gives them where it ran."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.types.model_input import FloatArray

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def moved_boxes(
    xyxy: npt.ArrayLike,
    velocities: npt.ArrayLike | None,
    dt_s: float,
    size: tuple[float, float] | None = None,
) -> tuple[npt.NDArray[np.float64], BoolArray]:
    """Boxes `(N, 4)` moved on by their velocities (`(N, 4)`, pixels per second of x1, y1,
    x2, y2) over `dt_s` seconds; a box whose velocity has a NaN (no track, or a track of one
    box) stays where it was. With `size` (width, height) the boxes are clipped to the image.

    Returns:
        the boxes (float64) and which of them still have an area (a box moved wholly out of
        the image has none: a consumer drops it).
    """
    boxes = np.array(xyxy, np.float64).reshape(-1, 4)
    if velocities is not None:
        v = np.asarray(velocities, np.float64).reshape(-1, 4)
        known = np.isfinite(v).all(axis=1)
        boxes[known] += v[known] * dt_s
    if size is not None:
        boxes = np.clip(boxes, 0.0, [size[0], size[1], size[0], size[1]])
    kept: BoolArray = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return boxes, kept


@dataclass(frozen=True, eq=False)
class Detections:
    """Boxes found in one frame: parallel arrays, boxes in original-frame pixels.

    Tracking (`drivepercept.tracking`) adds, per box: `track_ids`, its track in its camera
    (-1: a box no track took); `velocities`, how its xyxy moves, pixels per second (its
    track's motion model; NaN where unknown); `global_ids`, its object across the rig's
    cameras (-1: not placed on the ground). Each is None where that step did not run.
    `predicted`: the frame was not detected, and its boxes are its tracks' moved on to its
    time by the tracker (their scores those of each track's latest detected box).
    """

    xyxy: FloatArray  # (N, 4)
    scores: FloatArray  # (N,)
    labels: IntArray  # (N,) indices into class_names
    class_names: tuple[str, ...] = ()
    track_ids: IntArray | None = None  # (N,)
    velocities: FloatArray | None = None  # (N, 4)
    global_ids: IntArray | None = None  # (N,)
    predicted: bool = False  # the tracker's boxes for a frame that was not detected

    def __post_init__(self) -> None:
        n = len(self.scores)
        if self.xyxy.shape != (n, 4):
            raise ValueError(f"xyxy must have shape ({n}, 4), got {self.xyxy.shape}")
        if self.labels.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {self.labels.shape}")
        for name, shape in (("track_ids", (n,)), ("velocities", (n, 4)), ("global_ids", (n,))):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {value.shape}")

    @classmethod
    def empty(cls, class_names: tuple[str, ...] = (), *, predicted: bool = False) -> Detections:
        return cls(
            np.zeros((0, 4), np.float32),
            np.zeros(0, np.float32),
            np.zeros(0, np.int64),
            class_names,
            predicted=predicted,
        )

    def __len__(self) -> int:
        return len(self.scores)

    def __getitem__(self, mask: npt.NDArray[np.bool_] | IntArray) -> Detections:
        """Numpy-style selection (boolean mask or index array) -> a new Detections."""

        def pick(a: npt.NDArray[np.generic] | None) -> npt.NDArray[np.generic] | None:
            return None if a is None else a[mask]

        return Detections(
            self.xyxy[mask],
            self.scores[mask],
            self.labels[mask],
            self.class_names,
            track_ids=pick(self.track_ids),  # type: ignore[arg-type]
            velocities=pick(self.velocities),  # type: ignore[arg-type]
            global_ids=pick(self.global_ids),  # type: ignore[arg-type]
            predicted=self.predicted,
        )

    def moved_on(self, dt_s: float, size: tuple[float, float] | None = None) -> Detections:
        """These boxes `dt_s` seconds later, each moved on by its velocity: what a consumer
        holding this frame's answer should use at a later moment, since the world moved on
        while the answer was made (`moved_boxes`; boxes without a velocity stay, and without
        tracking all do). With `size` (width, height) boxes are clipped to the image, and
        one moved wholly out of it is left out (with its other columns).

        Raises:
            ValueError: `dt_s` not finite.
        """
        if not math.isfinite(dt_s):
            raise ValueError(f"dt_s must be finite, got {dt_s!r}")
        boxes, kept = moved_boxes(self.xyxy, self.velocities, dt_s, size)
        return dataclasses.replace(self[kept], xyxy=boxes[kept].astype(self.xyxy.dtype))

    @property
    def names(self) -> list[str]:
        """Class name of each box."""
        return [
            self.class_names[i] if 0 <= i < len(self.class_names) else str(i)
            for i in self.labels.tolist()
        ]

    def __repr__(self) -> str:
        tracked = "" if self.track_ids is None else ", tracked"
        predicted = ", predicted" if self.predicted else ""
        return f"Detections(n={len(self)}{tracked}{predicted})"
