"""Time order for a replay's batches: which cameras' waiting frames make the next batch, so
that the frames of one batch are less than one frame period apart by their own times (stamp,
else pts). The batcher (`batching.Batcher`, `align=True`) asks `TimeAligner.choose` each
batch; see its module docstring for why a replay needs it."""

from __future__ import annotations

import collections
import threading

import numpy as np

from drivepercept.types import FrameMeta, source_time_ns

# heads farther apart than this are on clocks that do not run together (a recording's
# cameras stamped by different clocks): that batch takes them all, as without alignment
ALIGN_MAX_SPAN_NS = 10_000_000_000
_DEFAULT_PERIOD_NS = 100_000_000  # the tolerance before any camera's frame period is known
_PERIODS_KEPT = 8  # a camera's period: the median of its latest intervals
# detection interval: a camera's frame this long after its previous one is detected (a
# reconnect or a stall: the tracks the tracker would move on are stale)
DETECT_AFTER_GAP_NS = 1_000_000_000
SPREADS_KEPT = 100_000  # batches whose time spread the run's figures are taken over


class TimeAligner:
    """Which cameras' waiting frames make a batch in time order (see the module docstring):
    those less than one frame period after the earliest waiting frame. The period is the
    shortest of the cameras' own (the median of each one's latest frame intervals), so one
    batch never takes two frames' worth of one camera's time. Frames without a time, or
    heads too far apart to be one clock, are all taken (no alignment is possible)."""

    def __init__(self) -> None:
        self._last_ns: dict[int, int] = {}
        self._intervals: dict[int, list[int]] = {}

    def period_ns(self) -> int:
        """The tolerance now: the shortest camera period seen, else 100 ms."""
        periods = [sorted(v)[len(v) // 2] for v in self._intervals.values() if v]
        return min(periods) if periods else _DEFAULT_PERIOD_NS

    def choose(self, heads: dict[int, int | None]) -> list[int]:
        """Of the cameras with a frame waiting (camera -> that frame's source time), those
        to take now, in camera order."""
        cams = sorted(heads)
        times = [heads[c] for c in cams]
        if not cams or any(t is None for t in times):
            chosen = cams
        else:
            known = [t for t in times if t is not None]
            first = min(known)
            if max(known) - first > ALIGN_MAX_SPAN_NS:
                chosen = cams
            else:
                limit = first + self.period_ns()
                chosen = [c for c, t in zip(cams, known, strict=True) if t < limit]
        for cam in chosen:
            t = heads[cam]
            if t is None:
                continue
            last = self._last_ns.get(cam)
            if last is not None and 0 < t - last <= ALIGN_MAX_SPAN_NS:
                kept = self._intervals.setdefault(cam, [])
                kept.append(t - last)
                del kept[:-_PERIODS_KEPT]
            self._last_ns[cam] = t
        return chosen


class Spreads:
    """Each batch's spread of its frames' own times (stamp or pts), the latest
    `SPREADS_KEPT` batches: how far apart the instants of one batch are (run.json's
    `source_spread_ms`). Thread-safe: the batcher adds, the pipeline reads."""

    def __init__(self) -> None:
        self._ms: collections.deque[float] = collections.deque(maxlen=SPREADS_KEPT)
        self._lock = threading.Lock()

    def add(self, metas: list[FrameMeta]) -> None:
        """A batch's frames (left out unless every one has a time)."""
        times = [source_time_ns(m.stamp_ns, m.pts_s) for m in metas]
        known = [t for t in times if t is not None]
        if len(known) == len(times):
            with self._lock:
                self._ms.append((max(known) - min(known)) / 1e6)

    def figures(self) -> dict[str, float] | None:
        """p50 / p99 / max ms over the batches kept; None before any batch with times."""
        with self._lock:
            spreads = np.array(self._ms, dtype=np.float64)
        if not spreads.size:
            return None
        p50, p99 = np.percentile(spreads, (50, 99))
        return {"p50": float(p50), "p99": float(p99), "max": float(spreads.max())}


def after_gap(t: int | None, last: int | None) -> bool:
    """A frame over `DETECT_AFTER_GAP_NS` from its camera's previous one (either way: a
    reconnect, a stall): its camera's tracks are stale, so the model sees it."""
    return t is not None and last is not None and abs(t - last) > DETECT_AFTER_GAP_NS
