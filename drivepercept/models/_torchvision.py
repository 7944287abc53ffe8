"""torchvision's COCO detectors as `Detector`s.

torchvision detectors resize every image inside their forward (`GeneralizedRCNNTransform`)
so that its short side is `min_size` and its long side at most `max_size`. Each model's input
size here is chosen so that this inner resize is the identity: the frames arrive already
letterboxed to exactly the size the network runs at, and no pixel is interpolated twice. The
sizes are multiples of 32 (the FPN stride) close to 16:9, the shape of most vehicle cameras.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from drivepercept.models import _weights
from drivepercept.models.base import Detector, InputSpec
from drivepercept.models.classes import coco_driving_view
from drivepercept.types import Interpolation, PadPlacement

# The parts that run in fp16/bf16 under mixed precision: the backbone with its FPN and the
# heads (convolutions and matrix products: the work that gains). Anchors, box decoding, RoI
# pooling and NMS between and after them stay float32 (see engine/precision.py). The heads'
# outputs are logits and box deltas relative to an anchor, where half precision costs a
# fraction of a pixel, unlike absolute coordinates.
_ONE_STAGE = ("backbone", "head")
_TWO_STAGE = ("backbone", "rpn.head", "roi_heads.box_head", "roi_heads.box_predictor")


@dataclass(frozen=True)
class _Entry:
    """How to build one torchvision detector.

    Attributes:
        size: (width, height) of the model input.
        reduced_precision: the submodules that run in fp16/bf16 (see above).
        kwargs: extra builder arguments (the inner resize bounds that make it the identity).
    """

    size: tuple[int, int]
    reduced_precision: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _identity_resize(width: int, height: int, parts: tuple[str, ...]) -> _Entry:
    bounds = {"min_size": min(width, height), "max_size": max(width, height)}
    return _Entry((width, height), parts, bounds)


_MODELS: dict[str, _Entry] = {
    # Fixed 320x320 (SSD stretches internally, so our letterbox is the only resize).
    "ssdlite320_mobilenet_v3_large": _Entry((320, 320), _ONE_STAGE),
    # torchvision's defaults (min 320, max 640) leave 576x320 untouched.
    "fasterrcnn_mobilenet_v3_large_320_fpn": _Entry((576, 320), _TWO_STAGE),
    # Trained at short side 800; 768 keeps 16:9 on the stride-32 grid at about the same scale.
    "fasterrcnn_mobilenet_v3_large_fpn": _identity_resize(1344, 768, _TWO_STAGE),
    "retinanet_resnet50_fpn_v2": _identity_resize(1344, 768, _ONE_STAGE),
    "fcos_resnet50_fpn": _identity_resize(1344, 768, _ONE_STAGE),
}

NAMES: tuple[str, ...] = tuple(_MODELS)
# torchvision's image_mean (0.485, 0.456, 0.406) in uint8 RGB
_IMAGENET_MEAN_U8 = (124, 116, 104)


def coco_categories() -> tuple[str, ...]:
    """COCO class names by label index, as torchvision's detection weights define them.

    The list is static metadata of the weights enum: reading it downloads nothing.
    """
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

    return tuple(FasterRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"])


def input_spec(name: str) -> InputSpec:
    """What the model's own transform (`GeneralizedRCNNTransform`) does to a frame, at an
    input size where its inner resize is the identity.

    The transform takes RGB in [0, 1], resizes bilinearly (`interpolate`, no antialias: what
    OpenCV's `INTER_LINEAR` does) and normalises inside the model, so mean 0 and std 1 here.
    SSD stretches to its fixed size. The others keep the aspect ratio and batch images at the
    top-left of a canvas padded with zeros after normalising: the ImageNet mean colour here,
    which normalises to zero.
    """
    entry = _MODELS[name]
    if name.startswith("ssd"):
        return InputSpec(size=entry.size, letterbox=False, interpolation=Interpolation.BILINEAR)
    return InputSpec(
        size=entry.size,
        letterbox=True,
        pad_value=_IMAGENET_MEAN_U8,
        pad=PadPlacement.TOP_LEFT,
        interpolation=Interpolation.BILINEAR,
    )


def build(name: str, weights: str | None) -> Detector:
    """Builds the registered torchvision detector `name`.

    Args:
        name: one of `NAMES`.
        weights: None for random initialisation, "DEFAULT" for torchvision's pretrained COCO
            weights (downloaded, or taken from torch.hub's cache), otherwise a state dict path.

    Raises:
        ModelError: the weights cannot be had or do not fit.
    """
    import torchvision.models

    entry = _MODELS[name]
    weights_enum = torchvision.models.get_model_weights(name).DEFAULT
    class_names = tuple(str(c) for c in weights_enum.meta["categories"])
    # weights_backbone=None always: its default would download ImageNet weights. Pretrained
    # weights are loaded below, into the same module as a random build, so that every weights
    # source gives the same network (plain BatchNorm, not torchvision's frozen copy).
    module: torch.nn.Module = torchvision.models.get_model(
        name, weights=None, weights_backbone=None, num_classes=len(class_names), **entry.kwargs
    )
    if weights is not None:
        if weights == "DEFAULT":
            state = _weights.download_state_dict(weights_enum, model_name=name)
            source = str(weights_enum.url)
        else:
            state = _weights.read_state_dict(weights, model_name=name)
            source = weights
        _weights.apply_state_dict(module, state, source=source, model_name=name)
    module.eval()
    keep, report_as = coco_driving_view(class_names)
    return Detector(
        name=name,
        module=module,
        input=input_spec(name),
        class_names=class_names,
        keep_labels=keep,
        report_as=report_as,
        set_postprocess=lambda score, iou, k: _set_postprocess(module, score, iou, k),
        reduced_precision=entry.reduced_precision,
    )


def _set_postprocess(module: torch.nn.Module, score: float, iou: float, k: int) -> None:
    """Two-stage detectors keep these on their ROI heads, one-stage ones on themselves.

    The box limit `k` stays the model's own: it applies over all 91 COCO classes before the
    engine's driving-class filter, so lowering it would drop driving boxes on busy frames.
    """
    del k
    target = getattr(module, "roi_heads", module)
    for attr, value in (("score_thresh", score), ("nms_thresh", iou)):
        if not hasattr(target, attr):
            raise AttributeError(f"{type(module).__name__} has no {attr} to configure")
        setattr(target, attr, value)
