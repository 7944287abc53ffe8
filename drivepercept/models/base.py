"""What the engine needs from a detector: the plugin protocol.

A detector is a `torch.nn.Module` plus a little metadata. Its forward takes a float batch
(B, 3, H, W) at the detector's input size, prepared exactly as its `InputSpec` says (resize,
letterbox or stretch, channel order, value range, mean/std), and returns one dict per image
with

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
from pathlib import Path
from typing import Any

import torch

from drivepercept.errors import ModelError
from drivepercept.types import InputSpec

__all__ = ["Detector", "InputSpec", "ModelError", "RuntimeChoice", "WeightsStore"]


@dataclass(frozen=True)
class RuntimeChoice:
    """Which runtime runs a detector's network, and why (the run record's
    `model.runtime_choice`; `models/runtime.py` makes it).

    Attributes:
        asked: the runtime asked for: one of `drivepercept.types.RUNTIMES`; None where none
            was (a detector built by the caller).
        ran: "torch", "onnxruntime" or "openvino".
        reason: why, in a few words (the fallback's cause where `auto` kept torch).
        onnx: the export that runs (the cache's file), None for torch.
        export_s: seconds the export took when it was made for this run; None when reused.
    """

    asked: str | None
    ran: str
    reason: str
    onnx: Path | None = None
    export_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "ran": self.ran,
            "reason": self.reason,
            "onnx": str(self.onnx) if self.onnx is not None else None,
            "export_s": round(self.export_s, 3) if self.export_s is not None else None,
        }


@dataclass(frozen=True)
class WeightsStore:
    """Where a model's "DEFAULT" weights come from besides torch hub's cache (the CLI fills
    it from `$DRIVEPERCEPT_WEIGHTS_DIR` and `$DRIVEPERCEPT_WEIGHTS_MIRROR`).

    Attributes:
        folder: a folder of already-downloaded release files, used instead of the cache and
            the network (machines without internet).
        mirror: a base URL serving the release files, downloaded from instead of the
            official one.
    """

    folder: Path | None = None
    mirror: str | None = None


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
        report_as: the name each label is reported under (same length as `class_names`),
            None for `class_names` themselves. Labels that share a name become one class:
            one NMS group, one name in the output (COCO's bicycle and motorcycle -> cyclist).
        reduced_precision: dotted names of the submodules (backbone, neck, heads) that run in
            fp16/bf16 when a reduced precision is asked for; everything else (anchors, box
            decoding, NMS) then runs in float32. None runs the whole forward under autocast:
            the detector must then decode in float32 itself (see `engine/precision.py`).
        final_outputs: the model's boxes are already final (NMS-free, DETR-style end-to-end
            models): the engine's score and class filter and top-k still apply, its NMS is
            skipped (it would only remove true neighbours the model chose to keep).
        runtime: optional callable describing what runs the network besides torch, for the
            run record (the ONNX backend: layout, batch policy, execution providers, IO
            binding); called after the run, so it may say what was found on first use.
        runtime_choice: which runtime was chosen for it and why (`models/runtime.py`);
            None for a detector built without that choice (the registry, a plugin).
    """

    name: str
    module: torch.nn.Module
    input: InputSpec
    class_names: tuple[str, ...]
    keep_labels: frozenset[int] | None = None
    set_postprocess: Callable[[float, float, int], None] | None = None
    reduced_precision: tuple[str, ...] | None = None
    report_as: tuple[str, ...] | None = None
    final_outputs: bool = False
    runtime: Callable[[], dict[str, Any]] | None = None
    runtime_choice: RuntimeChoice | None = None

    def __post_init__(self) -> None:
        if self.report_as is not None and len(self.report_as) != len(self.class_names):
            raise ModelError(
                f"model {self.name}: report_as has {len(self.report_as)} names for "
                f"{len(self.class_names)} classes"
            )

    def output_classes(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The classes the pipeline reports, and where each model label goes.

        Returns:
            (names, table): the reported class names (kept labels only, in label order of
            first appearance) and, per model label, its index in `names`, -1 if dropped.
        """
        shown = self.report_as if self.report_as is not None else self.class_names
        names: list[str] = []
        table: list[int] = []
        for label, name in enumerate(shown):
            if self.keep_labels is not None and label not in self.keep_labels:
                table.append(-1)
                continue
            if name not in names:
                names.append(name)
            table.append(names.index(name))
        return tuple(names), tuple(table)

    def configure_postprocess(
        self, *, score_threshold: float, iou_threshold: float, max_detections: int
    ) -> None:
        """Apply the engine's post-processing settings inside the model, if it supports it."""
        if self.set_postprocess is not None:
            self.set_postprocess(score_threshold, iou_threshold, max_detections)
