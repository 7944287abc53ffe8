"""What callers read of a running pipeline, never the pipeline itself: a progress reading
and a description (`Pipeline.progress()`, `Pipeline.describe()`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivepercept.types import CameraSnapshot, LoadSample


@dataclass(frozen=True)
class RunProgress:
    """A reading of a running pipeline, what a progress callback is handed (never the
    pipeline itself): every half second while it runs, and once more after it stopped.

    Attributes:
        cameras: every camera now.
        load: the newest load sample (None without a sampler, or before the first).
        frames_done: results emitted so far, all cameras.
        expected_frames: the frames the sources hold, as far as they say (-1: unknown, e.g.
            a stream).
    """

    cameras: tuple[CameraSnapshot, ...]
    load: LoadSample | None
    frames_done: int
    expected_frames: int


@dataclass(frozen=True)
class PipelineDescription:
    """What a pipeline runs on and with (`Pipeline.describe()`): what a job records of it.

    Attributes:
        config: the `PipelineConfig` it runs with, as run.json holds it.
        device: where the model runs ("cpu", "cuda:0").
        threads: the model's intra-op threads in all (torch's or the runtime's setting).
        lanes: the CPU lanes those threads are shared among (1 on a GPU or another runtime).
        packing: what `engine/prepack.py` did to the torch model's convolutions, or why it
            did not apply ("off", "device cuda", ...).
        runtime: what runs the network besides torch, as its runtime describes itself (ONNX
            Runtime: layout, threads, providers; OpenVINO), None for torch.
        telemetry: the load sampler's findings (rate, GPUs, why GPU metrics are unavailable,
            samples so far), None without a sampler.
        sinks: each result writer's report so far, by name.
        schedule: the deadline scheduler's decisions so far (`DeadlineScheduler.figures`),
            None without a deadline.
    """

    config: dict[str, Any]
    device: str
    threads: int
    lanes: int
    runtime: dict[str, Any] | None
    telemetry: dict[str, Any] | None
    sinks: dict[str, Any]
    packing: str = ""
    schedule: dict[str, Any] | None = None
