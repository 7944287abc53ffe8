"""`drivepercept bench` (the default, and `--mode pipeline|naive`): how close the pipeline gets
to the model's ceiling, and to naive code.

Three measurements on the same machine, model, input size and batch, in one run:

(a) model-only: pre-made batches (one prepared frame per camera, taken from the rig) through
    normalise + model + post-processing, back to back. The ceiling: no decoding at all
    (`bench --mode ceiling` measures it per batch size, with latency: `bench.ceiling`).
(b) pipeline: the full replay pipeline on the rig (decoder threads, batcher, engine).
(c) naive: for each camera in turn, read a frame, prepare it, run it alone (batch 1) and wait
    for the result; what a first attempt in a notebook does.

Every table and JSON record says which speed options the figures were measured with
(`SpeedOptions`: precision, channels_last, compile, CUDA graphs, torch threads), and what
the load sampler saw while each was measured (`telemetry.loadwatch`: GPU utilization and
memory through NVML, this process's CPU): one `gpu-monitor` thread at the pipeline's
`sample_hz`, beside the measurement, never inside it (the pipeline's own sampler is off while
it runs, so the pipeline pays the cost of one sampler, as in a replay).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from drivepercept.bench.common import ResultHeader, model_only, open_readers
from drivepercept.config import PipelineConfig
from drivepercept.engine.step import DetectorStep
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector, InputSpec
from drivepercept.pipeline import Pipeline
from drivepercept.rig import CameraConfig
from drivepercept.run.options import RunOptions
from drivepercept.sources.prepare import prepare
from drivepercept.telemetry.loadwatch import NA, LoadFigures, Window, watch_load
from drivepercept.telemetry.sampler import gpu_refs

LOAD_HEADER = f"{'GPU %':>7} {'GPU MB':>7} {'CPU %':>6}"
LOAD_NOTE = (
    " GPU %: NVML utilization mean/max; GPU MB: most device memory in use;",
    " CPU %: this process's mean, 100 = one core)",
)


def load_cells(load: LoadFigures | None) -> str:
    """The `LOAD_HEADER` columns of one table row."""
    if load is None:
        return f"{NA:>7} {NA:>7} {NA:>6}"
    return f"{load.gpu_util_cell:>7} {load.gpu_mem_cell:>7} {load.cpu_cell:>6}"


@dataclass(frozen=True)
class BenchLine:
    """One mode's fastest round, the load over all of its rounds, and every round's
    frames/s in the order they ran (`round_fps`; empty for a line built by hand)."""

    mode: str
    frames: int
    seconds: float
    load: LoadFigures | None = None
    round_fps: tuple[float, ...] = ()

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def round_ratios(a: BenchLine, b: BenchLine) -> tuple[float, ...]:
    """a / b round by round: the rounds ran interleaved, so round k of each ran side by
    side (what the best of each hides: a host whose speed drifts between rounds). Empty
    unless both lines have the same number of rounds."""
    if len(a.round_fps) != len(b.round_fps):
        return ()
    return tuple(x / y for x, y in zip(a.round_fps, b.round_fps, strict=True) if y > 0)


def _ratio_row(name: str, a: BenchLine, b: BenchLine) -> str:
    row = f"{name + ':':<22} {a.fps / b.fps:.2f}x"
    ratios = round_ratios(a, b)
    if len(ratios) > 1:
        each = ", ".join(f"{r:.2f}" for r in ratios)
        row += f" (round by round {each}; median {statistics.median(ratios):.2f})"
    return row


MODES = ("model-only", "pipeline", "naive")


@dataclass(frozen=True)
class BenchResult(ResultHeader):
    """The measured lines, in `MODES` order (the modes that were asked for)."""

    lines: tuple[BenchLine, ...]
    batch: int
    rounds: int = 1

    def line(self, mode: str) -> BenchLine | None:
        return next((line for line in self.lines if line.mode == mode), None)

    def table(self) -> str:
        rows = [f"model {self.model}, input {self.input_text}, {self.batch} cameras"]
        rows += self.speed_lines()
        rows += [f"{'mode':<12} {'frames':>7} {'seconds':>8} {'frames/s':>9} {LOAD_HEADER}"]
        for line in self.lines:
            rows.append(
                f"{line.mode:<12} {line.frames:>7d} {line.seconds:>8.3f} {line.fps:>9.1f} "
                f"{load_cells(line.load)}"
            )
        pipeline, model_only, naive = (self.line(m) for m in ("pipeline", "model-only", "naive"))
        if pipeline and model_only:
            rows.append(_ratio_row("pipeline / model-only", pipeline, model_only))
        if pipeline and naive:
            rows.append(_ratio_row("pipeline / naive", pipeline, naive))
        rows.append(
            f"(batch {self.batch}, device {self.device}, best of {self.rounds} interleaved "
            "rounds, ratios of the bests; load over every round of a mode:"
        )
        rows.extend(LOAD_NOTE)
        return "\n".join(rows)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures (`bench --json`)."""
        return {
            **super().as_dict(),
            "cameras": self.batch,
            "rounds": self.rounds,
            "lines": [
                {
                    "mode": x.mode,
                    "frames": x.frames,
                    "seconds": round(x.seconds, 4),
                    "fps": x.fps,
                    "round_fps": [round(f, 2) for f in x.round_fps],
                    "load": x.load.as_dict() if x.load else None,
                }
                for x in self.lines
            ],
        }


Measured = tuple[BenchLine, Window]  # a line, and when it ran (the load sampler's clock)


def _model_only(runner: DetectorStep, batch: torch.Tensor, batches: int) -> Measured:
    t0 = time.monotonic_ns()
    start = time.perf_counter()
    for _ in range(batches):
        runner(batch)
    line = BenchLine("model-only", batches * batch.shape[0], time.perf_counter() - start)
    return line, (t0, time.monotonic_ns())


def _pipeline(
    cams: Sequence[CameraConfig], detector: Detector, config: PipelineConfig, frames_per_camera: int
) -> Measured:
    # sample_hz 0: the bench's sampler watches at the pipeline's rate instead (one sampler)
    pipe_cfg = dataclasses.replace(config, max_frames=frames_per_camera, sample_hz=0.0)
    readers = open_readers(cams)
    with Pipeline(
        cameras=[(c.name, r) for c, r in zip(cams, readers, strict=True)],
        detector=detector,
        config=pipe_cfg,
    ) as pipeline:  # started: warm (and compiled) by now, capture just begun
        t0 = time.monotonic_ns()
        stats = pipeline.run()
        window = (t0, time.monotonic_ns())
    return BenchLine("pipeline", stats.frames, stats.elapsed_s), window


def _naive(
    cams: Sequence[CameraConfig], runner: DetectorStep, spec: InputSpec, frames_per_camera: int
) -> Measured:
    readers = open_readers(cams)
    done = 0
    t0 = time.monotonic_ns()
    start = time.perf_counter()
    try:
        for _ in range(frames_per_camera):
            for r in readers:
                got = r.read()
                if got is None:
                    continue
                image, _ = prepare(got.image_bgr, spec)
                runner(torch.from_numpy(image[None]))
                done += 1
    finally:
        for r in readers:
            r.close()
    return BenchLine("naive", done, time.perf_counter() - start), (t0, time.monotonic_ns())


def bench(
    options: RunOptions,
    *,
    frames_per_camera: int,
    rounds: int = 2,
    warmup: int = 2,
    detector: Detector | None = None,
    modes: Sequence[str] = MODES,
) -> BenchResult:
    """Run the measurements `rounds` times, interleaved (a, b, c, a, b, c, ...), and keep
    each mode's fastest round: on a shared machine the noise is in one direction, and
    interleaving exposes every mode to the same drift. `frames_per_camera` frames of each
    camera in (b) and (c), as many batches in (a). The sources, model and settings are
    `options'` (replay mode); `modes` picks some of `MODES`.

    Raises:
        ConfigError: fewer than one frame per camera or one round, or an unknown mode.
    """
    if frames_per_camera < 1 or rounds < 1:
        raise ConfigError(
            f"frames per camera and rounds must be >= 1, got {frames_per_camera}, {rounds}"
        )
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ConfigError(f"bench modes are {', '.join(MODES)}, got {list(modes)}")
    with model_only(options, detector) as m:
        cams, config, detector, runner, batch = m.cams, m.config, m.detector, m.runner, m.frames
        spec = detector.input
        if "pipeline" not in modes or len(modes) > 1:
            for _ in range(warmup):
                runner(batch)
                runner(batch[:1])

        measure = {
            "model-only": lambda: _model_only(runner, batch, frames_per_camera),
            "pipeline": lambda: _pipeline(cams, detector, config, frames_per_camera),
            "naive": lambda: _naive(cams, runner, spec, frames_per_camera),
        }
        lines: dict[str, list[BenchLine]] = {mode: [] for mode in MODES if mode in modes}
        windows: dict[str, list[Window]] = {mode: [] for mode in lines}
        with watch_load(gpu_refs(m.device), rate_hz=config.sample_hz) as load:
            for _ in range(rounds):
                for mode, found in lines.items():
                    line, window = measure[mode]()
                    found.append(line)
                    windows[mode].append(window)
        return BenchResult.measured(
            detector,
            config,
            runner=runner,
            lines=tuple(
                dataclasses.replace(
                    max(found, key=lambda x: x.fps),
                    load=load.figures(windows[mode]),
                    round_fps=tuple(x.fps for x in found),
                )
                for mode, found in lines.items()
            ),
            batch=len(cams),
            rounds=rounds,
        )
