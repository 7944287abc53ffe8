"""Output layouts of exported detectors: recognised from the graph's inputs and outputs, and
decoded into the per-image dicts of the `Detector` contract (boxes xyxy in model-input pixels,
scores, labels); score filtering and NMS stay the engine's.

* `yolox` (YOLOX / YOLOv5): one (B, N, 5 + C) output, per row cx, cy, w, h, objectness, C class
  scores; score = objectness x best class. YOLOX exports often leave the grid out (raw offsets
  and log sizes per cell of strides 8, 16, 32): these are decoded with the torch YOLOX's grids.
* `yolov8` (YOLOv8 / YOLO11): one (B, 4 + C, N) output, cx, cy, w, h then C class scores.
* `end2end` (DETR-style, NMS-free): `labels` (B, K), `boxes` (B, K, 4) xyxy, `scores` (B, K).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drivepercept.errors import ModelError
from drivepercept.models.yolox import STRIDES, YOLOX

Dim = int | None  # None: a dynamic (named or unknown) dimension
Outputs = list[dict[str, torch.Tensor]]
END2END_NAMES = ("labels", "boxes", "scores")


@dataclass(frozen=True)
class Port:
    """One graph input or output: its name, shape (None for dynamic dims) and ORT type."""

    name: str
    shape: tuple[Dim, ...]
    type: str  # "tensor(float)", "tensor(int64)", ...


@dataclass(frozen=True)
class Graph:
    """What the backend needs to know of a graph.

    Attributes:
        inputs, outputs: the graph's ports.
        ops: the operator types used (empty when the onnx package could not read them).
    """

    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    ops: frozenset[str] = frozenset()

    @property
    def image(self) -> Port:
        """The image input: the first rank-4 float input."""
        for port in self.inputs:
            if len(port.shape) == 4 and "float" in port.type:
                return port
        raise ModelError(
            "the model has no image input (a float tensor of shape (B, 3, H, W)); inputs: "
            + ", ".join(f"{p.name} {_shape(p.shape)}" for p in self.inputs)
        )

    @property
    def size_input(self) -> Port | None:
        """An int input of shape (B, 2) (`orig_target_sizes`): the size boxes come back in."""
        for port in self.inputs:
            if port is not self.image and "int" in port.type and port.shape[-1:] == (2,):
                return port
        return None


def _shape(shape: tuple[Dim, ...]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def describe(graph: Graph) -> str:
    """The outputs as `name (B, N, 85)`, for messages."""
    return ", ".join(f"{p.name} {_shape(p.shape)}" for p in graph.outputs)


def recognise(graph: Graph) -> str | None:
    """The layout the outputs have, None when they fit none.

    Raises:
        ModelError: the outputs are a classifier's (one (B, C) output).
    """
    outs = graph.outputs
    names = {p.name for p in outs}
    if set(END2END_NAMES) <= names:
        return "end2end"
    ranks = sorted(len(p.shape) for p in outs)
    if len(outs) == 3 and ranks == [2, 2, 3] and any(p.shape[-1:] == (4,) for p in outs):
        return "end2end"
    floats = [p for p in outs if "float" in p.type]
    if len(outs) == 1 and len(outs[0].shape) == 2:
        raise ModelError(
            f"the model looks like a classifier, not a detector: its one output is "
            f"{describe(graph)} (scores per class, no boxes)"
        )
    if len(floats) >= 1 and len(floats[0].shape) == 3:
        _, a, b = floats[0].shape
        if b is not None and b >= 6 and (a is None or a > b):
            return "yolox"
        if a is not None and a >= 5 and (b is None or b > a):
            return "yolov8"
    return None


def grid_count(input_hw: tuple[int, int]) -> int:
    """Cells of a YOLOX head over strides 8, 16, 32 at an input size."""
    return sum((input_hw[0] // s) * (input_hw[1] // s) for s in STRIDES)


def is_raw_yolox(graph: Graph, rows: Dim, input_hw: tuple[int, int]) -> bool:
    """A YOLOX export without its decoding: one row per grid cell of strides 8, 16, 32 and no
    `Exp` in the graph (a decoding export exponentiates the log sizes)."""
    cells_fit = rows is None or rows == grid_count(input_hw)
    return cells_fit and "Exp" not in graph.ops and input_hw[0] % 32 == 0 == input_hw[1] % 32


class YoloxGrids:
    """The torch YOLOX's cell grids and strides, made once per input size and device."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def decode(self, raw: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
        """Raw (B, N, 5 + C) -> the same with cx, cy, w, h in input pixels (as YOLOX.decode)."""
        key = (input_hw[0], input_hw[1], str(raw.device))
        if key not in self._made:
            with torch.inference_mode(False):
                self._made[key] = YOLOX._make_grid(input_hw, raw.device)
        grid, stride = self._made[key]
        raw = raw.float()
        centre = (raw[..., :2] + grid) * stride
        wh = torch.exp(raw[..., 2:4]) * stride
        return torch.cat((centre, wh, raw[..., 4:]), dim=-1)


def _xyxy(cxcywh: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = cxcywh.unbind(-1)
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), dim=-1)


def from_yolox(out: torch.Tensor) -> Outputs:
    """Decoded (B, N, 5 + C) -> per-image dicts (score = objectness x best class)."""
    out = out.float()
    best, labels = out[..., 5:].max(dim=-1)
    scores = out[..., 4] * best
    boxes = _xyxy(out[..., :4])
    return [{"boxes": boxes[i], "scores": scores[i], "labels": labels[i]} for i in range(len(out))]


def from_yolov8(out: torch.Tensor) -> Outputs:
    """(B, 4 + C, N) -> per-image dicts (score = best class)."""
    out = out.float().transpose(1, 2)
    scores, labels = out[..., 4:].max(dim=-1)
    boxes = _xyxy(out[..., :4])
    return [{"boxes": boxes[i], "scores": scores[i], "labels": labels[i]} for i in range(len(out))]


def from_end2end(labels: torch.Tensor, boxes: torch.Tensor, scores: torch.Tensor) -> Outputs:
    """labels (B, K), boxes (B, K, 4) xyxy, scores (B, K) -> per-image dicts."""
    return [
        {"boxes": boxes[i].float(), "scores": scores[i].float(), "labels": labels[i].long()}
        for i in range(len(boxes))
    ]


def end2end_order(graph: Graph) -> tuple[int, int, int]:
    """Indices of the labels, boxes and scores outputs: by name, else by shape and type."""
    names = [p.name for p in graph.outputs]
    if set(END2END_NAMES) <= set(names):
        return names.index("labels"), names.index("boxes"), names.index("scores")
    boxes = next(i for i, p in enumerate(graph.outputs) if len(p.shape) == 3)
    rest = [i for i in range(3) if i != boxes]
    ints = [i for i in rest if "int" in graph.outputs[i].type]
    labels = ints[0] if ints else rest[0]
    scores = next(i for i in rest if i != labels)
    return labels, boxes, scores
