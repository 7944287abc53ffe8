"""The soak's latency measurements, pure: p99 end to end, and p99 of the pipeline's own part
of it, in the first and the last third of the run and in its first and last window of capture
time; the model's time per batch in the same parts (see scripts/soak.py's docstring).

Each frame's end-to-end latency is split in two:

* the engine's time: the model's call on the frame's batch (compute start -> inference done)
  and the time the frame, once queued, waited for the engine to finish the batches before it
  (`behind_ms`; not the report's `engine_wait` span, batched -> copy start). Both are the
  model's speed, and on a shared host that is the host's
  speed: the same batches cost the engine lanes more CPU time when the host's cores run
  slower (docs/LIVE.md).
* the pipeline's own part, the rest: decoding, queueing, waiting for the other cameras'
  frames, preparing the batch, post-processing. `emitted` is stamped as a batch's results
  are ready to be handed on (by the engine; with a tracking stage, which the soak has not,
  after it), so the sinks' time is not in any latency, end to end included: a 0-10 ms delay
  injected after the engine's stamp changed nothing measured.

At capacity (six cameras at 15 fps with yolox-nano on this 2-core host: a batch every 67 ms,
one batch at a time, 42 ms usually but 78 ms on the host's slow episodes) a frame that comes
while a slow batch runs waits for it and is slow itself: a few percent of slow batches more
or less move the end-to-end p99 between about 90 and 150 ms. In one CI soak the model's p99
went up 11 % in the last minute and latency's p99 40 % (112 -> 156 ms); in steady local runs
the minutes' p99 ranged 85-146 ms at one model speed. The pipeline's own part does not
queue behind the model: its p99 per minute stayed at 13-22 ms in every 10-minute run
measured on a quiet host. It is Python work on the same cores, though, and runs slower when
they do. So the criteria are the model's mean time per batch, last third over first, within
the drift this host shows (an engine that slows down by the pipeline's doing shows there),
and the own part's p99, last third over first, divided by that slowdown (a pipeline whose
queues, state or per-frame work grow shows there). End to end is measured and printed, not
judged."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # the run's modules load only when a run is read
    from drivepercept.telemetry.stats import FloatArray, IntArray

# the most the model's mean time per batch may drift, last third over first: this shared
# host's cores run 10-30 % slower for minutes at a time; more is likelier the pipeline's doing
MODEL_DRIFT = 1.3


def _ratio(later: float, earlier: float) -> float:
    """later / earlier; NaN (a failing criterion) when earlier is not above zero."""
    return later / earlier if earlier > 0 else math.nan


@dataclass(frozen=True)
class Part:
    """The latency figures of the frames captured in one part of the run (NaN: none, or the
    model's times not given)."""

    frames: int
    p99_ms: float  # end to end
    own_p99_ms: float  # end to end less the engine's time
    model_mean_ms: float  # the model's call on the frame's batch
    model_p99_ms: float


@dataclass(frozen=True)
class LatencyWindows:
    """The first and the last `window_s` of capture time (the issue's minute) and the first
    and the last third of the run. The criteria are `steady_ratio` and `model_ratio`."""

    window_s: float
    first: Part
    last: Part
    early: Part  # the first third
    late: Part  # the last third

    @property
    def ratio(self) -> float:
        """End to end p99, the last window over the first (printed, not judged)."""
        return _ratio(self.last.p99_ms, self.first.p99_ms)

    @property
    def thirds_ratio(self) -> float:
        """End to end p99, the last third over the first (printed, not judged)."""
        return _ratio(self.late.p99_ms, self.early.p99_ms)

    @property
    def own_ratio(self) -> float:
        """p99 of the pipeline's own part, the last third over the first."""
        return _ratio(self.late.own_p99_ms, self.early.own_p99_ms)

    @property
    def model_ratio(self) -> float:
        """The criterion on the engine: the model's mean time per batch, the last third over
        the first (the mean: the share of slow batches moves it)."""
        return _ratio(self.late.model_mean_ms, self.early.model_mean_ms)

    @property
    def steady_ratio(self) -> float:
        """The criterion on the pipeline: `own_ratio` over the host's slowdown (`model_ratio`,
        at most `MODEL_DRIFT`, never a speed-up: a host that got faster excuses nothing).
        The own part is Python work on the same cores as the model: its p99 per 10 s rose by
        1.2-1.7 % for each 1 % the model's mean did, in three 10-minute runs (weakly:
        correlation 0.23-0.38). Without the model's times, `own_ratio`."""
        host = self.model_ratio
        if not math.isfinite(host):
            return self.own_ratio
        return self.own_ratio / min(MODEL_DRIFT, max(1.0, host))


def window_s_for(span_s: float, window_s: float) -> float:
    """The latency window: `window_s`, or a third of a run too short for two whole windows
    apart from each other (so the first and the last window never overlap)."""
    return min(window_s, span_s / 3.0) if span_s > 0 else window_s


def behind_ms(
    batch_index: npt.ArrayLike,
    queued_ns: npt.ArrayLike,
    compute_start_ns: npt.ArrayLike,
    inference_done_ns: npt.ArrayLike,
) -> np.ndarray:
    """Per frame, how long it waited, from being queued to its batch's compute start, for the
    engine to finish the batches before its own (those of lower index; a batch is done at its
    inference done): min(compute start, the latest of their ends) - queued, at least 0."""
    b = np.asarray(batch_index, dtype=np.int64)
    queued = np.asarray(queued_ns, dtype=np.int64)
    start = np.asarray(compute_start_ns, dtype=np.int64)
    done = np.asarray(inference_done_ns, dtype=np.int64)
    if not b.size == queued.size == start.size == done.size:
        raise ValueError(
            f"expected one stamp of each per frame, got {b.size}, {queued.size}, "
            f"{start.size} and {done.size}"
        )
    if not b.size:
        return np.zeros(0)
    ids, pos = np.unique(b, return_inverse=True)
    batch_done = np.zeros(ids.size, dtype=np.int64)
    np.maximum.at(batch_done, pos, done)
    # the latest end of the batches before each batch (the first has none: it waits for none)
    before = np.concatenate(([0], np.maximum.accumulate(batch_done)[:-1]))
    free_ns = np.where(pos > 0, before[pos], queued)
    return np.maximum(np.minimum(start, free_ns) - queued, 0) / 1e6


def _part(mask: np.ndarray, e2e: np.ndarray, own: np.ndarray, model: np.ndarray | None) -> Part:
    if not mask.any():
        return Part(0, math.nan, math.nan, math.nan, math.nan)
    m = model[mask] if model is not None else None
    return Part(
        frames=int(mask.sum()),
        p99_ms=float(np.percentile(e2e[mask], 99)),
        own_p99_ms=float(np.percentile(own[mask], 99)),
        model_mean_ms=math.nan if m is None else float(m.mean()),
        model_p99_ms=math.nan if m is None else float(np.percentile(m, 99)),
    )


def latency_windows(
    capture_ns: npt.ArrayLike,
    end_to_end_ms: npt.ArrayLike,
    *,
    window_s: float,
    model_ms: npt.ArrayLike | None = None,
    wait_ms: npt.ArrayLike | None = None,
) -> LatencyWindows:
    """The figures of the frames captured in the first and the last window and third of the
    capture span (from the first to the last capture of any camera). A frame's own part is
    its end to end less `model_ms` and `wait_ms` (each frame's model call and wait behind the
    batches before, `behind_ms`), at least 0; without them, its end to end.

    Raises:
        ValueError: no frames, or the sequences differ in length.
    """
    t = np.asarray(capture_ns, dtype=np.int64)
    e2e = np.asarray(end_to_end_ms, dtype=np.float64)
    if t.size != e2e.size or not t.size:
        raise ValueError(
            f"expected as many latencies as capture times (> 0), got {e2e.size} and {t.size}"
        )
    model = None if model_ms is None else np.asarray(model_ms, dtype=np.float64)
    wait = None if wait_ms is None else np.asarray(wait_ms, dtype=np.float64)
    for name, values in (("model times", model), ("engine waits", wait)):
        if values is not None and values.size != t.size:
            raise ValueError(
                f"expected as many {name} as capture times, got {values.size} and {t.size}"
            )
    engine = np.zeros_like(e2e) if model is None else model.copy()
    if wait is not None:
        engine += wait
    own = np.maximum(e2e - engine, 0.0)
    rel_s = (t - t.min()) / 1e9
    span_s = float(rel_s.max())
    w = window_s_for(span_s, window_s)
    return LatencyWindows(
        window_s=w,
        first=_part(rel_s < w, e2e, own, model),
        last=_part(rel_s > span_s - w, e2e, own, model),
        early=_part(rel_s < span_s / 3.0, e2e, own, model),
        late=_part(rel_s > 2.0 * span_s / 3.0, e2e, own, model),
    )


def latency_value(latency: LatencyWindows) -> str:
    """The latency criterion's measured value, as printed."""
    e, z = latency.early, latency.late
    return (
        f"{latency.steady_ratio:.3f} ({z.own_p99_ms:.1f} / {e.own_p99_ms:.1f} ms = "
        f"{latency.own_ratio:.3f}, over the host's slowdown x{latency.model_ratio:.3f}; end to "
        f"end, not judged: thirds {latency.thirds_ratio:.3f}, {z.p99_ms:.1f} / {e.p99_ms:.1f} ms, "
        f"last / first {latency.window_s:.0f} s {latency.ratio:.3f}, "
        f"{latency.last.p99_ms:.1f} / {latency.first.p99_ms:.1f} ms)"
    )


def model_value(latency: LatencyWindows) -> str:
    """The model criterion's measured value, as printed."""
    e, z = latency.early, latency.late
    return (
        f"{latency.model_ratio:.3f} (mean {z.model_mean_ms:.1f} / {e.model_mean_ms:.1f} ms, "
        f"p99 {z.model_p99_ms:.1f} / {e.model_p99_ms:.1f} ms)"
    )


def read_latencies(run_dir: Path) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
    """(capture_ns, end_to_end_ms, model_ms, wait_ms) of every frame of a run, as the report
    reads them: model_ms is the timeline's `inference` span (compute start -> inference done,
    the batch's model call), wait_ms the frame's wait behind the batches before (`behind_ms`)."""
    from drivepercept.report import load_run
    from drivepercept.telemetry.timeline import STAGE_SPANS

    timeline = load_run(run_dir).timeline
    stamps = timeline.stamps
    inference = next(span for span in STAGE_SPANS if span.name == "inference")
    wait_ms = behind_ms(
        timeline.batch_index, stamps["queued"], stamps["compute_start"], stamps["inference_done"]
    )
    return stamps["capture"], timeline.end_to_end_ms, timeline.span(inference), wait_ms
