"""Latency and throughput statistics: small pure functions over arrays, each tested by hand.

Percentiles interpolate linearly between the two closest ranks (numpy's default, the same
method as Triton's perf_analyzer reports use): the p95 of [10, 20, 30, 40, 50] is 48.0.
An empty input gives a count of 0 and NaN statistics (written as null in JSON), never a made-up
zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


@dataclass(frozen=True)
class LatencyStats:
    """Summary of a set of durations in milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self, digits: int = 3) -> dict[str, float | int | None]:
        """JSON-ready: NaN becomes None (null)."""
        out: dict[str, float | int | None] = {"count": self.count}
        for key in ("mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "max_ms"):
            value = float(getattr(self, key))
            out[key] = None if math.isnan(value) else round(value, digits)
        return out


def latency_stats(values_ms: Sequence[float] | FloatArray) -> LatencyStats:
    """count, mean, p50, p90, p95, p99 and max of durations in milliseconds."""
    arr = np.asarray(values_ms, dtype=np.float64).ravel()
    if arr.size == 0:
        nan = float("nan")
        return LatencyStats(0, nan, nan, nan, nan, nan, nan)
    p50, p90, p95, p99 = (float(v) for v in np.percentile(arr, PERCENTILES))
    return LatencyStats(
        count=int(arr.size),
        mean_ms=float(arr.mean()),
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
        max_ms=float(arr.max()),
    )


def span_ms(start_ns: IntArray, end_ns: IntArray) -> FloatArray:
    """Element-wise duration end - start, in milliseconds."""
    return (np.asarray(end_ns, dtype=np.int64) - np.asarray(start_ns, dtype=np.int64)) / 1e6


def rate_fps(count: int, first_ns: int, last_ns: int) -> float:
    """Events per second over [first, last]; 0.0 for an empty or zero-length span."""
    span_s = (last_ns - first_ns) / 1e9
    return count / span_s if count and span_s > 0 else 0.0


# windows of one throughput series at most: a longer span gets wider windows (a run folder
# whose capture times span 54 years would otherwise ask for 1.7e9 one-second windows)
MAX_WINDOWS = 10_000


@dataclass(frozen=True)
class Windows:
    """Event rate in consecutive time windows: window k covers [start_s[k], start_s[k] + width)."""

    start_s: FloatArray  # window starts, seconds after the reference time
    counts: IntArray
    rate_per_s: FloatArray  # counts / the window's length (the last window may be shorter)
    width_s: float = 1.0  # the windows' width (`window_width_s`: wider than asked on a long span)


def window_width_s(span_ns: int, window_s: float) -> float:
    """The width of the windows `windowed_rate` cuts a span into: `window_s`, or, where the
    span holds more than `MAX_WINDOWS` of them, the smallest 1-2-5 multiple of it (2, 5, 10,
    20, ...) that holds it in `MAX_WINDOWS` or fewer. What a report says its windows are.

    Raises:
        ValueError: `window_s` is not a finite number > 0.
    """
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be > 0, got {window_s}")
    factor = span_ns / (MAX_WINDOWS * window_s * 1e9)
    if factor <= 1:
        return window_s
    decade = 10.0 ** math.floor(math.log10(factor))
    step = next(m for m in (1, 2, 5, 10) if m * decade >= factor)
    return window_s * step * decade


def windowed_rate(
    times_ns: IntArray | Sequence[int], *, origin_ns: int, end_ns: int, window_s: float = 1.0
) -> Windows:
    """How many events fall in each window from origin to end, and their rate: windows of
    `window_s`, wider on a long span (`window_width_s`: never more than about `MAX_WINDOWS`
    of them, whatever the stamps say; `width_s` is the width used).

    The last window is cut at `end_ns`; its rate divides by its real length, so a run that
    ends 0.2 s into a window does not look slow. Events outside [origin, end] are ignored.
    """
    span_ns = int(end_ns) - int(origin_ns)
    width_s = window_width_s(max(span_ns, 0), window_s)
    if span_ns <= 0:
        return Windows(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0), width_s)
    width_ns = max(1, round(width_s * 1e9))
    n = max(1, math.ceil(span_ns / width_ns))
    times = np.asarray(times_ns, dtype=np.int64)
    times = times[(times >= origin_ns) & (times <= end_ns)]
    # offsets from the origin as unsigned: exact even where the span overflows int64
    offsets = times.view(np.uint64) - np.uint64(int(origin_ns) % 2**64)
    index = np.minimum(offsets // np.uint64(width_ns), n - 1).astype(np.int64)
    counts = np.bincount(index, minlength=n).astype(np.int64)
    lengths_s = np.full(n, width_ns / 1e9)
    lengths_s[-1] = (span_ns - (n - 1) * width_ns) / 1e9
    rate = np.divide(counts, lengths_s, out=np.zeros(n, dtype=np.float64), where=lengths_s > 0)
    start_s = np.arange(n, dtype=np.float64) * (width_ns / 1e9)
    return Windows(start_s=start_s, counts=counts, rate_per_s=rate, width_s=width_s)


def frame_index_gaps(frame_indices: IntArray | Sequence[int]) -> int:
    """Frames missing from one camera's processed frame indices (source frames start at 0).

    Counts the indices below the first processed one and the holes between processed ones;
    frames dropped after the last processed one cannot be seen here. Duplicates are ignored.
    """
    idx = np.unique(np.asarray(frame_indices, dtype=np.int64))
    if idx.size == 0:
        return 0
    return int(idx[-1] + 1 - idx.size)


@dataclass(frozen=True)
class DeadlineMisses:
    budget_ms: float
    frames: int
    misses: int

    @property
    def rate(self) -> float:
        """Share of frames over budget (0.0 with no frames)."""
        return self.misses / self.frames if self.frames else 0.0


def deadline_misses(values_ms: Sequence[float] | FloatArray, budget_ms: float) -> DeadlineMisses:
    """Frames whose latency is strictly over the budget (exactly on budget is in time)."""
    if not budget_ms > 0:
        raise ValueError(f"budget_ms must be > 0, got {budget_ms}")
    arr = np.asarray(values_ms, dtype=np.float64)
    return DeadlineMisses(
        budget_ms=budget_ms, frames=int(arr.size), misses=int((arr > budget_ms).sum())
    )


@dataclass(frozen=True)
class BatchFill:
    """How full the batches were: cameras per batch against the rig's camera count."""

    batches: int
    cameras: int
    mean_size: float
    full_share: float  # batches holding every camera
    size_counts: dict[int, int]  # batch size -> how many batches


def batch_fill(
    batch_index: IntArray | Sequence[int], batch_size: IntArray | Sequence[int], *, cameras: int
) -> BatchFill:
    """Batch fill from per-frame rows (batch_index, batch_size): one entry per distinct batch."""
    idx = np.asarray(batch_index, dtype=np.int64)
    size = np.asarray(batch_size, dtype=np.int64)
    if idx.size == 0:
        return BatchFill(0, cameras, float("nan"), float("nan"), {})
    _, first = np.unique(idx, return_index=True)
    sizes = size[first]
    values, counts = np.unique(sizes, return_counts=True)
    return BatchFill(
        batches=int(sizes.size),
        cameras=cameras,
        mean_size=float(sizes.mean()),
        full_share=float((sizes >= cameras).mean()),
        size_counts={int(v): int(c) for v, c in zip(values, counts, strict=True)},
    )


def capture_spread_ms(
    batch_index: IntArray | Sequence[int], capture_ns: IntArray | Sequence[int]
) -> FloatArray:
    """Per batch (in batch-index order): latest minus earliest capture time of its frames, ms.

    How far apart in time the cameras' pictures in one batch were taken; a one-frame batch
    has a spread of 0.
    """
    cap = np.asarray(capture_ns, dtype=np.int64)
    return _batch_ranges(np.asarray(batch_index, dtype=np.int64), cap) / 1e6


def source_spread_ms(
    batch_index: IntArray | Sequence[int], source_s: FloatArray | Sequence[float]
) -> FloatArray:
    """Per batch (in batch-index order): latest minus earliest of its frames' own times
    (stamp or pts, seconds), ms: how far apart the instants a batch's frames show are, which
    a rig step treats as one. Batches with a frame of no finite time are left out."""
    idx = np.asarray(batch_index, dtype=np.int64)
    t = np.asarray(source_s, dtype=np.float64)
    keep = ~np.isin(idx, idx[~np.isfinite(t)])
    return _batch_ranges(idx[keep], t[keep]) * 1e3


def _batch_ranges(idx: IntArray, values: npt.NDArray[Any]) -> FloatArray:
    """Per batch (in batch-index order): its largest value minus its smallest."""
    if idx.size == 0:
        return np.zeros(0)
    order = np.lexsort((values, idx))
    idx, values = idx[order], values[order]
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    ends = np.r_[starts[1:], idx.size] - 1
    return np.asarray(values[ends] - values[starts], dtype=np.float64)


def recent_window(
    emitted_and_latency: Sequence[tuple[int, float]], *, now_ns: int, window_s: float
) -> tuple[float, float]:
    """(frames/s, p95 latency ms) of the frames emitted in the last `window_s` before now.

    Input: (emitted_ns, latency_ms) pairs, oldest first. p95 is NaN with no frame in the window.
    """
    since = now_ns - int(window_s * 1e9)
    lat = [ms for t, ms in emitted_and_latency if since < t <= now_ns]
    if not lat:
        return 0.0, float("nan")
    return len(lat) / window_s, float(np.percentile(np.asarray(lat, dtype=np.float64), 95))


class LatencyHistogram:
    """Bounded-memory latency percentiles for runs of any length (live mode runs for hours).

    Log-spaced buckets from `min_ms` to `max_ms`, each `resolution` wider than the last
    (1 % by default: about 1,400 buckets, 11 KB), so a percentile read back is the upper edge
    of its bucket: at most 1 % above the exact value. Values outside the range land in the
    end buckets; the exact maximum and count are kept. Not thread-safe (the pipeline holds
    its lock).
    """

    def __init__(
        self, *, min_ms: float = 0.1, max_ms: float = 100_000.0, resolution: float = 0.01
    ) -> None:
        self._log_min = math.log(min_ms)
        self._log_step = math.log1p(resolution)
        n = math.ceil((math.log(max_ms) - self._log_min) / self._log_step) + 1
        self._counts = np.zeros(n, dtype=np.int64)
        self._edges = np.exp(self._log_min + self._log_step * np.arange(1, n + 1))
        self.count = 0
        self.max_ms = float("nan")

    def add(self, value_ms: float) -> None:
        k = int((math.log(value_ms) - self._log_min) / self._log_step) if value_ms > 0 else 0
        self._counts[min(max(k, 0), self._counts.size - 1)] += 1
        self.count += 1
        if not value_ms <= self.max_ms:  # also replaces the initial NaN
            self.max_ms = value_ms

    def to_json(self) -> dict[str, Any]:
        """The buckets that hold frames, as {"bucket index": count}, with the count and maximum:
        what a histogram from another process needs to be merged here (`merge`)."""
        nonzero = np.flatnonzero(self._counts)
        return {
            "resolution": round(math.expm1(self._log_step), 9),
            "min_ms": round(math.exp(self._log_min), 9),
            "buckets": {str(int(k)): int(self._counts[k]) for k in nonzero},
            "count": self.count,
            "max_ms": None if self.count == 0 else self.max_ms,
        }

    def merge(self, data: Mapping[str, Any]) -> None:
        """Add a histogram written by `to_json` (same bucket layout) to this one: the merged
        percentiles are those of all the frames together, not an average of percentiles.

        Raises:
            ValueError: another bucket layout, or a damaged record.
        """
        same = math.isclose(float(data["resolution"]), math.expm1(self._log_step), rel_tol=1e-6)
        if not (same and math.isclose(float(data["min_ms"]), math.exp(self._log_min))):
            raise ValueError("latency histograms with other buckets cannot be merged")
        buckets = {int(k): int(v) for k, v in dict(data["buckets"]).items()}
        if any(not 0 <= k < self._counts.size or v < 0 for k, v in buckets.items()):
            raise ValueError("latency histogram record has buckets out of range")
        if sum(buckets.values()) != int(data["count"]):
            raise ValueError("latency histogram record's count is not the sum of its buckets")
        for k, v in buckets.items():
            self._counts[k] += v
        self.count += int(data["count"])
        top = data.get("max_ms")
        if top is not None and not float(top) <= self.max_ms:
            self.max_ms = float(top)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), as its bucket's upper edge (capped at the maximum)."""
        if self.count == 0:
            return float("nan")
        rank = max(1, math.ceil(q / 100.0 * self.count))
        k = int(np.searchsorted(np.cumsum(self._counts), rank))
        return float(min(self._edges[k], self.max_ms))
