"""The soak's measurements, pure: latency windows, RSS growth, frame accounting, thread
checks, and the pass/fail criteria over them (see scripts/soak.py's docstring)."""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------- pure pieces


@dataclass(frozen=True)
class Criterion:
    """One pass/fail check: what was measured against what was allowed."""

    name: str
    value: str
    limit: str
    passed: bool


# the most of a latency ratio the host's own slowdown may excuse (its drift is 20-30 %)
MAX_HOST_EXCUSE = 1.3


@dataclass(frozen=True)
class LatencyWindows:
    """p99 end-to-end latency of the first and of the last `window_s` of capture time, and
    the p99 of the time the model itself took on those frames (compute start to inference
    done): the host's speed as the model sees it, tail for tail. On a shared host that slows
    down mid-run (the same model on the same batches 15 % slower at minute 8 while the
    process's CPU share stayed put; or slow for the last half minute only, which moves the
    tail and not the median), latency grows with it; `adjusted_ratio` takes that slowdown
    out, so what is left is the pipeline's own growth (queues, leaks, work that grows)."""

    window_s: float
    first_p99_ms: float
    last_p99_ms: float
    first_frames: int
    last_frames: int
    first_model_ms: float = math.nan
    last_model_ms: float = math.nan

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
    (each frame's model time) its p99 in the same windows.

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
    return LatencyWindows(
        window_s=w,
        first_p99_ms=float(np.percentile(first, 99)) if first.size else math.nan,
        last_p99_ms=float(np.percentile(last, 99)) if last.size else math.nan,
        first_frames=int(first.size),
        last_frames=int(last.size),
        first_model_ms=_p99(model, in_first),
        last_model_ms=_p99(model, in_last),
    )


def _p99(values: np.ndarray | None, mask: np.ndarray) -> float:
    if values is None or not mask.any():
        return math.nan
    return float(np.percentile(values[mask], 99))


@dataclass(frozen=True)
class RssGrowth:
    """RSS when warm-up ended and at the last sample of the run, in MB."""

    warmup_s: float
    after_warmup_mb: float
    end_mb: float
    max_mb: float

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.after_warmup_mb


def warmup_s_for(duration_s: float, warmup_s: float | None = None) -> float:
    """The memory warm-up: as given, else the first minute, or the first 10 % of a run
    shorter than 10 minutes."""
    if warmup_s is not None:
        return warmup_s
    return 60.0 if duration_s >= 600.0 else 0.1 * duration_s


def rss_growth(samples: Sequence[tuple[float, float]], *, warmup_s: float) -> RssGrowth:
    """(t_s, rss_mb) samples in time order -> the RSS at the first sample at or after
    `warmup_s` and at the last one.

    Raises:
        ValueError: no sample at or after the warm-up.
    """
    after = [(t, rss) for t, rss in samples if t >= warmup_s]
    if not after:
        last = samples[-1][0] if samples else None
        raise ValueError(f"expected a sample at or after {warmup_s:g} s, the last is at {last}")
    return RssGrowth(
        warmup_s=warmup_s,
        after_warmup_mb=after[0][1],
        end_mb=after[-1][1],
        max_mb=max(rss for _, rss in samples),
    )


@dataclass(frozen=True)
class Accounting:
    """Where one camera's served frames went (see scripts/soak.py's docstring)."""

    camera: str
    served: int  # written by the server to our client's socket(s)
    read: int  # taken from FFmpeg by the decoder thread
    processed: int
    dropped: int
    discarded: int
    connects: int
    tolerance: int  # frames one connection may leave unread in its buffers

    @property
    def unread(self) -> int:
        """Served, never read: in socket / FFmpeg buffers at the stop or at a broken link."""
        return self.served - self.read

    @property
    def pipeline_balanced(self) -> bool:
        """read = processed + dropped + discarded: the pipeline lost no frame it read."""
        return self.read == self.processed + self.dropped + self.discarded

    @property
    def allowed_unread(self) -> int:
        return self.tolerance * max(1, self.connects)

    @property
    def passed(self) -> bool:
        return self.pipeline_balanced and 0 <= self.unread <= self.allowed_unread


@dataclass(frozen=True)
class ThreadCheck:
    """Thread counts around the run: Python threads by name, and the OS's threads by id.

    A native leak is a thread the run started that is still alive after it (`new_os`), not a
    lower count: the served cameras' FFmpeg decoder threads, in the baseline, end for good
    once their clip's first pass is kept (18 of them with 6 cameras on 2 cores), so the
    count after a clean run is below the one before."""

    before_names: tuple[str, ...]
    after_names: tuple[str, ...]
    before_os: int
    after_os: int
    during_max_py: int
    during_max_os: int
    new_os: int = 0  # OS threads alive after the run (in every reading) that were not before

    @property
    def leaked(self) -> list[str]:
        """Python threads alive after the run that were not before it."""
        extra = collections.Counter(self.after_names) - collections.Counter(self.before_names)
        return sorted(extra.elements())

    @property
    def gone(self) -> list[str]:
        """Python threads alive before the run that are not after it."""
        missing = collections.Counter(self.before_names) - collections.Counter(self.after_names)
        return sorted(missing.elements())

    @property
    def passed(self) -> bool:
        return not self.leaked and not self.gone and self.new_os == 0


def criteria(
    *,
    threads: ThreadCheck,
    rss: RssGrowth,
    latency: LatencyWindows,
    accounting: Sequence[Accounting],
    rss_limit_mb: float,
    latency_ratio: float,
    run_status: str,
    threads_not_stopped: Sequence[str],
) -> list[Criterion]:
    """Every pass/fail check of a soak, in the order they are printed."""
    out = [
        Criterion("run completed", run_status, "complete", run_status == "complete"),
        Criterion(
            "pipeline threads stopped",
            ", ".join(threads_not_stopped) or "all",
            "all",
            not threads_not_stopped,
        ),
        Criterion(
            "no thread leak (python)",
            f"before {len(threads.before_names)}, after {len(threads.after_names)}"
            + (f", new {threads.leaked}" if threads.leaked else "")
            + (f", gone {threads.gone}" if threads.gone else ""),
            "after == before",
            not threads.leaked and not threads.gone,
        ),
        Criterion(
            "no thread leak (os)",
            f"before {threads.before_os}, after {threads.after_os}, new {threads.new_os}",
            "new == 0",
            threads.new_os == 0,
        ),
        Criterion(
            "rss growth after warm-up",
            f"{rss.growth_mb:+.1f} MB ({rss.after_warmup_mb:.1f} -> {rss.end_mb:.1f})",
            f"< {rss_limit_mb:g} MB",
            rss.growth_mb < rss_limit_mb,
        ),
        Criterion(
            "p99 latency last / first window, host slowdown out",
            f"{latency.adjusted_ratio:.3f} (raw {latency.ratio:.3f}: {latency.last_p99_ms:.1f} "
            f"/ {latency.first_p99_ms:.1f} ms, {latency.window_s:.0f} s windows; model p99 "
            f"{latency.last_model_ms:.1f} / {latency.first_model_ms:.1f} ms)",
            f"<= {latency_ratio:g}",
            latency.adjusted_ratio <= latency_ratio,  # NaN fails
        ),
    ]
    for a in accounting:
        out.append(
            Criterion(
                f"frames accounted for: {a.camera}",
                f"served {a.served} = processed {a.processed} + dropped {a.dropped} "
                f"+ discarded {a.discarded} + unread {a.unread}",
                f"read balanced, 0 <= unread <= {a.allowed_unread}",
                a.passed,
            )
        )
    return out


def camera_pairs(videos: Sequence[tuple[str, Path]], count: int) -> list[tuple[str, Path]]:
    """`count` (name, video) cameras from the given clips, reusing them in turn when there are
    fewer (a reused clip's camera is named <name>-2, <name>-3, ...)."""
    if not videos or count < 1:
        raise ValueError(f"expected >= 1 clip and >= 1 camera, got {len(videos)} and {count}")
    out = []
    for k, (name, path) in zip(range(count), itertools.cycle(videos)):
        lap = k // len(videos)
        out.append((name if lap == 0 else f"{name}-{lap + 1}", path))
    return out


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
