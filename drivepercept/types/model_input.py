"""What a model's input is: how a detector was trained to see a frame (`InputSpec`), where a
frame lands in that input (`Letterbox`), and the classes every model reports."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ModelError

FloatArray = npt.NDArray[np.float32]

# The classes a vehicle cares about: every model reports these names (drivepercept-tiny was
# trained on them; COCO detectors are mapped onto them: drivepercept.models.classes), and
# evaluation scores them.
DRIVING_CLASSES: tuple[str, ...] = (
    "car",
    "truck",
    "bus",
    "pedestrian",
    "cyclist",
    "traffic_light",
    "traffic_sign",
)

# what a run may report: the driving classes (COCO's mapped onto them), or every class
CLASS_CHOICES: tuple[str, ...] = ("driving", "all")

# what runs a detector's network: the fastest for the device, torch, ONNX Runtime or OpenVINO
# (`drivepercept.models.runtime`)
RUNTIMES: tuple[str, ...] = ("auto", "torch", "onnxruntime", "openvino")

# COCO class names -> the driving class each is reported as (the others are not driving
# classes); used by the COCO models and by eval for models that report COCO names.
COCO_TO_DRIVING: Mapping[str, str] = MappingProxyType(
    {
        "person": "pedestrian",
        "bicycle": "cyclist",
        "motorcycle": "cyclist",
        "motorbike": "cyclist",  # Darknet's spelling
        "car": "car",
        "truck": "truck",
        "bus": "bus",
        "traffic light": "traffic_light",
        "stop sign": "traffic_sign",
    }
)


@dataclass(frozen=True)
class Letterbox:
    """How a frame of `src_size` was fitted into a model input of `dst_size`.

    The frame is scaled by (scale_x, scale_y) (equal for a letterbox, different for a plain
    stretch) and placed at (pad_x, pad_y); the rest of the input is padding.
    """

    src_size: tuple[int, int]  # (width, height) of the original frame
    dst_size: tuple[int, int]  # (width, height) of the model input
    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float

    def to_original(self, xyxy: npt.NDArray[np.floating[Any]]) -> FloatArray:
        """Boxes (N, 4) in model-input pixels -> original-frame pixels, clipped to the frame."""
        boxes: FloatArray = np.array(xyxy, dtype=np.float32).reshape(-1, 4)
        boxes[:, 0::2] = (boxes[:, 0::2] - self.pad_x) / self.scale_x
        boxes[:, 1::2] = (boxes[:, 1::2] - self.pad_y) / self.scale_y
        np.clip(boxes[:, 0::2], 0.0, float(self.src_size[0]), out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0.0, float(self.src_size[1]), out=boxes[:, 1::2])
        return boxes

    def to_input(self, xyxy: npt.NDArray[np.floating[Any]]) -> FloatArray:
        """Boxes (N, 4) in original-frame pixels -> model-input pixels (the inverse)."""
        boxes: FloatArray = np.array(xyxy, dtype=np.float32).reshape(-1, 4)
        boxes[:, 0::2] = boxes[:, 0::2] * self.scale_x + self.pad_x
        boxes[:, 1::2] = boxes[:, 1::2] * self.scale_y + self.pad_y
        return boxes


class Interpolation(enum.Enum):
    """How a frame is resized to the model input.

    AREA: pixel-area averaging when shrinking (no aliasing), bilinear when enlarging.
    BILINEAR: bilinear sampling at pixel centres both ways (what most training pipelines do:
        OpenCV's `INTER_LINEAR`, torch's `interpolate(mode="bilinear", align_corners=False)`).
    """

    AREA = "area"
    BILINEAR = "bilinear"


class PadPlacement(enum.Enum):
    """Where a letterboxed frame sits in the model input: centred (padding split between
    both sides) or at the top-left corner (all padding right and below, as YOLOX and
    torchvision's batching do)."""

    CENTER = "center"
    TOP_LEFT = "top-left"


class ColorOrder(enum.Enum):
    """Channel order of the model input."""

    RGB = "rgb"
    BGR = "bgr"


@dataclass(frozen=True)
class InputSpec:
    """How a detector was trained to see a frame, and so how decoder threads prepare frames.

    A frame becomes model input in this order: resize (`interpolation`) either keeping the
    aspect ratio and padding with `pad_value` where the frame does not reach
    (`letterbox=True`, placed by `pad`) or stretched to `size` (`letterbox=False`); channels
    in `channels` order; pixel values scaled to [0, `value_range`] (1.0 or 255.0); then
    `(value - mean) / std` per channel, in the input's channel order. Resizing, padding and
    colour order happen on the CPU in uint8 (decoder threads); scaling and mean/std on the
    device.

    Attributes:
        size: (width, height) of the input in pixels.
        mean, std: per-channel normalisation, in the input's channel order and value range.
        letterbox: keep the aspect ratio and pad (True) or stretch to the size (False).
        pad_value: uint8 value of the padding: one for all channels, or one per channel in
            the input's channel order.
        interpolation: the resize filter.
        pad: where the padding goes when letterboxing.
        channels: RGB or BGR.
        value_range: 1.0 (pixels / 255) or 255.0 (pixels as they are).
    """

    size: tuple[int, int]
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    letterbox: bool = True
    pad_value: int | tuple[int, int, int] = 114
    interpolation: Interpolation = Interpolation.AREA
    pad: PadPlacement = PadPlacement.CENTER
    channels: ColorOrder = ColorOrder.RGB
    value_range: float = 1.0

    def __post_init__(self) -> None:
        w, h = self.size
        if not (16 <= w <= 8192 and 16 <= h <= 8192):
            raise ModelError(f"model input size must be 16..8192 pixels a side, got {w}x{h}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ModelError(f"model input mean and std need 3 values, got {self.mean}, {self.std}")
        if any(s <= 0 for s in self.std):
            raise ModelError(f"model input std must be positive, got {self.std}")
        if self.value_range not in (1.0, 255.0):
            raise ModelError(
                f"model input value_range must be 1.0 or 255.0, got {self.value_range}"
            )
        pads = (self.pad_value,) if isinstance(self.pad_value, int) else tuple(self.pad_value)
        if len(pads) not in (1, 3) or not all(isinstance(v, int) and 0 <= v <= 255 for v in pads):
            raise ModelError(f"model input pad_value must be 0..255 (one or three), got {pads}")
        for name, kind in (
            ("interpolation", Interpolation),
            ("pad", PadPlacement),
            ("channels", ColorOrder),
        ):
            if not isinstance(getattr(self, name), kind):
                raise ModelError(f"model input {name} must be a {kind.__name__}")

    @property
    def pad_color(self) -> tuple[int, int, int]:
        """The padding as three channel values, in the input's channel order."""
        if isinstance(self.pad_value, int):
            return (self.pad_value, self.pad_value, self.pad_value)
        first, second, third = self.pad_value
        return (first, second, third)
