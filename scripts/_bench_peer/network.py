"""bench_peer's network: YOLOv8n from Ultralytics' own config, its norms settled and its
class biases calibrated on the clips, wrapped as a drivepercept `Detector`."""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from drivepercept.models.base import Detector


# ---------------------------------------------------------------------- the network


class _Ultralytics:
    """The imported peer: the package, its YOLO model and the loader module we stamp."""

    def __init__(self) -> None:
        self.package: Any = importlib.import_module("ultralytics")
        self.loaders: Any = importlib.import_module("ultralytics.data.loaders")
        self.version = str(self.package.__version__)


def build_network(peer: _Ultralytics) -> Any:
    """YOLOv8n from Ultralytics' own config: random weights, not fused yet."""
    return peer.package.YOLO("yolov8n.yaml")


def settle_norms(net: Any, frames: torch.Tensor) -> None:
    """Set every batch norm's running statistics from `frames`, then fuse the norms into the
    convolutions and go to eval mode.

    Freshly built, the norms hold mean 0 and variance 1, and PyTorch's default convolution
    initialisation shrinks activations layer by layer: at the head they are ~0 and the output
    is the same for every frame. With statistics measured on real frames, each layer is
    normalised as in training, and the random network's boxes and scores depend on the input.
    """
    import torch

    norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # a plain average over the batches seen
    net.train()
    with torch.no_grad():
        net(frames)
    net.eval()
    net.fuse(verbose=False)


def _head_logits(net: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """(B, N): each anchor's best class logit."""
    import torch

    with torch.inference_mode():
        out = net(batch)
    pred = out[0] if isinstance(out, (tuple, list)) else out  # (B, 4 + classes, N)
    probs = pred[:, 4:].double().clamp(1e-12, 1 - 1e-12)
    best: torch.Tensor = torch.logit(probs).amax(dim=1)
    return best


def calibrate(net: Any, frames: torch.Tensor, *, conf: float, candidates: int) -> dict[str, float]:
    """Shift every class bias of the head by one constant so that about `candidates` anchors
    a frame score above `conf` on `frames` (float (B, 3, S, S), prepared as the model wants).
    Random weights otherwise score every anchor near Ultralytics' initial prior (~1e-4)."""
    import torch

    logits = _head_logits(net, frames)
    anchors = logits.shape[1]
    level = float(torch.quantile(logits.flatten(), 1.0 - min(candidates, anchors) / anchors))
    shift = math.log(conf / (1.0 - conf)) - level
    head = net.model[-1]  # DetectionModel.model: the layers, the Detect head last
    convs = [branch[-1] for branch in head.cv3]
    if not all(isinstance(c, torch.nn.Conv2d) and c.bias is not None for c in convs):
        raise RuntimeError("expected the detection head's class branches to end in a Conv2d")
    with torch.no_grad():
        for c in convs:
            c.bias.add_(shift)
    after = _head_logits(net, frames)
    above = float((after > math.log(conf / (1.0 - conf))).sum(dim=1).double().mean())
    return {"class_bias_shift": shift, "anchors": float(anchors), "candidates_measured": above}


class YoloAsDetector:
    """Builds the drivepercept `Detector` around an Ultralytics detection model."""

    @staticmethod
    def build(net: torch.nn.Module, names: Sequence[str], imgsz: int) -> Detector:
        import torch

        from drivepercept.models.base import Detector
        from drivepercept.types import ColorOrder, InputSpec, Interpolation, PadPlacement

        class _Forward(torch.nn.Module):
            """The head's decoded output -> drivepercept's per-image dicts: boxes (centre and
            size in input pixels) to xyxy, the best class and its probability. Filtering and
            NMS are drivepercept's (engine/stages.py), as for YOLOX."""

            def __init__(self, inner: torch.nn.Module) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
                out = self.inner(x)
                pred = out[0] if isinstance(out, (tuple, list)) else out  # (B, 4 + nc, N)
                cx, cy, w, h = pred[:, 0], pred[:, 1], pred[:, 2], pred[:, 3]
                boxes = torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), dim=-1)
                scores, labels = pred[:, 4:].max(dim=1)
                return [
                    {"boxes": boxes[i], "scores": scores[i], "labels": labels[i]}
                    for i in range(pred.shape[0])
                ]

        spec = InputSpec(
            size=(imgsz, imgsz),
            letterbox=True,
            pad_value=114,
            interpolation=Interpolation.BILINEAR,  # LetterBox: cv2.resize, INTER_LINEAR
            pad=PadPlacement.CENTER,
            channels=ColorOrder.RGB,
            value_range=1.0,
        )
        return Detector(
            name="ultralytics-yolov8n",
            module=_Forward(net).eval(),
            input=spec,
            class_names=tuple(names),
        )


def calibration_frames(
    paths: Sequence[Path], detector: Detector, *, per_clip: int = 4, step: int = 25
) -> torch.Tensor:
    """`per_clip` frames of each clip, `step` frames apart, prepared as the detector wants,
    as a float batch."""
    import cv2
    import torch

    from drivepercept.sources.prepare import prepare

    rows = []
    for path in dict.fromkeys(paths):
        capture = cv2.VideoCapture(str(path))
        for index in range(per_clip * step):
            ok, frame = capture.read()
            if not ok:
                break
            if index % step == 0:
                rows.append(prepare(np.asarray(frame, np.uint8), detector.input)[0])
        capture.release()
    if not rows:
        raise FileNotFoundError(f"expected decodable videos, got no frame from {paths[0]}")
    batch = torch.from_numpy(np.stack(rows)).permute(0, 3, 1, 2).float() / 255.0
    return batch


def calibrated_network(
    peer: _Ultralytics, clips: Sequence[Path], imgsz: int, *, conf: float, candidates: int
) -> tuple[Any, Detector, dict[str, float]]:
    """YOLOv8n built, its norms settled and its class biases calibrated on `clips`: the
    Ultralytics YOLO object (its `.model` the finished network), drivepercept's `Detector`
    around that same network, and the calibration figures."""
    yolo = build_network(peer)
    names = [yolo.names[i] for i in range(len(yolo.names))]
    detector = YoloAsDetector.build(yolo.model, names, imgsz)
    frames = calibration_frames(clips, detector)
    settle_norms(yolo.model, frames)
    calibration = calibrate(yolo.model, frames, conf=conf, candidates=candidates)
    return yolo, detector, calibration
