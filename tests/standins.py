"""Made stand-ins for the third-party fixtures of `../shared`, for a clone that lacks them.

Each maker writes, from what the project ships or computes, a file of the same kind and
shape as the real one, so that a test asserting a property that does not need the real
content (decoding, sizes, frame rates, containers, graph structure, preparation, bit-for-bit
agreement of two runtimes) runs on a stranger's machine too:

* `make_road_clips`: three clips cut from the bundled sample rig, at the real clips' sizes,
  frame rates and containers (960x540 at 25 fps and 768x432 at 12.5 fps in MP4, 320x240 at
  60 fps in AVI).
* `make_yolox_nano_export`: YOLOX-nano, seeded random weights with non-trivial batch norms,
  exported as the official release is (batch norms folded, the raw head as `output`,
  `images` 1x3x416x416), so the weights loader, the ONNX backend's raw-grid decoding and
  the preparation checks have a file of the release's structure.

Seeded random weights detect nothing: they score every cell alike (0.26-0.29 on any frame,
scaling the head only sharpens the same input-independent pattern), so tests whose property
needs confident, well-separated detections (boxes of two runtimes matched after NMS, cars
on the highway stills, INT8 and bf16 accuracy) keep their skip.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import cv2
import torch
from torch import nn

from drivepercept.models.yolox import SIZES, YOLOX

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RIG = ROOT / "sample_videos"


@dataclass(frozen=True)
class RoadClips:
    """Three road clips of different sizes, frame rates and containers.

    Attributes:
        folder: the folder holding them (and nothing else that is a clip).
        highway: 960x540, 25 fps, MP4.
        overhead: 768x432, 12.5 fps, MP4.
        small: 320x240, 60 fps, AVI (enlarged, not shrunk, by a 416 input).
        real: True for the third-party clips of ../shared, False for made ones.
    """

    folder: Path
    highway: Path
    overhead: Path
    small: Path
    real: bool

    @property
    def all(self) -> tuple[Path, ...]:
        return tuple(sorted((self.highway, self.overhead, self.small)))


REAL_NAMES = (
    "udacity_lanelines_solidWhiteRight.mp4",
    "intel_car-detection.mp4",
    "bgslibrary_video03_road.avi",
)
MADE = (  # name, sample camera, size, fps, fourcc, frames
    ("made_highway.mp4", "front", (960, 540), 25.0, "mp4v", 40),
    ("made_overhead.mp4", "front_left", (768, 432), 12.5, "mp4v", 30),
    ("made_small.avi", "back", (320, 240), 60.0, "MJPG", 60),
)


def real_road_clips(folder: Path) -> RoadClips:
    """The three third-party clips of ../shared/realvideos."""
    highway, overhead, small = (folder / n for n in REAL_NAMES)
    return RoadClips(folder, highway, overhead, small, real=True)


def make_road_clips(folder: Path) -> RoadClips:
    """Writes the three made clips into `folder` (from the sample rig's frames)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, camera, size, fps, fourcc, count in MADE:
        cap = cv2.VideoCapture(str(SAMPLE_RIG / f"{camera}.mp4"))
        out = folder / name
        writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*fourcc), fps, size)
        assert writer.isOpened(), f"this OpenCV cannot write {fourcc} into {out.suffix}"
        for _ in range(count):
            ok, frame = cap.read()
            assert ok, f"{camera}.mp4 has fewer than {count} frames"
            writer.write(cv2.resize(frame, size, interpolation=cv2.INTER_AREA))
        writer.release()
        cap.release()
        paths.append(out)
    highway, overhead, small = paths
    return RoadClips(folder, highway, overhead, small, real=False)


def random_norms(net: YOLOX, seed: int = 0) -> YOLOX:
    """Non-trivial batch-norm statistics, so that fusing has something to fold."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return net.eval()


class _Raw(nn.Module):
    def __init__(self, net: YOLOX) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.raw(x)


def make_yolox_nano_export(path: Path, *, seed: int = 0) -> Path:
    """Writes a YOLOX-nano ONNX file structured as the official release (see module doc)."""
    torch.manual_seed(seed)
    net = random_norms(YOLOX(SIZES["nano"]), seed=seed).fuse()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Raw(net),
            (torch.zeros(1, 3, 416, 416),),
            str(path),
            input_names=["images"],
            output_names=["output"],
            opset_version=11,
            dynamo=False,
        )
    return path
