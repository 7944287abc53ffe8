"""Export of a `Detector` to ONNX, with the sidecar TOML that says how to run the file.

Each model family is exported in the output layout that it computes cleanly without
variable-length tensors (the layouts are those of the ONNX Runtime backend, `models/onnx/`):

* YOLOX: `yolox`, the decoded head (B, N, 5 + C): cx, cy, w, h in input pixels, objectness
  and class probabilities, exactly what the torch model scores and boxes are made from.
* drivepercept-tiny: `end2end`, its own CenterNet decoding (3x3 peak search, top-K over
  classes and cells) batched with gathers instead of a per-image loop: `labels`, `boxes`
  (xyxy, input pixels), `scores`, K per image, the same K as the torch model.

torchvision's detectors run NMS and drop boxes inside their forward (variable-length
outputs, per-image Python loops) and are refused with a one-line error.

The TorchScript exporter is used (`dynamo=False`): the dynamo exporter needs the onnxscript
package, which is not a dependency.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from drivepercept.models import tiny
from drivepercept.models.base import Detector, ModelError
from drivepercept.models.onnx.sidecar import Sidecar
from drivepercept.models.yolox import YOLOX

FORMATS: tuple[str, ...] = ("onnx",)
OPSET = 17
INPUT_NAME = "images"


@dataclass(frozen=True)
class Exported:
    """What `export_onnx` wrote.

    Attributes:
        onnx: the model file.
        sidecar: the TOML beside it (`<stem>.toml`).
        layout: `yolox`, `yolov8` or `end2end`.
        batch: the fixed batch size, None when dynamic.
    """

    onnx: Path
    sidecar: Path
    layout: str
    batch: int | None


class _YoloxHead(nn.Module):
    """YOLOX up to its decoded head: (B, N, 5 + C)."""

    def __init__(self, net: YOLOX, input_hw: tuple[int, int]) -> None:
        super().__init__()
        self.net = net
        self.input_hw = input_hw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.decode(self.net.raw(x), self.input_hw)


class _TinyEnd2End(nn.Module):
    """drivepercept-tiny's `decode`, batched: (labels, boxes, scores), K per image."""

    def __init__(self, net: tiny.TinyCenterNet, k: int) -> None:
        super().__init__()
        self.net = net
        self.k = k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, size, offset = self.net.maps(x)
        peaks = logits == F.max_pool2d(logits, 3, stride=1, padding=1)
        heat = logits.sigmoid() * peaks.to(logits.dtype)
        b, c, h, w = heat.shape
        scores, idx = heat.reshape(b, c * h * w).topk(min(self.k, c * h * w), dim=1)
        labels = idx // (h * w)
        pix = idx % (h * w)
        xs = (pix % w).float()
        ys = (pix // w).float()
        gather = pix.unsqueeze(1).expand(b, 2, pix.shape[1])
        off = offset.reshape(b, 2, h * w).gather(2, gather)
        wh = size.reshape(b, 2, h * w).gather(2, gather).clamp(-2.0, 7.0).exp()
        cx = (xs + off[:, 0]) * tiny.STRIDE
        cy = (ys + off[:, 1]) * tiny.STRIDE
        half_w, half_h = wh[:, 0] / 2, wh[:, 1] / 2
        boxes = torch.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], dim=2)
        return labels, boxes, scores


def exportable(detector: Detector) -> tuple[nn.Module, str, tuple[str, ...]]:
    """The module to export, its layout and its output names.

    Raises:
        ModelError: a model whose outputs have no fixed-size export here.
    """
    module = detector.module
    if isinstance(module, YOLOX):
        w, h = detector.input.size
        return _YoloxHead(module, (h, w)), "yolox", ("output",)
    if isinstance(module, tiny.TinyCenterNet):
        return _TinyEnd2End(module, tiny.MAX_DETECTIONS), "end2end", ("labels", "boxes", "scores")
    raise ModelError(
        f"model {detector.name} cannot be exported to ONNX (its NMS and variable-length outputs "
        f"do not export); exportable: {tiny.NAME} and the yolox-* models"
    )


def export_onnx(detector: Detector, out: Path, *, batch: int | None = 1) -> Exported:
    """Writes `detector` to `out` as ONNX, and its sidecar `<stem>.toml` beside it.

    Args:
        detector: the model (its module in eval mode, on the CPU).
        out: the `.onnx` file to write (its folder must exist).
        batch: the fixed batch size, or None for a dynamic batch dimension.

    Raises:
        ModelError: an unsupported model, a bad batch size or an unwritable destination.
    """
    if batch is not None and batch < 1:
        raise ModelError(f"export batch must be a positive number or dynamic, got {batch}")
    if out.suffix.lower() != ".onnx":
        raise ModelError(f"export output must be a .onnx file, got {out}")
    if not out.parent.is_dir():
        raise ModelError(f"export output folder {out.parent} does not exist")
    module, layout, names = exportable(detector)
    try:
        import onnx  # noqa: F401  (the exporter writes with it; a one-line error without it)
    except ImportError:
        raise ModelError("export to ONNX needs the onnx package: pip install onnx") from None
    module.eval()
    w, h = detector.input.size
    example = torch.zeros(batch or 2, 3, h, w)
    axes = {n: {0: "batch"} for n in (INPUT_NAME, *names)} if batch is None else None
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer and deprecation chatter, not user-facing
            torch.onnx.export(
                module,
                (example,),
                str(out),
                input_names=[INPUT_NAME],
                output_names=list(names),
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
            if batch is None:
                _pin_output_dims(out, module(example))
        sidecar = Sidecar.of(detector, layout).write(out)
    except OSError as exc:
        raise ModelError(f"cannot write {exc.filename or out}: {exc.strerror or exc}") from None
    return Exported(onnx=out, sidecar=sidecar, layout=layout, batch=batch)


def _pin_output_dims(path: Path, outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
    """Writes the outputs' fixed sizes (all but the batch) into a dynamic-batch graph: the
    exporter leaves them symbolic, and the backend recognises layouts by them."""
    import onnx

    model = onnx.load(str(path))
    shapes = [t.shape for t in (outputs if isinstance(outputs, tuple) else (outputs,))]
    for port, shape in zip(model.graph.output, shapes, strict=True):
        for dim, size in list(zip(port.type.tensor_type.shape.dim, shape, strict=True))[1:]:
            dim.dim_value = int(size)
    onnx.save(model, str(path))
