"""`drivepercept bench --mode ceiling`: what the model alone does, per batch size.

For every batch size from 1 to the rig's camera count: pre-made batches (the first frame of
each camera, prepared once; see `common.model_only`) already on the device, through the
engine's own steps (`DetectorStep`: normalise, model, filter and NMS), each batch waited for.
No decoding, no queues, no copies from the host: the ceiling any pipeline on this machine
stays under. Throughput says what batching buys; latency says what it costs a frame (a frame
waits for its whole batch).

Batch sizes are interleaved over rounds (1, 2, ..., N, 1, 2, ..., N, ...), so every size sees
the same drift on a shared machine; throughput is each size's fastest round (the noise of a
busy machine is in one direction) and latency the percentiles of every timed batch.

The table says which speed options were on (`SpeedOptions`) and what the load sampler saw
over the timed rounds (every size together: a size's turn in a round is far shorter than
NVML's averaging window on a GPU; see `telemetry.loadwatch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from drivepercept.bench.common import ResultHeader, model_only
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector
from drivepercept.run.options import RunOptions
from drivepercept.telemetry.loadwatch import LoadFigures, watch_load
from drivepercept.telemetry.sampler import gpu_refs
from drivepercept.telemetry.stats import latency_stats


@dataclass(frozen=True)
class CeilingLine:
    """One batch size: frames/s of its fastest round, and the latency of a batch (ms from the
    call, the batch already on the device, to its results on the host)."""

    batch: int
    batches: int  # timed per round
    fps: float
    p50_ms: float
    p99_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "batches": self.batches,
            "fps": round(self.fps, 3),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
        }


@dataclass(frozen=True)
class CeilingResult(ResultHeader):
    """Model-only throughput and latency per batch size, the speed options they were
    measured with, and the load over the timed rounds."""

    lines: tuple[CeilingLine, ...]
    precision: str
    rounds: int
    load: LoadFigures | None = None

    def table(self) -> str:
        rows = [
            f"ceiling: {self.describe()}, {self.precision}",
            *self.speed_lines(),
            f"{'batch':>5} {'batches':>8} {'frames/s':>9} {'p50 ms':>8} {'p99 ms':>8}",
        ]
        for x in self.lines:
            rows.append(
                f"{x.batch:>5d} {x.batches:>8d} {x.fps:>9.1f} {x.p50_ms:>8.1f} {x.p99_ms:>8.1f}"
            )
        best = max(self.lines, key=lambda x: x.fps)
        rows.append(f"best: batch {best.batch}, {best.fps:.1f} frames/s")
        if self.load is not None:
            rows.append(self.load.describe())
        rows.append("(batches on the device: model + post-processing only;")
        rows.append(f" frames/s: best of {self.rounds} interleaved rounds; latency: every batch;")
        rows.append(" load: over every timed batch, all sizes together)")
        return "\n".join(rows)

    def as_dict(self) -> dict[str, Any]:
        return {
            **super().as_dict(),
            "precision": self.precision,
            "rounds": self.rounds,
            "load": self.load.as_dict() if self.load else None,
            "lines": [x.as_dict() for x in self.lines],
        }


def ceiling(
    options: RunOptions,
    *,
    batches: int = 10,
    rounds: int = 3,
    warmup: int = 2,
    detector: Detector | None = None,
) -> CeilingResult:
    """Model-only throughput and latency for batch sizes 1 .. the rig's camera count.

    Args:
        options: the rig (its first frames make the batches), model and settings.
        batches: timed batches of each size per round.
        rounds: interleaved rounds (see the module docstring).
        warmup: untimed batches of each size first (allocator, kernels, caches).
        detector: an already-built detector (else `options.model` is loaded).

    Raises:
        ConfigError: fewer than one batch or round.
    """
    if batches < 1 or rounds < 1 or warmup < 0:
        raise ConfigError(
            f"batches and rounds must be >= 1 and warm-up >= 0, got {batches}, {rounds}, {warmup}"
        )
    with model_only(options, detector) as m:
        config, detector, runner = m.config, m.detector, m.runner
        frames = m.frames.to(m.device)  # on the device before timing
        sizes = range(1, len(m.cams) + 1)
        for size in sizes:
            for _ in range(warmup):
                runner(frames[:size])
        fps: dict[int, float] = dict.fromkeys(sizes, 0.0)
        latency_ms: dict[int, list[float]] = {size: [] for size in sizes}
        with watch_load(gpu_refs(m.device), rate_hz=config.sample_hz) as load:
            timed_from = time.monotonic_ns()
            for _ in range(rounds):
                for size in sizes:
                    batch = frames[:size]
                    started = time.perf_counter_ns()
                    for _ in range(batches):
                        t0 = time.perf_counter_ns()
                        runner(batch)  # waits: results are on the host when it returns
                        latency_ms[size].append((time.perf_counter_ns() - t0) / 1e6)
                    seconds = (time.perf_counter_ns() - started) / 1e9
                    fps[size] = max(fps[size], batches * size / seconds)
            timed = (timed_from, time.monotonic_ns())
        lines = []
        for size in sizes:
            stats = latency_stats(latency_ms[size])
            lines.append(CeilingLine(size, batches, fps[size], stats.p50_ms, stats.p99_ms))
        return CeilingResult.measured(
            detector,
            config,
            runner=runner,
            lines=tuple(lines),
            precision=config.precision,
            rounds=rounds,
            load=load.figures([timed]),
        )
