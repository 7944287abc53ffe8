"""The road: a centre line of straight and gently curving segments, and its cross-section.

Everything on the road is placed in road coordinates (s, d): s is the arc length along the
centre line in metres, d the signed lateral offset (positive to the left of the direction of
increasing s). Traffic drives on the right: our direction (increasing s) uses d < 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

LANE_WIDTH_M = 3.5
FORWARD_LANES = 3  # with the direction of travel, d < 0
ONCOMING_LANES = 2  # against it, d > 0
BIKE_LANE_M = 1.5
SIDEWALK_M = 3.0

RIGHT_EDGE_D = -FORWARD_LANES * LANE_WIDTH_M  # -10.5
LEFT_EDGE_D = ONCOMING_LANES * LANE_WIDTH_M  # 7.0
RIGHT_BIKE_D = (RIGHT_EDGE_D - BIKE_LANE_M, RIGHT_EDGE_D)
LEFT_BIKE_D = (LEFT_EDGE_D, LEFT_EDGE_D + BIKE_LANE_M)
RIGHT_SIDEWALK_D = (RIGHT_BIKE_D[0] - SIDEWALK_M, RIGHT_BIKE_D[0])
LEFT_SIDEWALK_D = (LEFT_BIKE_D[1], LEFT_BIKE_D[1] + SIDEWALK_M)


def forward_lane_d(index: int) -> float:
    """Centre offset of our-direction lane `index` (0 = next to the centre line)."""
    return -(index + 0.5) * LANE_WIDTH_M


def oncoming_lane_d(index: int) -> float:
    """Centre offset of oncoming lane `index` (0 = next to the centre line)."""
    return (index + 0.5) * LANE_WIDTH_M


@dataclass(frozen=True, eq=False)
class Road:
    """A sampled centre line; poses between samples are interpolated.

    Attributes:
        s_m: arc-length samples, increasing, 1 m apart.
        x_m, y_m: centre-line position at each sample.
        heading_rad: direction of increasing s at each sample (continuous, not wrapped).
    """

    s_m: FloatArray
    x_m: FloatArray
    y_m: FloatArray
    heading_rad: FloatArray

    @classmethod
    def generate(cls, rng: np.random.Generator, *, s_min_m: float, s_max_m: float) -> Road:
        """Random straight and curved segments (radius 250-900 m) covering [s_min_m, s_max_m]."""
        step = 1.0
        s = np.arange(math.floor(s_min_m), math.ceil(s_max_m) + step, step)
        curvature = np.zeros_like(s)
        start = s[0]
        while start < s[-1]:
            length = float(rng.uniform(80.0, 260.0))
            if rng.random() < 0.5:
                radius = float(rng.uniform(250.0, 900.0))
                kappa = (1.0 if rng.random() < 0.5 else -1.0) / radius
                curvature[(s >= start) & (s < start + length)] = kappa
            start += length
        return cls.from_curvature(s, curvature)

    @classmethod
    def from_curvature(cls, s_m: FloatArray, curvature_per_m: FloatArray) -> Road:
        """The centre line whose curvature (1 / radius, positive turning left) at each of the
        samples `s_m` (1 m apart) is given; the world origin and heading 0 lie at s = 0."""
        s, curvature, step = s_m, curvature_per_m, 1.0
        heading = np.concatenate([[0.0], np.cumsum(curvature[:-1] * step)])
        mid_heading = heading + 0.5 * curvature * step
        dx = np.cos(mid_heading) * step
        dy = np.sin(mid_heading) * step
        x = np.concatenate([[0.0], np.cumsum(dx[:-1])])
        y = np.concatenate([[0.0], np.cumsum(dy[:-1])])
        # Put the world origin where s = 0 lies.
        i0 = int(np.argmin(np.abs(s)))
        return cls(s_m=s, x_m=x - x[i0], y_m=y - y[i0], heading_rad=heading - heading[i0])

    def curvature_per_m(self, s_m: FloatArray | float) -> FloatArray:
        """Curvature of the centre line (1 / radius, positive turning left) at `s_m`."""
        kappa = np.gradient(self.heading_rad, self.s_m)
        return np.asarray(np.interp(s_m, self.s_m, kappa), dtype=np.float64)

    @classmethod
    def straight(cls, *, s_min_m: float = -500.0, s_max_m: float = 500.0) -> Road:
        """A straight road along the world x axis (s = x, d = y); handy for tests."""
        s = np.arange(s_min_m, s_max_m + 1.0, 1.0)
        return cls(s_m=s, x_m=s.copy(), y_m=np.zeros_like(s), heading_rad=np.zeros_like(s))

    def pose(
        self, s_m: FloatArray | float, d_m: FloatArray | float
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """World (x, y, heading) of road points (s, d); arrays broadcast together.

        Outside the sampled range the ends are extended as straight lines.
        """
        s = np.asarray(s_m, dtype=np.float64)
        d = np.asarray(d_m, dtype=np.float64)
        s0, s1 = self.s_m[0], self.s_m[-1]
        sc = np.clip(s, s0, s1)
        heading = np.interp(sc, self.s_m, self.heading_rad)
        x = np.interp(sc, self.s_m, self.x_m) + (s - sc) * np.cos(heading)
        y = np.interp(sc, self.s_m, self.y_m) + (s - sc) * np.sin(heading)
        x = x - d * np.sin(heading)
        y = y + d * np.cos(heading)
        return x, y, heading

    def band_quads(
        self, s_start_m: float, s_end_m: float, d0_m: float, d1_m: float, step_m: float
    ) -> FloatArray:
        """Ground quads (N, 4, 3) covering s in [start, end] and d in [d0, d1], step_m long."""
        s = np.arange(s_start_m, s_end_m + 1e-9, step_m)
        if s.size < 2:
            return np.zeros((0, 4, 3))
        return self.patch_quads(s[:-1], s[1:], np.full(s.size - 1, d0_m), np.full(s.size - 1, d1_m))

    def patch_quads(
        self, s0: FloatArray, s1: FloatArray, d0: FloatArray, d1: FloatArray
    ) -> FloatArray:
        """Ground quads (N, 4, 3) for patches [s0, s1] x [d0, d1], counter-clockwise from above."""
        corners_s = np.stack([s0, s1, s1, s0], axis=1)
        corners_d = np.stack([d0, d0, d1, d1], axis=1)
        x, y, _ = self.pose(corners_s, corners_d)
        return np.stack([x, y, np.zeros_like(x)], axis=-1)
