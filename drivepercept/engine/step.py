"""One detector set up for one device and config: normalise -> model -> filter + NMS.

The engine and `bench` both run a detector through this, so that the benchmark's model-only
and naive figures measure exactly the network, precision and post-processing the pipeline
runs. The steps are separate methods because the engine spreads them over its threads: it
normalises and runs the model on its compute stream, and post-processes on the completion
side.

With `compile` the model call goes through `engine/compiled.py` (compiled in the warm-up,
eager after one warning if it cannot be), with `cuda_graphs` the whole forward (autocast
included) through `engine/graphs.py` (one CUDA graph at the full batch, replayed). On a CPU
the model call runs as sub-batches at once, one per lane (`engine/lanes.py`), and in float32
its convolutions run with their weights packed for oneDNN (`engine/prepack.py`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from drivepercept.config import PipelineConfig
from drivepercept.engine.compiled import CompiledModel
from drivepercept.engine.graphs import GraphedForward
from drivepercept.engine.lanes import Lanes, Launched, plan_lanes, threads_per_lane
from drivepercept.engine.precision import autocast, set_reduced_precision
from drivepercept.engine.prepack import prepack_convolutions
from drivepercept.engine.prepack import unavailable as prepack_unavailable
from drivepercept.engine.stages import label_table, postprocess, to_model_input
from drivepercept.errors import ConfigError
from drivepercept.models.base import Detector, InputSpec, ModelError

Outputs = list[dict[str, torch.Tensor]]

log = logging.getLogger(__name__)
SAMPLE_SEED = 20251202  # the packing check's made frame: the same every set-up


def _seeded() -> torch.Generator:
    return torch.Generator().manual_seed(SAMPLE_SEED)


class DetectorStep:
    """A detector ready to run on `device` as `config` says.

    Setting up pushes the engine's thresholds into the model's own post-processing, moves it
    to the device, sets up mixed precision (only the parts the detector names, or its whole
    forward; see `engine/precision.py`) and channels_last, and puts the normalisation
    constants and the class filter on the device once. Set-up is idempotent, so one detector
    may be set up again (bench does: once for itself, once per pipeline it runs).

    `max_batch` is the largest batch it will be given (the rig's cameras): on a CPU it bounds
    the lanes, so that a one-camera rig keeps every thread on its one frame. Without it the
    model runs in one lane. A step with lanes owns their threads: `close()` ends them.

    Raises:
        ConfigError: CUDA graphs asked for on a device that is not a GPU.
        ModelError: the detector's `reduced_precision` names no submodule.
    """

    def __init__(
        self,
        detector: Detector,
        config: PipelineConfig,
        device: torch.device,
        *,
        max_batch: int = 1,
    ) -> None:
        if config.cuda_graphs and device.type != "cuda":
            raise ConfigError(f"cuda_graphs needs a CUDA device, got device {str(device)!r}")
        self.detector = detector
        self.config = config
        self.device = device
        detector.configure_postprocess(
            score_threshold=config.score_threshold,
            iou_threshold=config.iou_threshold,
            max_detections=config.max_detections,
        )
        model = detector.module.to(device).eval()
        parts = detector.reduced_precision
        if parts is not None:
            try:
                set_reduced_precision(model, parts, config.precision, device)
            except ModelError as exc:
                raise ModelError(f"model {detector.name}: reduced_precision: {exc}") from None
        # channels_last is torch's layout: a network that another runtime runs takes the
        # plain (N, C, H, W) batch, made in one pass from the uint8 frames
        self.channels_last = config.channels_last and detector.runtime is None
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        # A network that another runtime runs on the CPU (ONNX Runtime, OpenVINO) has that
        # runtime's threads; the torch work around it (normalising, decoding, NMS) is small
        # and runs on one torch thread, as a team of torch threads would wait for cores the
        # runtime's threads hold (docs/BENCHMARKS.md, "Glue on one torch thread").
        self.glue_threads = 1 if detector.runtime is not None and device.type == "cpu" else 0
        # the model's torch threads in all: as configured, else the creating thread's count
        self.threads = config.torch_threads or torch.get_num_threads()
        # lanes for torch's network, and for another runtime's that can be run from several
        # threads at once, each on its share of the threads (ONNX Runtime's, `use_lanes`)
        use_lanes = getattr(model, "use_lanes", None)
        eligible = (
            (detector.runtime is None or use_lanes is not None)
            and not config.compile
            and not config.cuda_graphs
        )
        lanes = plan_lanes(
            config.cpu_lanes,
            device=device,
            threads=self.threads,
            max_batch=max_batch,
            eligible=eligible,
        )
        per_lane = threads_per_lane(self.threads, lanes)
        if (
            detector.runtime is not None
            and use_lanes is not None
            and not use_lanes(lanes, per_lane)
        ):
            lanes = 1  # or asked for one lane: its one session back on every thread
        self.lanes = Lanes(lanes, threads=threads_per_lane(self.threads, lanes), total=self.threads)
        self.model = model
        self._whole_autocast = parts is None
        self.graphed = (
            GraphedForward(self._run_model, name=detector.name) if config.cuda_graphs else None
        )
        spec = detector.input
        # Normalisation constants go to the device once (none at all when they are 0 and 1).
        self.mean: tuple[float, ...] | torch.Tensor = spec.mean
        self.std: tuple[float, ...] | torch.Tensor = spec.std
        if any(v != 0.0 for v in spec.mean) or any(v != 1.0 for v in spec.std):
            self.mean = torch.tensor(spec.mean, device=device).view(1, 3, 1, 1)
            self.std = torch.tensor(spec.std, device=device).view(1, 3, 1, 1)
        # what the pipeline reports: the kept classes, renamed and merged as the detector says
        self.class_names, table = detector.output_classes()
        self.remap = label_table(table, device)
        self.packing = self._why_not_packed(config, device)
        if not self.packing:
            packed = prepack_convolutions(
                model, self._sample(detector.input), batch=-(-max(max_batch, 1) // lanes)
            )
            self.model = model = packed.model
            self.packing = packed.describe()
            log.info("model %s: %s", detector.name, self.packing)
        self.compiled = CompiledModel(model, name=detector.name) if config.compile else None

    def _why_not_packed(self, config: PipelineConfig, device: torch.device) -> str:
        """Why the convolutions are not packed for oneDNN ("" where they are to be)."""
        if self.detector.runtime is not None:
            return "another runtime"
        if not config.cpu_prepack:
            return "off"
        if config.compile:
            return "compile"
        return prepack_unavailable(device, config.precision) or ""

    def _sample(self, spec: InputSpec) -> torch.Tensor:
        """One made frame as the model gets it, for checking the packed convolutions (uniform
        noise over every pixel value: nothing depends on the footage)."""
        w, h = spec.size
        frames = torch.randint(0, 256, (1, h, w, 3), dtype=torch.uint8, generator=_seeded())
        return self.normalise(frames)

    def close(self) -> None:
        """End the lane threads; idempotent."""
        self.lanes.close()

    def normalise(self, batch_u8: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 on the device -> the model's float input."""
        with self._glue():
            return to_model_input(
                batch_u8,
                mean=self.mean,
                std=self.std,
                channels_last=self.channels_last,
                value_range=self.detector.input.value_range,
            )

    def forward(self, x: torch.Tensor) -> Outputs:
        """The model on a normalised batch (call under `torch.inference_mode()`): replayed
        from a CUDA graph where one is captured, else called (compiled or not)."""
        if self.graphed is not None:
            return self.graphed(x)
        with self._glue():
            return self._run_model(x)

    def launch(self, x: torch.Tensor, *, whole: bool = True) -> Launched:
        """The model on a normalised batch, handed to the CPU lanes without waiting (call
        under `torch.inference_mode()`): whole to one lane, or cut over them (`Lanes.launch`);
        `forward`'s work otherwise, done before it returns (one lane, CUDA graphs)."""
        if self.graphed is not None or self.lanes.count < 2:
            return Launched.done(self.forward(x))
        with self._glue():
            return self.lanes.launch(self._call_model, x, whole=whole)

    def _run_model(self, x: torch.Tensor) -> Outputs:
        return self.lanes.map(self._call_model, x)

    def _call_model(self, x: torch.Tensor) -> Outputs:
        """The model on (part of) a batch; autocast is per thread, so it is entered here."""
        whole = autocast(self.config.precision, self.device) if self._whole_autocast else None
        call = self.compiled if self.compiled is not None else self.model
        with whole or contextlib.nullcontext():
            outputs: Outputs = call(x)
        return outputs

    def postprocess(self, outputs: Outputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Score and class filter, NMS (none for a model whose outputs are final), top-k:
        packed (B, K, 6) and counts (B,)."""
        cfg = self.config
        with self._glue():
            return postprocess(
                outputs,
                score_threshold=cfg.score_threshold,
                iou_threshold=cfg.iou_threshold,
                max_detections=cfg.max_detections,
                remap=self.remap,
                num_classes=len(self.class_names),
                nms=not self.detector.final_outputs,
            )

    @contextlib.contextmanager
    def _glue(self) -> Iterator[None]:
        """torch's threads for the calling thread's torch work (per thread; given back)."""
        if not self.glue_threads:
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(self.glue_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def __call__(self, batch_u8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All three steps, waited for: a uint8 batch (any device) -> packed, counts on the
        host (the benchmark's model-only and naive runs)."""
        with torch.inference_mode():
            x = self.normalise(batch_u8.to(self.device))
            packed, counts = self.postprocess(self.forward(x))
            return packed.cpu(), counts.cpu()
