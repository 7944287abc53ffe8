"""One detector set up for one device and config: normalise -> model -> filter + NMS.

The engine and `bench` both run a detector through this, so that the benchmark's model-only
and naive figures measure exactly the network, precision and post-processing the pipeline
runs. The steps are separate methods because the engine spreads them over its threads: it
normalises and runs the model on its compute stream, and post-processes on the completion
side.
"""

from __future__ import annotations

import contextlib

import torch

from drivepercept.config import PipelineConfig
from drivepercept.engine.precision import autocast, set_reduced_precision
from drivepercept.engine.stages import label_table, postprocess, to_model_input
from drivepercept.models.base import Detector, ModelError

Outputs = list[dict[str, torch.Tensor]]


class DetectorStep:
    """A detector ready to run on `device` as `config` says.

    Setting up pushes the engine's thresholds into the model's own post-processing, moves it
    to the device, sets up mixed precision (only the parts the detector names, or its whole
    forward; see `engine/precision.py`) and channels_last, and puts the normalisation
    constants and the class filter on the device once. Set-up is idempotent, so one detector
    may be set up again (bench does: once for itself, once per pipeline it runs).
    """

    def __init__(self, detector: Detector, config: PipelineConfig, device: torch.device) -> None:
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
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self._whole_autocast = parts is None
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

    def normalise(self, batch_u8: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 on the device -> the model's float input."""
        return to_model_input(
            batch_u8,
            mean=self.mean,
            std=self.std,
            channels_last=self.config.channels_last,
            value_range=self.detector.input.value_range,
        )

    def forward(self, x: torch.Tensor) -> Outputs:
        """The model on a normalised batch (call under `torch.inference_mode()`)."""
        whole = autocast(self.config.precision, self.device) if self._whole_autocast else None
        with whole or contextlib.nullcontext():
            outputs: Outputs = self.model(x)
        return outputs

    def postprocess(self, outputs: Outputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Score and class filter, NMS, top-k: packed (B, K, 6) and counts (B,)."""
        cfg = self.config
        return postprocess(
            outputs,
            score_threshold=cfg.score_threshold,
            iou_threshold=cfg.iou_threshold,
            max_detections=cfg.max_detections,
            remap=self.remap,
            num_classes=len(self.class_names),
        )

    def __call__(self, batch_u8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """All three steps, waited for: a uint8 batch (any device) -> packed, counts on the
        host (the benchmark's model-only and naive runs)."""
        with torch.inference_mode():
            x = self.normalise(batch_u8.to(self.device))
            packed, counts = self.postprocess(self.forward(x))
            return packed.cpu(), counts.cpu()
