"""What the engine needs from a detector: the plugin protocol.

A detector is a `torch.nn.Module` plus a little metadata. Its forward takes a float batch
(B, 3, H, W), RGB, at the detector's input size, already normalised as `InputSpec` asks
(`(pixel / 255 - mean) / std`), and returns one dict per image with

* `boxes`: (N, 4) float, xyxy in input pixels,
* `scores`: (N,) float,
* `labels`: (N,) int64, indices into `class_names`.

torchvision detectors have exactly this forward in eval mode (they normalise inside, so their
spec has mean 0 and std 1). A user's own detector is plugged in as `--model pkg.module:factory`,
where `factory(weights: str | None) -> Detector` builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from drivepercept.errors import ModelError
from drivepercept.types import InputSpec

__all__ = ["Detector", "InputSpec", "ModelError"]


@dataclass(frozen=True, eq=False)
class Detector:
    """A ready-to-run detector (see the module docstring for the forward contract).

    Attributes:
        name: registry name or plugin path.
        module: the network, in eval mode.
        input: what it wants as input.
        class_names: label index -> name.
        keep_labels: labels kept by the class filter (None keeps all).
        set_postprocess: optional hook `(score_threshold, iou_threshold, max_detections)`
            that pushes the engine's post-processing settings into the model's own (torchvision
            detectors filter candidates internally at a very low score; telling them the final
            threshold saves building and suppressing boxes the engine would drop anyway).
        reduced_precision: dotted names of the submodules (backbone, neck, heads) that run in
            fp16/bf16 when a reduced precision is asked for; everything else (anchors, box
            decoding, NMS) then runs in float32. None runs the whole forward under autocast:
            the detector must then decode in float32 itself (see `engine/precision.py`).
    """

    name: str
    module: torch.nn.Module
    input: InputSpec
    class_names: tuple[str, ...]
    keep_labels: frozenset[int] | None = None
    set_postprocess: Callable[[float, float, int], None] | None = None
    reduced_precision: tuple[str, ...] | None = None

    def configure_postprocess(
        self, *, score_threshold: float, iou_threshold: float, max_detections: int
    ) -> None:
        """Apply the engine's post-processing settings inside the model, if it supports it."""
        if self.set_postprocess is not None:
            self.set_postprocess(score_threshold, iou_threshold, max_detections)
