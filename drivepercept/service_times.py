"""The engine's service time as the deadline scheduler sees it: each model batch's rows and
compute time, measured as the run goes (the engine adds them), and an estimate for a batch
of any size: a line through the latest batches, less those that stalled, scaled by how far
the latest ones ran over it (at most 4-fold), so that a machine that turns slow (another
process, throttling) is seen within a few batches. A stalled batch (over 5 times its size's
median) scales the next estimates through the overrun, for 8 batches, but stays out of the
line: it is not taken for the machine's new pace. (A real slowdown of over 5 times joins
the line once it is its size's median.)
"""

from __future__ import annotations

import collections
import threading

import numpy as np

SERVICE_SAMPLES = 24  # model batches the service-time line is fitted over
RECENT_SAMPLES = 8  # of them, the latest, whose overrun scales the line
STALLED = 5.0  # a batch over this many times the median of its size stalled: not in the line
COLD_WARM_UP = 0.5  # a run's first batch under this share of the warm-up's estimate drops it


class ServiceTimes:
    """The engine's model batches as measured (rows, ns): an estimate of the next one's
    compute time for a number of rows. Thread-safe (the engine adds, the batcher reads)."""

    def __init__(self) -> None:
        # (rows, ns, whether the warm-up's)
        self._samples: collections.deque[tuple[int, int, bool]] = collections.deque(
            maxlen=SERVICE_SAMPLES
        )
        self._lock = threading.Lock()
        self._real = 0  # the run's own batches measured
        # (intercept, slope, overrun factor) fitted to the samples, until the next `add`:
        # the batcher asks for estimates every few milliseconds while the engine is busy
        self._line: tuple[float, float, float] | None = None

    def add(self, rows: int, ns: int, *, provisional: bool = False) -> None:
        """A model batch of `rows` that took `ns`. `provisional` ones (the warm-up's) give a
        first estimate and stay among the run's first `RECENT_SAMPLES` batches (one or two
        of those alone are noise: on the 2-core host under load the first 3-row batch took
        39 ms, the next ones 43-70, the warm-up's 57), unless the run's first batch comes in
        under `COLD_WARM_UP` of their estimate: a model's first calls on a machine still
        starting a run can take several times its steady time (490 ms for six rows against
        100 ms, in `eval --streaming` on the 2-core host), and kept they held every smaller
        batch out for a run."""
        if rows <= 0 or ns <= 0:
            return
        cold = not provisional and self._real == 0 and ns < COLD_WARM_UP * self.estimate_ns(rows)
        with self._lock:
            if provisional:  # the warm-up's second call at a size replaces its first (set-up)
                kept = [sample for sample in self._samples if not (sample[2] and sample[0] == rows)]
                self._samples.clear()
                self._samples.extend(kept)
            else:
                self._real += 1
                if cold or self._real == RECENT_SAMPLES + 1:  # (warm-up's: the first kept)
                    kept = [sample for sample in self._samples if not sample[2]]
                    self._samples.clear()
                    self._samples.extend(kept)
            self._samples.append((rows, ns, provisional))
            self._line = None

    def largest_recent(self) -> int:
        """The most rows of the latest `RECENT_SAMPLES` batches (0: none measured)."""
        with self._lock:
            return max((s[0] for s in list(self._samples)[-RECENT_SAMPLES:]), default=0)

    def estimate_ns(self, rows: int) -> float:
        """The compute time of a batch of `rows`: the line through the kept batches (rows,
        time) but those that stalled (`STALLED`), scaled by the largest overrun of the
        latest ones over it; 0 with none. One stalled batch (500 ms against 10) in the line
        took every estimate up 13-fold for its 24 batches, and as nothing fitted in the
        budget then, only the starvation bound's batches ran: seconds of it."""
        if rows <= 0:
            return 0.0
        with self._lock:
            if self._line is None and self._samples:
                self._line = _fit(list(self._samples))
            line = self._line
        if line is None:
            return 0.0
        intercept, slope, factor = line
        return (intercept + slope * rows) * factor


def _fit(samples: list[tuple[int, int, bool]]) -> tuple[float, float, float]:
    """`ServiceTimes.estimate_ns`'s line through `samples` (none empty): its intercept and
    slope, and the factor of the latest ones' overrun over it."""
    d = np.array([s[0] for s in samples], np.float64)
    t = np.array([s[1] for s in samples], np.float64)
    sizes, where = np.unique(d, return_inverse=True)
    typical = np.array([np.median(t[where == k]) for k in range(len(sizes))])
    usual = t <= STALLED * typical[where]  # (a batch that stalled: not the line's)
    du, tu = d[usual], t[usual]
    intercept, slope = 0.0, float((tu / du).mean())
    if len(np.unique(du)) >= 2:
        slope, intercept = (float(v) for v in np.polyfit(du, tu, 1))
        if slope < 0:  # noise: a flat line
            slope, intercept = 0.0, float(tu.mean())
        elif intercept < 0:  # through the origin
            slope, intercept = float((tu * du).sum() / (du * du).sum()), 0.0
    fitted = np.maximum(intercept + slope * d, 1.0)
    overrun = float((t / fitted)[-RECENT_SAMPLES:].max())
    return intercept, slope, min(max(overrun, 0.5), 4.0)
