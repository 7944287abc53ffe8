"""Associating boxes with tracks: IoU, widened boxes and the assignment that only pairs what
is worth pairing (ByteTrack's rule). Pure numpy and scipy; no state."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def box_iou(a: FloatArray, b: FloatArray) -> FloatArray:
    """IoU of every box in `a` `(T, 4)` with every box in `b` `(N, 4)`, xyxy: `(T, N)`.
    A box of no area overlaps nothing (IoU 0)."""
    size_a = np.maximum(a[:, 2:] - a[:, :2], 0.0)
    size_b = np.maximum(b[:, 2:] - b[:, :2], 0.0)
    area_a, area_b = size_a[:, 0] * size_a[:, 1], size_b[:, 0] * size_b[:, 1]
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.maximum(iw, 0.0) * np.maximum(ih, 0.0)
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
    a pair below `min_iou` is never taken and a pair is taken only if it costs no more than
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
    # unmatched: half the limit per side, and a hair more, so that a pair at exactly
    # `min_iou` is taken here as it is above when nothing competes
    cost = np.full((t + n, n + t), 0.5 * limit + 1e-9)
    cost[:t, :n] = np.where(ok, 1.0 - iou[np.ix_(rows, cols)], limit + 1.0)
    cost[t:, n:] = 0.0
    r, c = linear_sum_assignment(cost)
    keep = (r < t) & (c < n)
    r, c = r[keep], c[keep]
    keep = ok[r, c]
    return rows[r[keep]], cols[c[keep]]
