"""`drivepercept bench` (the default, and `--mode pipeline|naive`): how close the pipeline gets
to the model's ceiling, and to naive code.

Three measurements on the same machine, model, input size and batch, in one run:

(a) model-only: pre-made batches (one prepared frame per camera, taken from the rig) through
    normalise + model + post-processing, back to back. The ceiling: no decoding at all
    (`bench --mode ceiling` measures it per batch size, with latency: `bench_ceiling`).
(b) pipeline: the full replay pipeline on the rig (decoder threads, batcher, engine).
(c) naive: for each camera in turn, read a frame, prepare it, run it alone (batch 1) and wait
    for the result; what a first attempt in a notebook does.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from drivepercept.config import PipelineConfig, ReconnectPolicy
from drivepercept.engine.device import resolve_device
from drivepercept.engine.step import DetectorStep
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector, InputSpec
from drivepercept.pipeline import Pipeline
from drivepercept.rig import CameraConfig, resolve_cameras
from drivepercept.run.job import load_model
from drivepercept.run.options import RunOptions
from drivepercept.sources.open import open_cameras
from drivepercept.sources.prepare import prepare
from drivepercept.sources.readers import FrameReader, SourceError


def _open(cams: Sequence[CameraConfig]) -> list[FrameReader]:
    return open_cameras(cams, paced=False, policy=ReconnectPolicy(), stop=threading.Event())


@dataclass(frozen=True)
class BenchLine:
    mode: str
    frames: int
    seconds: float

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


MODES = ("model-only", "pipeline", "naive")


@dataclass(frozen=True)
class BenchResult:
    """The measured lines, in `MODES` order (the modes that were asked for)."""

    lines: tuple[BenchLine, ...]
    batch: int
    device: str
    rounds: int = 1
    model: str = ""
    input_size: tuple[int, int] = (0, 0)

    def line(self, mode: str) -> BenchLine | None:
        return next((line for line in self.lines if line.mode == mode), None)

    def table(self) -> str:
        w, h = self.input_size
        rows = [f"model {self.model}, input {w}x{h}, {self.batch} cameras"]
        rows += [f"{'mode':<12} {'frames':>7} {'seconds':>8} {'frames/s':>9}"]
        for line in self.lines:
            rows.append(f"{line.mode:<12} {line.frames:>7d} {line.seconds:>8.3f} {line.fps:>9.1f}")
        pipeline, model_only, naive = (self.line(m) for m in ("pipeline", "model-only", "naive"))
        if pipeline and model_only:
            rows.append(f"pipeline / model-only: {pipeline.fps / model_only.fps:.2f}x")
        if pipeline and naive:
            rows.append(f"pipeline / naive:      {pipeline.fps / naive.fps:.2f}x")
        rows.append(
            f"(batch {self.batch}, device {self.device}, best of {self.rounds} interleaved rounds)"
        )
        return "\n".join(rows)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures (`bench --json`)."""
        w, h = self.input_size
        return {
            "model": self.model,
            "input_size": f"{w}x{h}",
            "device": self.device,
            "cameras": self.batch,
            "rounds": self.rounds,
            "lines": [
                {"mode": x.mode, "frames": x.frames, "seconds": round(x.seconds, 4), "fps": x.fps}
                for x in self.lines
            ],
        }


def _model_only(runner: DetectorStep, batch: torch.Tensor, batches: int) -> BenchLine:
    start = time.perf_counter()
    for _ in range(batches):
        runner(batch)
    return BenchLine("model-only", batches * batch.shape[0], time.perf_counter() - start)


def _pipeline(
    cams: Sequence[CameraConfig], detector: Detector, config: PipelineConfig, frames_per_camera: int
) -> BenchLine:
    pipe_cfg = dataclasses.replace(config, max_frames=frames_per_camera)
    readers = _open(cams)
    with Pipeline(
        cameras=[(c.name, r) for c, r in zip(cams, readers, strict=True)],
        detector=detector,
        config=pipe_cfg,
    ) as pipeline:
        stats = pipeline.run()
    return BenchLine("pipeline", stats.frames, stats.elapsed_s)


def _naive(
    cams: Sequence[CameraConfig], runner: DetectorStep, spec: InputSpec, frames_per_camera: int
) -> BenchLine:
    readers = _open(cams)
    done = 0
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
    return BenchLine("naive", done, time.perf_counter() - start)


def first_frames(cams: Sequence[CameraConfig], spec: InputSpec) -> torch.Tensor:
    """The first frame of every camera, prepared for the model: the pre-made (N, H, W, 3)
    uint8 batch the model-only measurements run on.

    Raises:
        SourceError: a camera has no frame.
    """
    images = []
    readers = _open(cams)
    try:
        for cam, r in zip(cams, readers, strict=True):
            got = r.read()
            if got is None:
                raise SourceError(f"camera {cam.name!r} has no frames to benchmark with")
            images.append(prepare(got.image_bgr, spec)[0])
    finally:
        for r in readers:
            r.close()
    return torch.from_numpy(np.stack(images))


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
    cams = resolve_cameras(options.sources)
    config = options.pipeline()
    detector = detector or load_model(options)
    device = resolve_device(config.device)
    # the engine's own steps, run synchronously: the same model set-up and precision
    runner = DetectorStep(detector, config, device)
    spec = detector.input
    batch = first_frames(cams, spec)  # also says at once when a camera has no frame
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
    for _ in range(rounds):
        for mode, found in lines.items():
            found.append(measure[mode]())
    return BenchResult(
        tuple(max(found, key=lambda line: line.fps) for found in lines.values()),
        batch=len(cams),
        device=str(device),
        rounds=rounds,
        model=detector.name,
        input_size=detector.input.size,
    )
