"""CPU preparation of a decoded frame for the model, exactly as its `InputSpec` says: resize
(area or bilinear), letterbox (centred or top-left) or stretch, channel order.

Everything here stays uint8 (4x less memory traffic than float); value scaling and mean/std
happen on the device (`engine/stages.to_model_input`).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from drivepercept.types import (
    ColorOrder,
    ImageU8,
    InputSpec,
    Interpolation,
    Letterbox,
    PadPlacement,
)


def plan_letterbox(src_size: tuple[int, int], spec: InputSpec) -> Letterbox:
    """Where a frame of `src_size` lands in the model input (pure geometry).

    A letterboxed frame is scaled by `min(dst_w / src_w, dst_h / src_h)` and its size rounded
    down to whole pixels, as the models' own preparations do (YOLOX's `int(w * r)`,
    torchvision's `interpolate(scale_factor=..., recompute_scale_factor=True)`): rounding to
    nearest gave a 1280x720 frame 569 columns where torchvision's transform gives 568. Where
    the exact product is a whole number, it is kept (`_floor`), while the models' float
    arithmetic may land one pixel lower (YOLOX makes a 768x432 frame 233 rows at 416x256, 234
    here): a one-row difference, not a different scale. The scales recorded are the exact
    ratios of the whole-pixel size, so that boxes map back to the pixels the resize sampled.
    """
    sw, sh = src_size
    dw, dh = spec.size
    if not spec.letterbox:
        return Letterbox(src_size, spec.size, dw / sw, dh / sh, 0.0, 0.0)
    scale = min(dw / sw, dh / sh)
    nw, nh = min(dw, max(1, _floor(sw * scale))), min(dh, max(1, _floor(sh * scale)))
    if spec.pad is PadPlacement.TOP_LEFT:
        left, top = 0, 0
    else:
        left, top = (dw - nw) // 2, (dh - nh) // 2
    return Letterbox(src_size, spec.size, nw / sw, nh / sh, float(left), float(top))


def _floor(x: float) -> int:
    """Rounded down, but a product that is a whole number up to float error stays whole
    (0.7 * 360 is 251.99999999999997 in floats: the sample rig's 252 rows, not 251)."""
    return math.floor(x + 1e-6)


def _filter(spec: InputSpec, shrinking: bool) -> int:
    if spec.interpolation is Interpolation.AREA and shrinking:
        return cv2.INTER_AREA
    return cv2.INTER_LINEAR


def prepare(image_bgr: ImageU8, spec: InputSpec) -> tuple[ImageU8, Letterbox]:
    """A BGR frame -> the model's uint8 input (H, W, 3) in its channel order, and where the
    frame sits in it."""
    dw, dh = spec.size
    out = np.empty((dh, dw, 3), np.uint8)
    return out, prepare_into(image_bgr, spec, out)


def prepare_into(image_bgr: ImageU8, spec: InputSpec, out: ImageU8) -> Letterbox:
    """`prepare`, written straight into `out` (a staging-ring row, (H, W, 3) uint8 at the
    model's input size): the resize lands in its place, the padding is filled around it and
    the channels are swapped in place, so the frame is written once."""
    h, w = image_bgr.shape[:2]
    box = plan_letterbox((w, h), spec)
    dw, dh = spec.size
    if out.shape != (dh, dw, 3) or out.dtype != np.uint8:
        raise ValueError(f"expected a uint8 ({dh}, {dw}, 3) row, got {out.dtype} {out.shape}")
    nw, nh = round(w * box.scale_x), round(h * box.scale_y)
    left, top = int(box.pad_x), int(box.pad_y)
    if (nw, nh) != (dw, dh):  # the pads around the frame; the frame's pixels come next
        pad = np.asarray(spec.pad_color, np.uint8)
        out[:top] = pad
        out[top + nh :] = pad
        out[top : top + nh, :left] = pad
        out[top : top + nh, left + nw :] = pad
    view = out[top : top + nh, left : left + nw]
    if (nw, nh) != (w, h):
        shrinking = nw * nh < w * h
        cv2.resize(image_bgr, (nw, nh), dst=view, interpolation=_filter(spec, shrinking))
    else:
        np.copyto(view, image_bgr)
    if spec.channels is ColorOrder.RGB:
        cv2.cvtColor(view, cv2.COLOR_BGR2RGB, dst=view)
    return box
