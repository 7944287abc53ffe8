"""YOLOX (Ge et al., 2021, "YOLOX: Exceeding YOLO Series in 2021"), written from the paper and
the published architecture: CSPDarknet backbone with a Focus stem and SPP, PAFPN neck, a
decoupled head per level, anchor-free decoding on strides 8, 16 and 32.

Module and parameter names follow the official state dicts (`backbone.backbone.dark3...`,
`head.cls_preds.0...`), so the released `.pth` checkpoints load as they are; the order in which
convolutions run follows the official forward, so an ONNX export's convolutions (in graph
order) line up with `conv_layers()` (see `yolox_weights.py`).

The network is fully convolutional: it runs at any input whose sides are multiples of 32, and
at any batch size. Its forward returns one dict per image with every cell's box (xyxy, input
pixels), score (objectness x best class probability) and that class: the engine's batched
post-processing filters by score, maps classes and runs NMS on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

STRIDES = (8, 16, 32)
# BatchNorm settings YOLOX trains with (its `init_yolo`): checkpoints assume this eps.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03


@dataclass(frozen=True)
class YoloxSize:
    """One member of the family: depth and width multipliers, depthwise convolutions."""

    name: str
    depth: float
    width: float
    depthwise: bool = False
    trained_at: int = 640  # the square input size of its published accuracy


SIZES: dict[str, YoloxSize] = {
    s.name: s
    for s in (
        YoloxSize("nano", 0.33, 0.25, depthwise=True, trained_at=416),
        YoloxSize("tiny", 0.33, 0.375, trained_at=416),
        YoloxSize("s", 0.33, 0.50),
        YoloxSize("m", 0.67, 0.75),
        YoloxSize("l", 1.0, 1.0),
        YoloxSize("x", 1.33, 1.25),
    )
}


class BaseConv(nn.Module):
    """Convolution, batch norm, SiLU; `fuse()` folds the norm into the convolution."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(cout, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.bn(self.conv(x)))
        return out

    @torch.no_grad()
    def fuse(self) -> None:
        """Fold the (eval-mode) batch norm into the convolution's weight and bias."""
        bn = self.bn
        if not isinstance(bn, nn.BatchNorm2d):
            return  # already fused
        assert bn.running_var is not None and bn.running_mean is not None
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        conv = self.conv
        conv.weight.mul_(scale.view(-1, 1, 1, 1))
        conv.bias = nn.Parameter(bn.bias - bn.running_mean * scale)
        self.bn = nn.Identity()


class DWConv(nn.Module):
    """Depthwise 3x3 then pointwise 1x1 (YOLOX-nano's convolution)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int = 1) -> None:
        super().__init__()
        self.dconv = BaseConv(cin, cin, k, stride, groups=cin)
        self.pconv = BaseConv(cin, cout, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.pconv(self.dconv(x))
        return out


def _conv(cin: int, cout: int, k: int, stride: int, depthwise: bool) -> nn.Module:
    return DWConv(cin, cout, k, stride) if depthwise else BaseConv(cin, cout, k, stride)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, shortcut: bool, expansion: float, dw: bool) -> None:
        super().__init__()
        hidden = int(cout * expansion)
        self.conv1 = BaseConv(cin, hidden, 1)
        self.conv2 = _conv(hidden, cout, 3, 1, dw)
        self.use_add = shortcut and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.conv2(self.conv1(x))
        return y + x if self.use_add else y


class CSPLayer(nn.Module):
    """Cross-stage partial block: half the channels through n bottlenecks, half around."""

    def __init__(self, cin: int, cout: int, n: int, shortcut: bool, dw: bool) -> None:
        super().__init__()
        hidden = int(cout * 0.5)
        self.conv1 = BaseConv(cin, hidden, 1)
        self.conv2 = BaseConv(cin, hidden, 1)
        self.conv3 = BaseConv(2 * hidden, cout, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, 1.0, dw) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv1(x)
        b = self.conv2(x)
        out: torch.Tensor = self.conv3(torch.cat((self.m(a), b), dim=1))
        return out


class SPPBottleneck(nn.Module):
    """Spatial pyramid pooling (max pools of 5, 9, 13, stride 1) between two 1x1 convs."""

    def __init__(self, cin: int, cout: int, kernels: tuple[int, ...] = (5, 9, 13)) -> None:
        super().__init__()
        hidden = cin // 2
        self.conv1 = BaseConv(cin, hidden, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, stride=1, padding=k // 2) for k in kernels)
        self.conv2 = BaseConv(hidden * (len(kernels) + 1), cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        out: torch.Tensor = self.conv2(torch.cat([x, *(pool(x) for pool in self.m)], dim=1))
        return out


class Focus(nn.Module):
    """Space-to-depth: each 2x2 block of pixels becomes 4x the channels, then a conv."""

    def __init__(self, cin: int, cout: int, k: int) -> None:
        super().__init__()
        self.conv = BaseConv(cin * 4, cout, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # order: (even row, even col), (odd row, even col), (even row, odd col), (odd, odd)
        parts = (x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2])
        out: torch.Tensor = self.conv(torch.cat(parts, dim=1))
        return out


class CSPDarknet(nn.Module):
    def __init__(self, depth: float, width: float, dw: bool) -> None:
        super().__init__()
        c = int(width * 64)
        n = max(round(depth * 3), 1)
        self.stem = Focus(3, c, 3)
        self.dark2 = nn.Sequential(_conv(c, c * 2, 3, 2, dw), CSPLayer(c * 2, c * 2, n, True, dw))
        self.dark3 = nn.Sequential(
            _conv(c * 2, c * 4, 3, 2, dw), CSPLayer(c * 4, c * 4, n * 3, True, dw)
        )
        self.dark4 = nn.Sequential(
            _conv(c * 4, c * 8, 3, 2, dw), CSPLayer(c * 8, c * 8, n * 3, True, dw)
        )
        self.dark5 = nn.Sequential(
            _conv(c * 8, c * 16, 3, 2, dw),
            SPPBottleneck(c * 16, c * 16),
            CSPLayer(c * 16, c * 16, n, False, dw),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.dark2(self.stem(x))
        c3 = self.dark3(x)
        c4 = self.dark4(c3)
        c5 = self.dark5(c4)
        return c3, c4, c5


class YOLOPAFPN(nn.Module):
    """The backbone plus a path-aggregation FPN: top-down, then bottom-up."""

    def __init__(self, depth: float, width: float, dw: bool) -> None:
        super().__init__()
        c3, c4, c5 = (int(ch * width) for ch in (256, 512, 1024))
        n = round(3 * depth)
        self.backbone = CSPDarknet(depth, width, dw)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.lateral_conv0 = BaseConv(c5, c4, 1)
        self.C3_p4 = CSPLayer(2 * c4, c4, n, False, dw)
        self.reduce_conv1 = BaseConv(c4, c3, 1)
        self.C3_p3 = CSPLayer(2 * c3, c3, n, False, dw)
        self.bu_conv2 = _conv(c3, c3, 3, 2, dw)
        self.C3_n3 = CSPLayer(2 * c3, c4, n, False, dw)
        self.bu_conv1 = _conv(c4, c4, 3, 2, dw)
        self.C3_n4 = CSPLayer(2 * c4, c5, n, False, dw)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f3, f4, f5 = self.backbone(x)
        top = self.lateral_conv0(f5)  # stride 32
        mid = self.C3_p4(torch.cat((self.upsample(top), f4), dim=1))
        mid_reduced = self.reduce_conv1(mid)  # stride 16
        p3 = self.C3_p3(torch.cat((self.upsample(mid_reduced), f3), dim=1))  # stride 8
        p4 = self.C3_n3(torch.cat((self.bu_conv2(p3), mid_reduced), dim=1))  # stride 16
        p5 = self.C3_n4(torch.cat((self.bu_conv1(p4), top), dim=1))  # stride 32
        return p3, p4, p5


class YOLOXHead(nn.Module):
    """Per level: a 1x1 stem, then two branches of two 3x3 convs: classes on one, box and
    objectness on the other. Returns raw (B, 4 + 1 + classes, H, W) per level, with
    objectness and classes through a sigmoid."""

    def __init__(self, num_classes: int, width: float, dw: bool) -> None:
        super().__init__()
        hidden = int(256 * width)
        self.stems = nn.ModuleList()
        self.cls_convs = nn.ModuleList()
        self.reg_convs = nn.ModuleList()
        self.cls_preds = nn.ModuleList()
        self.reg_preds = nn.ModuleList()
        self.obj_preds = nn.ModuleList()
        for ch in (256, 512, 1024):
            self.stems.append(BaseConv(int(ch * width), hidden, 1))
            for convs in (self.cls_convs, self.reg_convs):
                convs.append(
                    nn.Sequential(_conv(hidden, hidden, 3, 1, dw), _conv(hidden, hidden, 3, 1, dw))
                )
            self.cls_preds.append(nn.Conv2d(hidden, num_classes, 1))
            self.reg_preds.append(nn.Conv2d(hidden, 4, 1))
            self.obj_preds.append(nn.Conv2d(hidden, 1, 1))

    def forward(self, levels: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        out = []
        for k, x in enumerate(levels):
            x = self.stems[k](x)
            cls = self.cls_preds[k](self.cls_convs[k](x))
            reg_feat = self.reg_convs[k](x)
            reg = self.reg_preds[k](reg_feat)
            obj = self.obj_preds[k](reg_feat)
            out.append(torch.cat((reg, obj.sigmoid(), cls.sigmoid()), dim=1))
        return out


class YOLOX(nn.Module):
    """The whole detector; see the module docstring for what forward returns."""

    def __init__(self, size: YoloxSize, num_classes: int = 80) -> None:
        super().__init__()
        self.size = size
        self.num_classes = num_classes
        self.backbone = YOLOPAFPN(size.depth, size.width, size.depthwise)
        self.head = YOLOXHead(num_classes, size.width, size.depthwise)
        self._grids: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, 4 + 1 + classes): per cell (all levels, row-major) the raw box offsets and
        log sizes, objectness and class probabilities (what ONNX exports of YOLOX output)."""
        levels = self.head(self.backbone(x))
        return torch.cat([lv.flatten(start_dim=2) for lv in levels], dim=2).permute(0, 2, 1)

    def decode(self, raw: torch.Tensor, input_hw: tuple[int, int]) -> torch.Tensor:
        """Raw outputs -> (B, N, 4 + 1 + classes) with boxes as cx, cy, w, h in input pixels.

        Decoding always runs in float32: absolute pixel coordinates in half precision would
        be rounded by up to a quarter of a pixel at 640.
        """
        grid, stride = self._grid(input_hw, raw.device)
        raw = raw.float()
        centre = (raw[..., :2] + grid) * stride
        wh = torch.exp(raw[..., 2:4]) * stride
        return torch.cat((centre, wh, raw[..., 4:]), dim=-1)

    def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        h, w = x.shape[-2:]
        if h % 32 or w % 32:
            raise ValueError(f"YOLOX input sides must be multiples of 32, got {w}x{h}")
        out = self.decode(self.raw(x), (h, w))
        cx, cy, bw, bh = out[..., 0], out[..., 1], out[..., 2], out[..., 3]
        boxes = torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), dim=-1)
        best, labels = out[..., 5:].max(dim=-1)
        scores = out[..., 4] * best
        return [
            {"boxes": boxes[i], "scores": scores[i], "labels": labels[i]} for i in range(x.shape[0])
        ]

    def _grid(self, hw: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell offsets (1, N, 2) and strides (1, N, 1) for an input size, made once."""
        # built outside inference mode: a grid made during the engine's first batch must not
        # become an inference tensor that a later forward with autograd cannot use
        key = (hw[0], hw[1], str(device))
        if key not in self._grids:
            with torch.inference_mode(False):
                self._grids[key] = self._make_grid(hw, device)
        return self._grids[key]

    @staticmethod
    def _make_grid(hw: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        grids, strides = [], []
        for s in STRIDES:
            gh, gw = hw[0] // s, hw[1] // s
            ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
            grids.append(torch.stack((xs, ys), dim=-1).reshape(-1, 2))
            strides.append(torch.full((gh * gw, 1), float(s)))
        grid = torch.cat(grids).float().unsqueeze(0).to(device)
        return grid, torch.cat(strides).unsqueeze(0).to(device)

    def fuse(self) -> YOLOX:
        """Fold every batch norm into its convolution (inference only; ~1.3x faster on a
        CPU). The state dict then no longer has the official names."""
        for m in self.modules():
            if isinstance(m, BaseConv):
                m.fuse()
        return self

    def conv_layers(self) -> list[nn.Conv2d]:
        """Convolutions in the order the forward runs them (the order of an ONNX export)."""
        order: list[nn.Conv2d] = []
        hooks = [
            m.register_forward_hook(lambda mod, _i, _o: order.append(mod))
            for m in self.modules()
            if isinstance(m, nn.Conv2d)
        ]
        try:
            with torch.no_grad():
                self.raw(torch.zeros(1, 3, 64, 64, device=next(self.parameters()).device))
        finally:
            for h in hooks:
                h.remove()
        return order
