"""`drivepercept-tiny`: the bundled detector, a small CenterNet trained on the synthetic rig.

Objects as points (Zhou et al., 2019): a stride-4 heat map per class marks object centres; two
more maps give each centre's box size (log pixels) and sub-pixel offset. Decoding is a 3x3
max-pool peak search and a top-k: no anchors and no NMS. The backbone is a plain five-stage
CNN (BatchNorm + ReLU, stride 32) with a light top-down path back to stride 4; at 448x256
(16:9 cameras letterboxed, 0.7x of 640x360) it costs about 0.6 GFLOPs a frame.

Weights ship in `models/drivepercept_tiny.pt` (a plain state dict, loaded with
`weights_only=True`); `scripts/train_default_model.py` makes them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from drivepercept.models import _weights
from drivepercept.models.base import Detector, InputSpec, ModelError
from drivepercept.types import ColorOrder, Interpolation, PadPlacement

NAME = "drivepercept-tiny"
CLASSES: tuple[str, ...] = (
    "car",
    "truck",
    "bus",
    "pedestrian",
    "cyclist",
    "traffic_light",
    "traffic_sign",
)
INPUT_SIZE = (448, 256)  # (width, height)
STRIDE = 4
MEAN = (0.45, 0.45, 0.45)
STD = (0.25, 0.25, 0.25)
WEIGHTS_FILE = Path(__file__).resolve().parents[2] / "models" / "drivepercept_tiny.pt"
MAX_DETECTIONS = 100


def _conv(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class TinyCenterNet(nn.Module):
    """Backbone, top-down path and the three CenterNet heads.

    In training mode forward returns the raw maps (heat logits, log sizes, offsets); in eval
    mode it returns one dict of boxes (input pixels), scores and labels per image.
    """

    def __init__(
        self,
        num_classes: int = len(CLASSES),
        widths: tuple[int, int, int, int, int] = (24, 32, 64, 96, 128),
        head: int = 48,
    ) -> None:
        super().__init__()
        w1, w2, w3, w4, w5 = widths
        self.stem = _conv(3, w1, 2)  # /2
        self.s2 = nn.Sequential(_conv(w1, w2, 2), _conv(w2, w2))  # /4
        self.s3 = nn.Sequential(_conv(w2, w3, 2), _conv(w3, w3))  # /8
        self.s4 = nn.Sequential(_conv(w3, w4, 2), _conv(w4, w4))  # /16
        self.s5 = nn.Sequential(_conv(w4, w5, 2), _conv(w5, w5))  # /32
        self.lat = nn.ModuleList([nn.Conv2d(c, head, 1) for c in (w2, w3, w4, w5)])
        self.smooth = nn.ModuleList([_conv(head, head) for _ in range(3)])
        self.heat = nn.Sequential(_conv(head, head), nn.Conv2d(head, num_classes, 1))
        self.size = nn.Sequential(_conv(head, head), nn.Conv2d(head, 2, 1))
        self.offset = nn.Sequential(_conv(head, head), nn.Conv2d(head, 2, 1))
        last = self.heat[-1]
        assert isinstance(last, nn.Conv2d) and last.bias is not None
        nn.init.constant_(last.bias, -2.19)  # prior 0.1: stable focal loss from the start
        self.num_classes = num_classes

    def maps(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c2 = self.s2(self.stem(x))
        c3 = self.s3(c2)
        c4 = self.s4(c3)
        c5 = self.s5(c4)
        p = self.lat[3](c5)
        for lat, smooth, c in zip(self.lat[2::-1], self.smooth, (c4, c3, c2), strict=True):
            p = smooth(F.interpolate(p, size=c.shape[-2:], mode="nearest") + lat(c))
        return self.heat(p), self.size(p), self.offset(p)

    def forward(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | list[dict[str, torch.Tensor]]:
        heat, size, offset = self.maps(x)
        if self.training:
            return heat, size, offset
        return decode(heat, size, offset, k=MAX_DETECTIONS)


def decode(
    heat_logits: torch.Tensor, size: torch.Tensor, offset: torch.Tensor, *, k: int = MAX_DETECTIONS
) -> list[dict[str, torch.Tensor]]:
    """Peaks of the heat map -> boxes in input pixels (all on the maps' device)."""
    logits = heat_logits.float()
    # peaks are found on the logits: the sigmoid saturates to exactly 1.0 for confident
    # cells, and ties there would let neighbours survive as duplicate boxes
    peaks = logits == F.max_pool2d(logits, 3, stride=1, padding=1)
    heat = logits.sigmoid() * peaks
    b, c, h, w = heat.shape
    scores, idx = heat.reshape(b, -1).topk(min(k, c * h * w), dim=1)
    labels = idx // (h * w)
    pix = idx % (h * w)
    ys = (pix // w).float()
    xs = (pix % w).float()
    out = []
    for i in range(b):
        off = offset[i].float().reshape(2, -1)[:, pix[i]]
        wh = size[i].float().reshape(2, -1)[:, pix[i]].clamp(-2.0, 7.0).exp()
        cx = (xs[i] + off[0]) * STRIDE
        cy = (ys[i] + off[1]) * STRIDE
        boxes = torch.stack([cx - wh[0] / 2, cy - wh[1] / 2, cx + wh[0] / 2, cy + wh[1] / 2], 1)
        out.append({"boxes": boxes, "scores": scores[i], "labels": labels[i]})
    return out


def input_spec() -> InputSpec:
    """What it was trained with (`scripts/train_default_model.py` prepares frames with
    `prepare` at this spec): area-averaged shrink, centred letterbox padded with 114, RGB
    scaled to [0, 1], then MEAN/STD."""
    return InputSpec(
        size=INPUT_SIZE,
        mean=MEAN,
        std=STD,
        letterbox=True,
        pad_value=114,
        interpolation=Interpolation.AREA,
        pad=PadPlacement.CENTER,
        channels=ColorOrder.RGB,
        value_range=1.0,
    )


def make_tiny(weights: str | None = "bundled") -> Detector:
    """The bundled detector. `weights`: "bundled"/"DEFAULT" (models/drivepercept_tiny.pt),
    a state-dict path, or None for random initialisation (training, tests)."""
    module = TinyCenterNet()
    if weights is not None:
        path = WEIGHTS_FILE if weights in ("bundled", "DEFAULT") else Path(weights)
        if not path.is_file():
            raise ModelError(
                f"weights for {NAME} not found at {path} (train them with "
                "scripts/train_default_model.py, or pass --weights none)"
            )
        # the checks every model's weights get: one line naming the file and what is wrong
        state = _weights.read_state_dict(str(path), model_name=NAME)
        _weights.apply_state_dict(module, state, source=str(path), model_name=NAME)
    module.eval()
    return Detector(
        name=NAME,
        module=module,
        input=input_spec(),
        class_names=CLASSES,
    )
