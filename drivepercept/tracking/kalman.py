"""A constant-velocity Kalman filter over image boxes, stepped by elapsed time.

The state of a box is `(cx, cy, w, h, vcx, vcy, vw, vh)`: its centre and size in pixels, and
their rates in pixels per second. ByteTrack's filter (after DeepSORT) keeps the aspect ratio
instead of the width, with a near-constant prior on it. The width is kept here, as BoT-SORT
does, for two reasons: a car seen from a moving vehicle changes its aspect as it turns or
passes (side view to rear view), which the aspect prior resists; and every corner of the box
is then a linear function of the state, so the box's velocity `d(x1, y1, x2, y2)/dt` and its
uncertainty need no linearisation.

Noise follows ByteTrack's weights (position 1/20 of the box's size, per frame at 30
frames/s) but for two of them:
- a wider prior on a new track's velocity: 1/4 of its size per reference step, against
  ByteTrack's 1/16. Objects crossing a vehicle's side cameras at 15 frames/s move about
  their own width per frame; a track's second box (`TrackParams`'s buffered match) must
  teach it that speed at once, or its third box is missed or taken by another track.
- a velocity that may change faster: 1/40 of the size per reference step, against
  ByteTrack's 1/160. Seen from a moving vehicle, an object's image velocity is not constant:
  it speeds up across the picture as it comes closer (perspective) and turns as the road
  bends. With 1/160 the filter's velocity lagged by several frames, and that velocity is
  what the pipeline answers a frame it did not detect with, and what a streaming consumer
  moves the boxes on by (`velocities`). On the sample rig, boxes one frame old moved on by
  it score 0.185 mAP@.5:.95 against 0.162 with 1/160 (`eval --streaming --forecast`); on
  two other simulated drives 0.316 against 0.306 and 0.305 against 0.266. The tracks
  themselves were as good or better (HOTA 0.553 against 0.545 on the sample rig, 0.535 on
  both on a 20 s crossing drive).

A step is a time `dt_s`, not a frame: frames that a live camera dropped make one longer step.
The process noise is a random walk, so its variance grows in proportion to
`dt_s / reference_frame_s`; one step of exactly `reference_frame_s` is ByteTrack's step
(with velocities in pixels per second instead of per frame).

Every function works on a batch of tracks at once: means `(T, 8)`, covariances `(T, 8, 8)`.
Pure numpy; no state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError

FloatArray = npt.NDArray[np.float64]

# 0.95 quantile of the chi-square distribution with 4 degrees of freedom: a box measurement
# whose squared Mahalanobis distance to a track (`gating_distance`) exceeds this is, at 95 %
# confidence, not that track's box.
CHI2_95_4DOF = 9.4877
_MIN_SIZE_PX = 1.0  # the noise scale's floor: a degenerate predicted box keeps a usable noise


def xyxy_to_xywh(xyxy: FloatArray) -> FloatArray:
    """Corner boxes `(N, 4)` -> centre and size `(cx, cy, w, h)`."""
    out = np.empty_like(xyxy, dtype=np.float64)
    out[:, 2:] = xyxy[:, 2:] - xyxy[:, :2]
    out[:, :2] = xyxy[:, :2] + 0.5 * out[:, 2:]
    return out


def xywh_to_xyxy(xywh: FloatArray) -> FloatArray:
    """Centre and size boxes `(N, 4)` (or the first four columns of states) -> corners."""
    half = 0.5 * xywh[:, 2:4]
    return np.concatenate([xywh[:, :2] - half, xywh[:, :2] + half], axis=1)


def xyxy_velocities(mean: FloatArray) -> FloatArray:
    """The corners' velocity `d(x1, y1, x2, y2)/dt` (pixels per second) of states `(T, 8)`."""
    half = 0.5 * mean[:, 6:8]
    return np.concatenate([mean[:, 4:6] - half, mean[:, 4:6] + half], axis=1)


@dataclass(frozen=True)
class BoxKalman:
    """The filter's constants; its methods are pure functions over batches of tracks.

    Args:
        std_position: position noise, as a fraction of the box's size (per reference step).
        std_velocity: velocity noise, as a fraction of the box's size per reference step.
        std_initial_velocity: a new track's velocity prior, in the same unit.
        reference_frame_s: the step the weights were tuned for (ByteTrack: 30 frames/s).
    """

    std_position: float = 1.0 / 20.0
    std_velocity: float = 1.0 / 40.0
    std_initial_velocity: float = 1.0 / 4.0
    reference_frame_s: float = 1.0 / 30.0

    def __post_init__(self) -> None:
        names = ("std_position", "std_velocity", "std_initial_velocity", "reference_frame_s")
        for name in names:
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")

    def _sizes(self, mean: FloatArray) -> FloatArray:
        """`(w, h, w, h)` of each state `(T, 4)`, floored, the scale of every noise."""
        wh = np.maximum(mean[:, 2:4], _MIN_SIZE_PX)
        return np.concatenate([wh, wh], axis=1)

    def initiate(self, xywh: FloatArray) -> tuple[FloatArray, FloatArray]:
        """New tracks from their first boxes `(N, 4)`: at rest, with a wide velocity prior.

        Returns:
            means `(N, 8)` and covariances `(N, 8, 8)`.
        """
        n = len(xywh)
        mean = np.zeros((n, 8))
        mean[:, :4] = xywh
        size = self._sizes(mean)
        std = np.concatenate(
            [
                2.0 * self.std_position * size,
                self.std_initial_velocity * size / self.reference_frame_s,
            ],
            axis=1,
        )
        cov = np.zeros((n, 8, 8))
        diag = np.arange(8)
        cov[:, diag, diag] = std**2
        return mean, cov

    def predict(
        self, mean: FloatArray, cov: FloatArray, dt_s: float | FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """States `dt_s` seconds later: positions move by their velocities; the covariance
        grows by the motion and by process noise in proportion to `dt_s`.

        Args:
            mean: states `(T, 8)`.
            cov: their covariances `(T, 8, 8)`.
            dt_s: the elapsed time, one for all or one per state `(T,)`.

        Returns:
            new means `(T, 8)` and covariances `(T, 8, 8)` (the inputs are not changed).
        """
        dt = np.broadcast_to(np.asarray(dt_s, np.float64), (len(mean),))
        if not (dt >= 0).all():
            raise ValueError(f"dt_s must be >= 0, got {dt_s!r}")
        size = self._sizes(mean)
        q = np.concatenate(
            [
                (self.std_position * size) ** 2,
                (self.std_velocity * size / self.reference_frame_s) ** 2,
            ],
            axis=1,
        )
        new_mean = mean.copy()
        new_mean[:, :4] += dt[:, None] * mean[:, 4:]
        # F P F^T for F = [[I, dt I], [0, I]], by blocks (P = [[A, B], [B^T, C]]): a few
        # elementwise operations instead of two batched matrix products
        d = dt[:, None, None]
        a, b, c = cov[:, :4, :4], cov[:, :4, 4:], cov[:, 4:, 4:]
        bt = b.transpose(0, 2, 1)
        dc = d * c
        new_cov = np.empty_like(cov)
        new_cov[:, :4, :4] = a + d * (b + bt) + d * dc
        new_cov[:, :4, 4:] = b + dc
        new_cov[:, 4:, :4] = bt + dc
        new_cov[:, 4:, 4:] = c
        diag = np.arange(8)
        new_cov[:, diag, diag] += (dt / self.reference_frame_s)[:, None] * q
        return new_mean, new_cov

    def project(self, mean: FloatArray, cov: FloatArray) -> tuple[FloatArray, FloatArray]:
        """The states as measurements would see them: boxes `(T, 4)` and their covariance
        `(T, 4, 4)`, measurement noise included."""
        size = self._sizes(mean)
        s = cov[:, :4, :4].copy()
        diag = np.arange(4)
        s[:, diag, diag] += (self.std_position * size) ** 2
        return mean[:, :4].copy(), s

    def update(
        self, mean: FloatArray, cov: FloatArray, xywh: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """Correct each state `(T, 8)` with its own measured box `xywh[t]` `(T, 4)`.

        Returns:
            the corrected means `(T, 8)` and covariances `(T, 8, 8)`.
        """
        projected, s = self.project(mean, cov)
        # gain K = P H^T S^-1 = (S^-1 H P)^T (S and P symmetric); H P is P's first 4 rows
        hp = cov[:, :4, :]
        gain = np.linalg.solve(s, hp).transpose(0, 2, 1)  # (T, 8, 4)
        innovation = xywh - projected
        new_mean = mean + np.einsum("tij,tj->ti", gain, innovation)
        new_cov = cov - gain @ hp
        new_cov = 0.5 * (new_cov + new_cov.transpose(0, 2, 1))  # keep it symmetric
        return new_mean, new_cov

    def gating_distance(self, mean: FloatArray, cov: FloatArray, xywh: FloatArray) -> FloatArray:
        """Squared Mahalanobis distance of every box `(N, 4)` to every track `(T, 8)`:
        `(T, N)`; compare with `CHI2_95_4DOF` to gate unlikely pairs out of an association."""
        if len(mean) == 0 or len(xywh) == 0:
            return np.zeros((len(mean), len(xywh)))
        projected, s = self.project(mean, cov)
        d = xywh[None, :, :] - projected[:, None, :]  # (T, N, 4)
        solved = np.linalg.solve(s, d.transpose(0, 2, 1))  # (T, 4, N)
        distance: FloatArray = np.einsum("tnk,tkn->tn", d, solved)
        return distance
