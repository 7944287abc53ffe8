"""Running counts of a pipeline's results, and the statistics a run ends with.

`RunCounters` is a consumer of results like any sink: the completion thread hands it every
batch after the sinks, and any thread may read it. It keeps bounded state only (a live run
may go on for hours): per camera a frame count, a log-bucket latency histogram (1 % wide),
the last `RECENT_FRAMES` (emission time, latency) pairs for the last-second figures, and the
first capture and last emission times. Exact per-frame figures are in frames.csv.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from drivepercept.telemetry.stats import LatencyHistogram, recent_window
from drivepercept.types import CameraSnapshot, FrameResult, WarmupRun

RECENT_FRAMES = 512  # per camera, for the last-second fps and p95


@dataclass(frozen=True)
class CameraStats:
    """Per-camera outcome of a run."""

    name: str
    frames: int
    dropped: int
    fps: float  # frames over the camera's own span, first capture to last emission
    latency_ms: dict[str, float]  # p50 / p95 / p99 (within 1 %) / max end-to-end
    short_by: int = 0  # frames its container announced that could not be decoded
    undecodable: int = 0  # frames skipped mid-video (damaged), the later ones read
    discarded: int = 0  # read, neither emitted nor dropped: still in flight at a hard stop
    read: int = 0  # frames read from the source; of them, decoded and prepared for the model
    decoded: int = 0
    prepared: int = 0
    predicted: int = 0  # frames the model did not see, answered by the tracker


@dataclass(frozen=True)
class RunStats:
    """Outcome of a run: what was processed, how fast, and how it ended."""

    cameras: tuple[CameraStats, ...]
    elapsed_s: float
    frames: int
    batches: int
    partial_batches: int
    interrupted: bool
    threads_not_stopped: tuple[str, ...]
    device: str
    mean_batch_size: float
    queue_high_water: tuple[int, ...] = field(default=())
    warmup: tuple[WarmupRun, ...] = ()  # the engine's warm-up batches (not in the figures)
    in_flight_high_water: int = 0  # most batches launched on the device and not yet finished
    failed_batches: int = 0  # batches the model raised on: set aside, their frames unanswered
    failed_frames: int = 0
    batch_error: str | None = None  # the last such error, one line
    # p50 / p99 / max ms of the batches' spreads of their frames' own times (stamp or pts)
    source_spread_ms: dict[str, float] | None = None

    @property
    def throughput_fps(self) -> float:
        return self.frames / self.elapsed_s if self.elapsed_s > 0 else 0.0


def histogram_percentiles_ms(h: LatencyHistogram) -> dict[str, float]:
    """p50 / p95 / p99 (within 1 %) / max of a latency histogram (NaN with no frame)."""
    if h.count == 0:
        nan = float("nan")
        return {"p50": nan, "p95": nan, "p99": nan, "max": nan}
    return {
        "p50": h.percentile(50),
        "p95": h.percentile(95),
        "p99": h.percentile(99),
        "max": h.max_ms,
    }


@dataclass(frozen=True)
class CameraFigures:
    """A camera's figures so far (see RunCounters)."""

    frames: int
    fps: float  # over its own span
    latency_ms: dict[str, float]
    recent_fps: float  # over the last window
    recent_p95_ms: float


class RunCounters:
    """Counts and latency of the emitted results, per camera. Thread-safe."""

    def __init__(self, cameras: Sequence[str]) -> None:
        n = len(cameras)
        self._lock = threading.Lock()
        self._frames = [0] * n
        self._predicted = [0] * n  # of them, not detected (a detection interval)
        self._latency = [LatencyHistogram() for _ in range(n)]
        self._recent: list[deque[tuple[int, float]]] = [
            deque(maxlen=RECENT_FRAMES) for _ in range(n)
        ]
        self._first_capture_ns: list[int | None] = [None] * n
        self._last_emit_ns = [0] * n
        self.batches = 0

    def add(self, results: Sequence[FrameResult], *, batch: bool = True) -> None:
        """One batch's results (on the completion thread, after the sinks took them);
        `batch` False: frames of a batch answered before it (`engine.overdue`)."""
        with self._lock:
            self.batches += batch
            for r in results:
                i = r.camera_index
                latency_ms = r.timing.end_to_end_ms
                self._frames[i] += 1
                self._predicted[i] += r.detections.predicted
                self._latency[i].add(latency_ms)
                self._recent[i].append((r.timing.emitted_ns, latency_ms))
                first = self._first_capture_ns[i]
                if first is None or r.timing.capture_ns < first:
                    self._first_capture_ns[i] = r.timing.capture_ns
                self._last_emit_ns[i] = max(self._last_emit_ns[i], r.timing.emitted_ns)

    def frames(self) -> list[int]:
        with self._lock:
            return list(self._frames)

    def predicted(self) -> list[int]:
        """Per camera, the frames the tracker answered (not detected)."""
        with self._lock:
            return list(self._predicted)

    def cameras(self, window_s: float = 1.0) -> list[CameraFigures]:
        """Every camera's figures, the recent ones over the last `window_s`."""
        now_ns = time.monotonic_ns()
        with self._lock:
            recent = [list(r) for r in self._recent]
            lat = [histogram_percentiles_ms(h) for h in self._latency]
            spans = [
                (last - first) / 1e9 if first is not None else 0.0
                for first, last in zip(self._first_capture_ns, self._last_emit_ns, strict=True)
            ]
            frames = list(self._frames)
        out = []
        for i, n in enumerate(frames):
            fps, p95 = recent_window(recent[i], now_ns=now_ns, window_s=window_s)
            out.append(
                CameraFigures(
                    frames=n,
                    fps=n / spans[i] if spans[i] > 0 else 0.0,
                    latency_ms=lat[i],
                    recent_fps=fps,
                    recent_p95_ms=p95,
                )
            )
        return out

    def stats(
        self,
        snapshots: Sequence[CameraSnapshot],
        figures: Sequence[CameraFigures],
        *,
        elapsed_s: float,
        **rest: Any,
    ) -> RunStats:
        """The run's statistics from one reading (`figures` and the `snapshots` made from
        them, so that the totals add up): per camera, the frames, the batches and the span
        (`elapsed_s` before the first result); `rest` are `RunStats`' other fields."""
        frames = sum(f.frames for f in figures)
        span_s = self.span_s()
        cams = tuple(
            CameraStats(
                name=snap.name,
                frames=snap.frames,
                dropped=snap.dropped,
                fps=fig.fps,
                latency_ms=fig.latency_ms,
                short_by=snap.short_by,
                undecodable=snap.undecodable,
                discarded=snap.discarded,
                read=snap.read,
                decoded=snap.decoded,
                prepared=snap.prepared,
                predicted=predicted,
            )
            for snap, fig, predicted in zip(snapshots, figures, self.predicted(), strict=True)
        )
        return RunStats(
            cameras=cams,
            elapsed_s=span_s if span_s > 0 else elapsed_s,
            frames=frames,
            batches=self.batches,
            mean_batch_size=frames / self.batches if self.batches else 0.0,
            **rest,
        )

    def span_s(self) -> float:
        """First capture to last emission over all cameras (0 before any result)."""
        with self._lock:
            firsts = [f for f in self._first_capture_ns if f is not None]
            if not firsts:
                return 0.0
            return (max(self._last_emit_ns) - min(firsts)) / 1e9
