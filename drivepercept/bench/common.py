"""The benchmark suite's shared parts: what every result says, and the model-only set-up.

`SpeedOptions`: the speed options a figure was measured with. `ResultHeader`: the model,
input size, device and speed options every result names and starts its JSON with.
`model_only`: the engine's own step on `options`' model and device, with the threads set as
the engine sets them (`set_torch_threads`), and the pre-made batch (`first_frames`) that
the model-only measurements (`compare`, `ceiling`) run. The live measurement of served
cameras, shared by `live`, `capacity` and `sweep`, is `served`'s.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from drivepercept.config import PipelineConfig, ReconnectPolicy
from drivepercept.engine.device import resolve_device
from drivepercept.engine.step import DetectorStep
from drivepercept.models.base import Detector, InputSpec
from drivepercept.rig import CameraConfig
from drivepercept.run.job import load_model
from drivepercept.run.options import RunOptions
from drivepercept.sources.open import open_cameras, resolve_sources
from drivepercept.sources.prepare import prepare
from drivepercept.sources.readers import FrameReader, SourceError
from drivepercept.types import Pacing


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


_Result = TypeVar("_Result", bound="ResultHeader")


@dataclass(frozen=True, kw_only=True)
class ResultHeader:
    """What every benchmark result names: the model, its input size, the device and the speed
    options. The result types extend it (these fields are keyword-only there)."""

    model: str = ""
    input_size: tuple[int, int] = (0, 0)
    device: str = ""
    speed: SpeedOptions | None = None

    @classmethod
    def measured(
        cls: type[_Result],
        detector: Detector,
        config: PipelineConfig,
        *,
        runner: DetectorStep | None = None,
        **fields: Any,
    ) -> _Result:
        """A result with its own `fields`, the speed options read after the measurement (the
        threads as the engine left them; `runner`: the benchmark's own step, its fallbacks)."""
        return cls(
            model=detector.name,
            input_size=detector.input.size,
            device=str(resolve_device(config.device)),
            speed=SpeedOptions.of(config, runner, detector=detector),
            **fields,
        )

    @property
    def input_text(self) -> str:  # "416x256"
        return "x".join(map(str, self.input_size))

    def describe(self) -> str:  # "model yolox-nano, input 416x256, device cpu"
        return f"model {self.model}, input {self.input_text}, device {self.device}"

    def speed_lines(self) -> list[str]:  # the table's speed line, where the options are known
        return [self.speed.line()] if self.speed else []

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_size": self.input_text,
            "device": self.device,
            "speed": self.speed.as_dict() if self.speed else None,
        }


def open_readers(cams: Sequence[CameraConfig]) -> list[FrameReader]:
    """`cams` opened unpaced, as a replay opens them."""
    pacing = Pacing.AS_FAST_AS_POSSIBLE
    return open_cameras(cams, pacing=pacing, policy=ReconnectPolicy(), stop=threading.Event())


def first_frames(cams: Sequence[CameraConfig], spec: InputSpec) -> torch.Tensor:
    """The first frame of every camera, prepared for the model: the pre-made (N, H, W, 3)
    uint8 batch the model-only measurements run on (SourceError: a camera has no frame)."""
    images = []
    readers = open_readers(cams)
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


@dataclass(frozen=True)
class ModelOnly:
    """The model-only measurements' set-up (see `model_only`)."""

    cams: tuple[CameraConfig, ...]
    config: PipelineConfig
    detector: Detector
    device: torch.device
    runner: DetectorStep  # the engine's own step, run synchronously
    frames: torch.Tensor  # the first frame of every camera, prepared (on the host)


@contextmanager
def model_only(options: RunOptions, detector: Detector | None = None) -> Iterator[ModelOnly]:
    """`options`' cameras, config, model (`detector`, else loaded) and device, the engine's
    own step on them (the same model set-up, precision, threads and CPU lanes as a pipeline's
    engine; closed on exit, its lane threads with it) and the first frame of every camera
    (which also says at once when a camera has no frame)."""
    cams = resolve_sources(options.sources)
    config = options.pipeline()
    detector = detector or load_model(options)
    device = resolve_device(config.device)
    set_torch_threads(config)
    runner = DetectorStep(detector, config, device, max_batch=len(cams))
    with contextlib.closing(runner):
        frames = first_frames(cams, detector.input)
        yield ModelOnly(cams, config, detector, device, runner, frames)
