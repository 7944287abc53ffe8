"""The soak's latency measurements, pure: p99 end to end in the first and the last window of
capture time, and in the early and the late window on which the model ran as fast (see
scripts/soak.py's docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# the most of a latency ratio the host's own slowdown may excuse (its drift is 20-30 %)
MAX_HOST_EXCUSE = 1.3


# two windows ran on a host of the same speed when the model's p50 and p99 times in them are
# within this factor of each other
SAME_HOST = 1.1
STEP_S = 10.0  # how far apart the sliding windows start


@dataclass(frozen=True)
class Window:
    """One window of capture time: its frames' p99 end to end, and the model's p50 and p99."""

    start_s: float
    end_s: float
    p99_ms: float
    model_p50_ms: float
    model_p99_ms: float
    frames: int

    def same_host(self, other: Window, tolerance: float = SAME_HOST) -> bool:
        """Whether the model ran as fast in both (p50 and p99 within `tolerance`)."""
        pairs = ((self.model_p50_ms, other.model_p50_ms), (self.model_p99_ms, other.model_p99_ms))
        return all(a > 0 and b > 0 and max(a, b) / min(a, b) <= tolerance for a, b in pairs)


@dataclass(frozen=True)
class MatchedPair:
    """The early and the late window furthest apart that ran on a host of the same speed."""

    early: Window
    late: Window

    @property
    def ratio(self) -> float:
        return self.late.p99_ms / self.early.p99_ms if self.early.p99_ms > 0 else math.nan

    @property
    def adjusted_ratio(self) -> float:
        """`ratio` over what is left of a slowdown between the two (at most `SAME_HOST`)."""
        host = self.late.model_p99_ms / self.early.model_p99_ms
        return self.ratio / min(SAME_HOST, max(1.0, host))


def sliding_windows(
    rel_s: np.ndarray, e2e: np.ndarray, model: np.ndarray, *, window_s: float, step_s: float
) -> list[Window]:
    """Windows of `window_s` starting every `step_s` from the first capture, the last one
    ending at the last capture (times in seconds from the first capture)."""
    span_s = float(rel_s.max())
    starts = [*np.arange(0.0, max(0.0, span_s - window_s), step_s).tolist(), span_s - window_s]
    out = []
    for start in starts:
        mask = (rel_s >= start) & (rel_s <= start + window_s)
        if mask.sum() < 2:
            continue
        out.append(
            Window(
                start_s=float(start),
                end_s=float(start) + window_s,
                p99_ms=float(np.percentile(e2e[mask], 99)),
                model_p50_ms=float(np.percentile(model[mask], 50)),
                model_p99_ms=float(np.percentile(model[mask], 99)),
                frames=int(mask.sum()),
            )
        )
    return out


def matched_pair(windows: Sequence[Window], *, span_s: float) -> MatchedPair | None:
    """Of the windows ending in the first third of the span and those starting in the last
    third, the pair furthest apart (the first and the last window when they match) on a host
    of the same speed (`Window.same_host`); None when no such pair exists."""
    early = [w for w in windows if w.end_s <= span_s / 3.0 + 1e-6]
    late = [w for w in windows if w.start_s >= 2.0 * span_s / 3.0 - 1e-6]
    best: MatchedPair | None = None
    for e in early:
        for w in late:
            if not e.same_host(w):
                continue
            if best is None or w.start_s - e.start_s > best.late.start_s - best.early.start_s:
                best = MatchedPair(e, w)
    return best


@dataclass(frozen=True)
class LatencyWindows:
    """p99 end-to-end latency of the first and of the last `window_s` of capture time, and
    the p99 of the time the model itself took on those frames (compute start to inference
    done): the host's speed as the model sees it, tail for tail. On a shared host that slows
    down mid-run (the same model on the same batches 15 % slower at minute 8 while the
    process's CPU share stayed put; or slow for the last half minute only, which moves the
    tail and not the median), latency grows with it; `adjusted_ratio` takes that slowdown
    out, so what is left is the pipeline's own growth (queues, leaks, work that grows).

    Near capacity latency does not grow in proportion to the model's time but far faster
    (queueing): in a CI soak the model's p99 stayed at 43-53 ms for 8.5 minutes and went to
    78 ms in the last 90 s, and latency's p99 went from 54-67 ms to 136 ms, a ratio of 2.4 that
    no division takes out. So the criterion (`steady_ratio`) compares like with like where it
    can: `matched` is the early and the late window furthest apart on which the model ran as
    fast (p50 and p99 within `SAME_HOST`); only without one does it fall back to
    `adjusted_ratio`. A pipeline whose own work grows slows its model in every later window,
    so it finds no match and is judged by the fallback."""

    window_s: float
    first_p99_ms: float
    last_p99_ms: float
    first_frames: int
    last_frames: int
    first_model_ms: float = math.nan
    last_model_ms: float = math.nan
    matched: MatchedPair | None = None

    @property
    def ratio(self) -> float:
        if not self.first_p99_ms > 0:
            return math.nan
        return self.last_p99_ms / self.first_p99_ms

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
        """The criterion: the matched pair's `adjusted_ratio` (latency late over early at the
        same host speed), else `adjusted_ratio` (first and last window)."""
        return self.adjusted_ratio if self.matched is None else self.matched.adjusted_ratio


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
    (each frame's model time) its p99 in the same windows and the matched pair of windows
    (`matched_pair`, over windows starting every `STEP_S`).

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
    matched = None
    if model is not None:
        windows = sliding_windows(rel_s, e2e, model, window_s=w, step_s=STEP_S)
        matched = matched_pair(windows, span_s=span_s)
    return LatencyWindows(
        window_s=w,
        first_p99_ms=float(np.percentile(first, 99)) if first.size else math.nan,
        last_p99_ms=float(np.percentile(last, 99)) if last.size else math.nan,
        first_frames=int(first.size),
        last_frames=int(last.size),
        first_model_ms=_p99(model, in_first),
        last_model_ms=_p99(model, in_last),
        matched=matched,
    )


def _p99(values: np.ndarray | None, mask: np.ndarray) -> float:
    if values is None or not mask.any():
        return math.nan
    return float(np.percentile(values[mask], 99))


def latency_value(latency: LatencyWindows) -> str:
    pair = latency.matched
    first_last = (
        f"first / last {latency.ratio:.3f}: {latency.last_p99_ms:.1f} / "
        f"{latency.first_p99_ms:.1f} ms, model p99 {latency.last_model_ms:.1f} / "
        f"{latency.first_model_ms:.1f} ms"
    )
    if pair is None:
        return f"{latency.steady_ratio:.3f} (no windows matched: host slowdown out of {first_last})"
    return (
        f"{latency.steady_ratio:.3f} ({pair.late.p99_ms:.1f} ms at {pair.late.start_s:.0f}-"
        f"{pair.late.end_s:.0f} s / {pair.early.p99_ms:.1f} ms at {pair.early.start_s:.0f}-"
        f"{pair.early.end_s:.0f} s, model p50 {pair.late.model_p50_ms:.1f} / "
        f"{pair.early.model_p50_ms:.1f} ms, p99 {pair.late.model_p99_ms:.1f} / "
        f"{pair.early.model_p99_ms:.1f} ms; {first_last})"
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
