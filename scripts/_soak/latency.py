"""The soak's latency measurements, pure: p99 end to end in the first and the last window of
capture time, and in the first and the last third of the run over the 10 s bins in which the
model ran at its usual speed (see scripts/soak.py's docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# the most of a latency ratio the host's own slowdown may excuse (its drift is 20-30 %)
MAX_HOST_EXCUSE = 1.3


BIN_S = 10.0  # the host's speed is read per 10 s of capture time
# a bin ran on the run's usual host when the model's mean time in it is within this factor of
# the median over the bins (the mean, not the median: the share of slowed batches, which
# sets latency's tail, moves the mean)
SAME_HOST = 1.1
# the thirds are compared only when at least this share of each third's frames are in usual
# bins (frames, not bins: a run's thirds cut bins, and a sliver of a bin has few frames)
MIN_USUAL = 0.5


def _ratio(later: float, earlier: float) -> float:
    """later / earlier; NaN (a failing criterion) when earlier is not above zero."""
    return later / earlier if earlier > 0 else math.nan


@dataclass(frozen=True)
class Thirds:
    """p99 end to end of the frames of the first and of the last third of the run, taken
    only from the `BIN_S` bins in which the model ran at the run's usual speed (its mean time
    within `SAME_HOST` of `usual_model_ms`, the median over the bins)."""

    usual_model_ms: float
    early_p99_ms: float
    late_p99_ms: float
    early_frames: int  # in usual bins
    late_frames: int
    early_of: int  # in the third
    late_of: int

    @property
    def ratio(self) -> float:
        return _ratio(self.late_p99_ms, self.early_p99_ms)

    @property
    def enough(self) -> bool:
        """At least `MIN_USUAL` of each third's frames came in bins of the usual speed."""
        return (
            self.early_of > 0
            and self.late_of > 0
            and self.early_frames >= MIN_USUAL * self.early_of
            and self.late_frames >= MIN_USUAL * self.late_of
        )


def usual_thirds(rel_s: np.ndarray, e2e: np.ndarray, model: np.ndarray) -> Thirds:
    """`Thirds` of frames captured at `rel_s` seconds from the first capture."""
    span_s = float(rel_s.max())
    bins = np.floor(rel_s / BIN_S).astype(np.int64)
    ids, which = np.unique(bins, return_inverse=True)
    means = np.bincount(which, weights=model) / np.bincount(which)
    usual_ms = float(np.median(means))
    usual_ids = ids[
        np.abs(np.log(np.maximum(means, 1e-9) / max(usual_ms, 1e-9))) <= np.log(SAME_HOST)
    ]
    usual = np.isin(bins, usual_ids)
    early, late = rel_s < span_s / 3.0, rel_s > 2.0 * span_s / 3.0
    e, z = early & usual, late & usual
    return Thirds(
        usual_model_ms=usual_ms,
        early_p99_ms=float(np.percentile(e2e[e], 99)) if e.any() else math.nan,
        late_p99_ms=float(np.percentile(e2e[z], 99)) if z.any() else math.nan,
        early_frames=int(e.sum()),
        late_frames=int(z.sum()),
        early_of=int(early.sum()),
        late_of=int(late.sum()),
    )


@dataclass(frozen=True)
class LatencyWindows:
    """p99 end-to-end latency of the first and of the last `window_s` of capture time, and
    the p99 of the time the model itself took on those frames (compute start to inference
    done): the host's speed as the model sees it, tail for tail. On a shared host that slows
    down mid-run (the same model on the same batches 15 % slower at minute 8 while the
    process's CPU share stayed put; or slow for the last half minute only, which moves the
    tail and not the median), latency grows with it; `adjusted_ratio` takes that slowdown
    out, so what is left is the pipeline's own growth (queues, leaks, work that grows).

    At capacity (six cameras at 15 fps with yolox-nano on this 2-core host) neither window is
    a steady measure. The p99 of a minute is set by a few episodes in which batches take 78
    ms instead of 42 (the same batches cost the engine lanes more CPU time: the host's cores
    run slower) and frames queue behind them: in one steady 10-minute run the minutes' p99
    ranged 85-146 ms while the model's median stayed at 40-47 ms. And a host that slows down
    late inflates latency far beyond the model's own slowdown: in a CI soak the model's p99
    went 46 -> 78 ms in the last 90 s and latency's p99 56 -> 136 ms, where the 8.5 minutes
    before showed no growth. So the criterion (`steady_ratio`) compares the first and the
    last third of the run (a few hundred tail frames each), each taken from the 10 s bins in
    which the model ran at the run's usual speed (`Thirds`); only when too few frames qualify
    does it fall back to `adjusted_ratio`. A pipeline whose own work grows slows its model in
    the late bins, which then do not qualify, and it is judged by the fallback."""

    window_s: float
    first_p99_ms: float
    last_p99_ms: float
    first_frames: int
    last_frames: int
    first_model_ms: float = math.nan
    last_model_ms: float = math.nan
    thirds: Thirds | None = None

    @property
    def ratio(self) -> float:
        return _ratio(self.last_p99_ms, self.first_p99_ms)

    @property
    def host_ratio(self) -> float:
        """The model's p99 time, last window over first (NaN when not measured)."""
        if not self.first_model_ms > 0 or not math.isfinite(self.last_model_ms):
            return math.nan
        return self.last_model_ms / self.first_model_ms

    @property
    def adjusted_ratio(self) -> float:
        """`ratio` over the host's slowdown, at most `MAX_HOST_EXCUSE` (the drift this shared
        host shows; a model 1.5x slower is more likely the pipeline's own doing, threads or
        state it left behind) and never over a speed-up (a host that got faster does not
        excuse growth); `ratio` itself when the model's times are unknown."""
        host = self.host_ratio
        if not math.isfinite(host):
            return self.ratio
        return self.ratio / min(MAX_HOST_EXCUSE, max(1.0, host))

    @property
    def steady_ratio(self) -> float:
        """The criterion: the usual-speed thirds' ratio when each third has enough usual
        frames, else `adjusted_ratio` (the first and the last window)."""
        if self.thirds is not None and self.thirds.enough:
            return self.thirds.ratio
        return self.adjusted_ratio


def window_s_for(span_s: float, window_s: float) -> float:
    """The latency window: `window_s`, or a third of a run too short for two whole windows
    apart from each other (so the first and the last window never overlap)."""
    return min(window_s, span_s / 3.0) if span_s > 0 else window_s


def latency_windows(
    capture_ns: Sequence[int],
    end_to_end_ms: Sequence[float],
    *,
    window_s: float,
    model_ms: Sequence[float] | None = None,
) -> LatencyWindows:
    """p99 of the frames captured in the first and in the last window of the capture span
    (the span runs from the first to the last capture of any camera), and with `model_ms`
    (each frame's model time) its p99 in the same windows and the usual-speed thirds
    (`usual_thirds`).

    Raises:
        ValueError: no frames, or the sequences differ in length.
    """
    if len(capture_ns) != len(end_to_end_ms) or not capture_ns:
        raise ValueError(
            f"expected as many latencies as capture times (> 0), got {len(end_to_end_ms)} "
            f"and {len(capture_ns)}"
        )
    if model_ms is not None and len(model_ms) != len(capture_ns):
        raise ValueError(
            f"expected as many model times as capture times, got {len(model_ms)} "
            f"and {len(capture_ns)}"
        )
    t = np.asarray(capture_ns, dtype=np.int64)
    e2e = np.asarray(end_to_end_ms, dtype=np.float64)
    rel_s = (t - t.min()) / 1e9
    span_s = float(rel_s.max())
    w = window_s_for(span_s, window_s)
    in_first, in_last = rel_s < w, rel_s > span_s - w
    first, last = e2e[in_first], e2e[in_last]
    model = None if model_ms is None else np.asarray(model_ms, dtype=np.float64)
    thirds = None if model is None else usual_thirds(rel_s, e2e, model)
    return LatencyWindows(
        window_s=w,
        first_p99_ms=float(np.percentile(first, 99)) if first.size else math.nan,
        last_p99_ms=float(np.percentile(last, 99)) if last.size else math.nan,
        first_frames=int(first.size),
        last_frames=int(last.size),
        first_model_ms=_p99(model, in_first),
        last_model_ms=_p99(model, in_last),
        thirds=thirds,
    )


def _p99(values: np.ndarray | None, mask: np.ndarray) -> float:
    if values is None or not mask.any():
        return math.nan
    return float(np.percentile(values[mask], 99))


def latency_value(latency: LatencyWindows) -> str:
    """The latency criterion's measured value, as printed."""
    first_last = (
        f"first / last {latency.window_s:.0f} s {latency.ratio:.3f}: "
        f"{latency.last_p99_ms:.1f} / {latency.first_p99_ms:.1f} ms, model p99 "
        f"{latency.last_model_ms:.1f} / {latency.first_model_ms:.1f} ms"
    )
    t = latency.thirds
    if t is None or not t.enough:
        usual = (
            "" if t is None else f"{t.early_frames}/{t.early_of} and {t.late_frames}/{t.late_of} "
        )
        return (
            f"{latency.steady_ratio:.3f} (too few frames at the usual speed {usual}in the thirds: "
            f"host slowdown out of {first_last})"
        )
    return (
        f"{latency.steady_ratio:.3f} (last / first third {t.late_p99_ms:.1f} / "
        f"{t.early_p99_ms:.1f} ms over {t.late_frames}/{t.late_of} and {t.early_frames}/"
        f"{t.early_of} frames in usual-speed {BIN_S:g} s bins, model mean "
        f"{t.usual_model_ms:.1f} ms; "
        f"{first_last})"
    )


def read_latencies(run_dir: Path) -> tuple[list[int], list[float], list[float]]:
    """(capture_ns, end_to_end_ms, model_ms) of every frame of a run, as the report reads
    them; model_ms is compute start to inference done (the batch's model call)."""
    from drivepercept.report import load_run

    timeline = load_run(run_dir).timeline
    model_ms = (timeline.stamps["inference_done"] - timeline.stamps["compute_start"]) / 1e6
    return (
        timeline.stamps["capture"].tolist(),
        timeline.end_to_end_ms.tolist(),
        model_ms.tolist(),
    )
