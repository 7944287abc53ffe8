"""CPU preparation of a decoded frame for the model: resize or letterbox, BGR -> RGB."""

from __future__ import annotations

import cv2
import numpy as np

from drivepercept.types import ImageU8, InputSpec, Letterbox


def plan_letterbox(src_size: tuple[int, int], spec: InputSpec) -> Letterbox:
    """Where a frame of `src_size` lands in the model input (pure geometry)."""
    sw, sh = src_size
    dw, dh = spec.size
    if not spec.letterbox:
        return Letterbox(src_size, spec.size, dw / sw, dh / sh, 0.0, 0.0)
    scale = min(dw / sw, dh / sh)
    nw, nh = max(1, round(sw * scale)), max(1, round(sh * scale))
    return Letterbox(
        src_size, spec.size, nw / sw, nh / sh, float((dw - nw) // 2), float((dh - nh) // 2)
    )


def prepare(image_bgr: ImageU8, spec: InputSpec) -> tuple[ImageU8, Letterbox]:
    """Resize/letterbox a BGR frame to `spec.size` and return it as RGB with its geometry."""
    h, w = image_bgr.shape[:2]
    box = plan_letterbox((w, h), spec)
    dw, dh = spec.size
    nw, nh = round(w * box.scale_x), round(h * box.scale_y)
    interp = cv2.INTER_AREA if nw < w else cv2.INTER_LINEAR
    resized = (
        image_bgr if (nw, nh) == (w, h) else cv2.resize(image_bgr, (nw, nh), interpolation=interp)
    )
    rgb = cv2.cvtColor(resized, cv2.COLOR_BGR2RGB)
    if (nw, nh) != (dw, dh):
        left, top = int(box.pad_x), int(box.pad_y)
        v = spec.pad_value
        rgb = cv2.copyMakeBorder(
            rgb, top, dh - nh - top, left, dw - nw - left, cv2.BORDER_CONSTANT, value=(v, v, v)
        )
    return np.ascontiguousarray(rgb), box
