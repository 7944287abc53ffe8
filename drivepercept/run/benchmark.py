"""`drivepercept bench` (the default, and `--mode pipeline|naive`): how close the pipeline gets
to the model's ceiling, and to naive code.

Three measurements on the same machine, model, input size and batch, in one run:

(a) model-only: pre-made batches (one prepared frame per camera, taken from the rig) through
    normalise + model + post-processing, back to back. The ceiling: no decoding at all
    (`bench --mode ceiling` measures it per batch size, with latency: `bench_ceiling`).
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
from drivepercept.telemetry.loadwatch import NA, LoadFigures, Window, watch_load
from drivepercept.telemetry.sampler import gpu_refs


def _open(cams: Sequence[CameraConfig]) -> list[FrameReader]:
    return open_cameras(cams, paced=False, policy=ReconnectPolicy(), stop=threading.Event())


def _on(flag: bool) -> str:
    return "on" if flag else "off"


@dataclass(frozen=True)
class SpeedOptions:
    """The speed options a figure was measured with: a figure is never quoted without them.

    Attributes:
        precision, channels_last, compile, cuda_graphs: as the pipeline config says.
        torch_threads: as configured (0: torch's default); threads_used: torch's intra-op
            threads when the measurement ended (the default resolved, or the setting; with
            CPU lanes, each lane's share).
        cpu_lanes: the CPU lanes the benchmark's own model step ran (`engine/lanes.py`);
            None where only pipelines ran (their run.json says, under environment).
        fallbacks: options asked for that ran eagerly instead, and why (as far as the
            benchmark's own model step saw).
        runtime: what ran the network: "torch", "onnxruntime" or "openvino"
            (`models/runtime.py`); on an exported graph the torch options above did not apply,
            and `torch_threads` is the session's threads (0: the runtime's default, one per
            physical core).
    """

    precision: str
    channels_last: bool
    compile: bool
    cuda_graphs: bool
    torch_threads: int
    threads_used: int
    fallbacks: tuple[str, ...] = ()
    cpu_lanes: int | None = None
    runtime: str = "torch"

    @classmethod
    def of(
        cls,
        config: PipelineConfig,
        step: DetectorStep | None = None,
        *,
        detector: Detector | None = None,
    ) -> SpeedOptions:
        """The options of `config`, read after the measurement (and `step`'s fallbacks), on
        the runtime that ran `detector` (`step`'s where not given)."""
        detector = detector or (step.detector if step is not None else None)
        if detector is not None and detector.runtime is not None:
            return cls(
                precision=config.precision,
                channels_last=False,
                compile=False,
                cuda_graphs=False,
                torch_threads=config.torch_threads,
                threads_used=config.torch_threads,
                runtime=str(detector.runtime().get("backend", "onnxruntime")),
            )
        fallbacks = []
        lanes = step.lanes if step is not None and step.lanes.count > 1 else None
        if step is not None and step.compiled is not None and step.compiled.failure:
            fallbacks.append(f"compile: {step.compiled.failure}")
        if step is not None and step.graphed is not None and step.graphed.failure:
            fallbacks.append(f"cuda graphs: {step.graphed.failure}")
        return cls(
            precision=config.precision,
            channels_last=config.channels_last,
            compile=config.compile,
            cuda_graphs=config.cuda_graphs,
            torch_threads=config.torch_threads,
            threads_used=lanes.threads if lanes is not None else torch.get_num_threads(),
            fallbacks=tuple(fallbacks),
            cpu_lanes=step.lanes.count if step is not None else None,
        )

    def line(self) -> str:
        """The table's line: "speed: fp16, channels_last on, compile off, ..." (on ONNX
        Runtime: "speed: onnxruntime, fp32, threads ...")."""
        if self.runtime != "torch":
            whose = "OpenVINO's" if self.runtime == "openvino" else "ORT's"
            threads = self.threads_used or f"{whose} default (one per physical core)"
            return f"speed: {self.runtime}, {self.precision}, threads {threads}"
        default = "" if self.torch_threads else " (torch's default)"
        text = (
            f"speed: {self.precision}, channels_last {_on(self.channels_last)}, compile "
            f"{_on(self.compile)}, cuda graphs {_on(self.cuda_graphs)}, torch threads "
            f"{self.threads_used}{default}"
        )
        if self.cpu_lanes is not None and self.cpu_lanes > 1:
            text += f" in each of {self.cpu_lanes} CPU lanes"
        return text + (f"; ran eagerly: {'; '.join(self.fallbacks)}" if self.fallbacks else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "channels_last": self.channels_last,
            "compile": self.compile,
            "cuda_graphs": self.cuda_graphs,
            "torch_threads": self.torch_threads,
            "torch_threads_used": self.threads_used,
            "cpu_lanes": self.cpu_lanes,
            "fallbacks": list(self.fallbacks),
            "runtime": self.runtime,
        }


def set_torch_threads(config: PipelineConfig) -> None:
    """`config.torch_threads`, set process-wide as the engine sets it when it starts, so that
    the model-only measurements run on the threads the pipeline runs on."""
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)


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
    """One mode's fastest round, and the load over all of its rounds."""

    mode: str
    frames: int
    seconds: float
    load: LoadFigures | None = None

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
    speed: SpeedOptions | None = None

    def line(self, mode: str) -> BenchLine | None:
        return next((line for line in self.lines if line.mode == mode), None)

    def table(self) -> str:
        w, h = self.input_size
        rows = [f"model {self.model}, input {w}x{h}, {self.batch} cameras"]
        rows += [self.speed.line()] if self.speed else []
        rows += [f"{'mode':<12} {'frames':>7} {'seconds':>8} {'frames/s':>9} {LOAD_HEADER}"]
        for line in self.lines:
            rows.append(
                f"{line.mode:<12} {line.frames:>7d} {line.seconds:>8.3f} {line.fps:>9.1f} "
                f"{load_cells(line.load)}"
            )
        pipeline, model_only, naive = (self.line(m) for m in ("pipeline", "model-only", "naive"))
        if pipeline and model_only:
            rows.append(f"pipeline / model-only: {pipeline.fps / model_only.fps:.2f}x")
        if pipeline and naive:
            rows.append(f"pipeline / naive:      {pipeline.fps / naive.fps:.2f}x")
        rows.append(
            f"(batch {self.batch}, device {self.device}, best of {self.rounds} interleaved "
            "rounds; load over every round of a mode:"
        )
        rows.extend(LOAD_NOTE)
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
            "speed": self.speed.as_dict() if self.speed else None,
            "lines": [
                {
                    "mode": x.mode,
                    "frames": x.frames,
                    "seconds": round(x.seconds, 4),
                    "fps": x.fps,
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
    readers = _open(cams)
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
    readers = _open(cams)
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
    set_torch_threads(config)
    # the engine's own steps, run synchronously: the same model set-up, precision, threads
    # and CPU lanes
    runner = DetectorStep(detector, config, device, max_batch=len(cams))
    try:
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
        windows: dict[str, list[Window]] = {mode: [] for mode in lines}
        with watch_load(gpu_refs(device), rate_hz=config.sample_hz) as load:
            for _ in range(rounds):
                for mode, found in lines.items():
                    line, window = measure[mode]()
                    found.append(line)
                    windows[mode].append(window)
        return BenchResult(
            tuple(
                dataclasses.replace(
                    max(found, key=lambda x: x.fps), load=load.figures(windows[mode])
                )
                for mode, found in lines.items()
            ),
            batch=len(cams),
            device=str(device),
            rounds=rounds,
            model=detector.name,
            input_size=detector.input.size,
            speed=SpeedOptions.of(config, runner),
        )
    finally:
        runner.close()
