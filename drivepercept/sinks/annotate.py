"""Drawing one camera frame's detections: box outlines, a label per box, a header line.

Boxes are drawn largest first, so that smaller boxes stay visible over larger ones; labels are
drawn after every box, each where `video_labels.place_labels` puts it, so that no label hides
another's id (nor the header). `draw_detections` draws on a copy at the frame's own size;
`annotated_tile` letterboxes the frame into a mosaic or window tile first, so that the text
stays readable when the tile is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from drivepercept.sinks.video_labels import Rect, label_texts, place_labels
from drivepercept.types import Detections, FrameResult, ImageU8

_FONT = cv2.FONT_HERSHEY_SIMPLEX
# BGR, bright and distinct; a label's colour is _PALETTE[label % len(_PALETTE)].
_PALETTE: tuple[tuple[int, int, int], ...] = (
    (56, 56, 255),
    (151, 157, 255),
    (31, 112, 255),
    (29, 178, 255),
    (49, 210, 207),
    (10, 249, 72),
    (23, 204, 146),
    (134, 219, 61),
    (52, 147, 26),
    (187, 212, 0),
    (168, 153, 44),
    (255, 194, 0),
    (147, 69, 52),
    (255, 115, 100),
    (236, 24, 0),
    (255, 56, 132),
    (133, 0, 82),
    (255, 56, 203),
    (200, 149, 255),
    (199, 55, 255),
)


def check_image(image_bgr: ImageU8) -> None:
    """Raise ValueError unless `image_bgr` is a uint8 (H, W, 3) image."""
    if image_bgr.dtype != np.uint8 or image_bgr.ndim != 3 or image_bgr.shape[2] != 3:
        raise ValueError(
            f"image must be uint8 (H, W, 3) BGR, got {image_bgr.dtype} {image_bgr.shape}"
        )


@dataclass(frozen=True)
class _Style:
    """Text and line sizes for an image of a given height."""

    scale: float
    text_thickness: int
    line_thickness: int

    @classmethod
    def for_height(cls, height: int) -> _Style:
        scale = max(0.35, height / 900.0)
        return cls(scale, 1 if scale < 0.8 else 2, max(1, round(height / 360.0)))


def _strip_size(text: str, *, scale: float, thickness: int) -> tuple[int, int, int]:
    """(width, height) of the filled strip a label of `text` is drawn on, and the text's
    baseline (pixels its descenders reach below where it is written)."""
    (text_w, text_h), baseline = cv2.getTextSize(text, _FONT, scale, thickness)
    return text_w + 3, text_h + baseline + 3, baseline


def _draw_label(
    image: ImageU8,
    text: str,
    rect: Rect,
    *,
    baseline: int,
    color: tuple[int, int, int],
    scale: float,
    thickness: int,
) -> None:
    """Draw `text` on a strip filling `rect` (pixel edges, as `video_labels` places them)."""
    x1, y1, x2, y2 = rect
    cv2.rectangle(image, (x1, y1), (x2 - 1, y2 - 1), color, cv2.FILLED)
    ink = (0, 0, 0) if sum(color) > 3 * 140 else (255, 255, 255)
    cv2.putText(image, text, (x1 + 1, y2 - baseline - 2), _FONT, scale, ink, thickness, cv2.LINE_AA)


@dataclass(frozen=True)
class _Layout:
    """What `draw_detections` draws: per drawn box, in drawing order (largest first)."""

    indices: list[int]  # into the detections
    boxes: list[Rect]  # pixel edges, clipped to the image
    texts: list[str]
    baselines: list[int]
    labels: list[Rect]
    header: Rect | None
    header_baseline: int


def _pixel_box(xyxy: list[float], width: int, height: int) -> Rect:
    """A box's pixel edges clipped to the image, at least one pixel each way."""
    x1, y1, x2, y2 = xyxy
    left = math.floor(min(max(x1, 0.0), width))
    top = math.floor(min(max(y1, 0.0), height))
    right = max(left + 1, math.ceil(min(max(x2, 0.0), width)))
    bottom = max(top + 1, math.ceil(min(max(y2, 0.0), height)))
    return left, top, right, bottom


def _layout(detections: Detections, width: int, height: int, header: str, style: _Style) -> _Layout:
    boxes = detections.xyxy.reshape(-1, 4).astype(np.float64).tolist()
    drawn = [i for i, box in enumerate(boxes) if all(math.isfinite(v) for v in box)]
    pixel = {i: _pixel_box(boxes[i], width, height) for i in drawn}
    # larger first, so small boxes (and, later, every label) are drawn over large boxes' lines
    drawn.sort(key=lambda i: -(pixel[i][2] - pixel[i][0]) * (pixel[i][3] - pixel[i][1]))
    all_texts = label_texts(detections)
    texts = [all_texts[i] for i in drawn]
    reserved: list[Rect] = []
    header_rect: Rect | None = None
    header_baseline = 0
    if header:
        header_w, header_h, header_baseline = _strip_size(
            header, scale=style.scale * 1.2, thickness=style.text_thickness
        )
        header_rect = (0, 0, header_w, header_h)
        reserved.append(header_rect)
    sizes = [_strip_size(t, scale=style.scale, thickness=style.text_thickness) for t in texts]
    rects = [pixel[i] for i in drawn]
    labels = place_labels(rects, [(w, h) for w, h, _ in sizes], (width, height), reserved=reserved)
    baselines = [b for _, _, b in sizes]
    return _Layout(drawn, rects, texts, baselines, labels, header_rect, header_baseline)


def label_rects(
    detections: Detections, image_size: tuple[int, int], *, header: str = ""
) -> list[Rect | None]:
    """Where `draw_detections` puts each box's label on an image of `image_size` (w, h): a
    rectangle in pixel edges per box (None for a box it skips)."""
    width, height = image_size
    layout = _layout(detections, width, height, header, _Style.for_height(height))
    rects: list[Rect | None] = [None] * len(detections)
    for index, rect in zip(layout.indices, layout.labels, strict=True):
        rects[index] = rect
    return rects


def draw_detections(image_bgr: ImageU8, detections: Detections, *, header: str = "") -> ImageU8:
    """A copy of `image_bgr` with each box, its "id name score" label and a header line drawn on.

    Boxes are xyxy in the image's pixels (pixel edges, as everywhere in drivepercept); the outline
    covers the box's edge pixels, largest box first so that smaller ones stay visible on top.
    A predicted frame's boxes (the tracker's, `Detections.predicted`) are drawn as their four
    corners. Labels are drawn after every box, each on a filled strip placed by
    `video_labels.place_labels`: above its box where that is free, else inside its top, below
    it or a little further away, so that no label hides another's id or the header (top-left
    corner). Boxes with non-finite coordinates are skipped. Line and text sizes follow the
    image height.

    Args:
        image_bgr: (H, W, 3) uint8 BGR image; it is not modified.
        detections: the boxes to draw.
        header: one line of text for the top-left corner ("" draws none).

    Returns:
        The annotated copy.
    """
    check_image(image_bgr)
    out: ImageU8 = image_bgr.copy()
    height, width = out.shape[:2]
    style = _Style.for_height(height)
    layout = _layout(detections, width, height, header, style)
    labels = detections.labels.tolist()
    colors = [_PALETTE[int(labels[i]) % len(_PALETTE)] for i in layout.indices]
    for (left, top, right, bottom), color in zip(layout.boxes, colors, strict=True):
        if detections.predicted:  # the tracker's box, not the model's: its corners only
            _corners(out, (left, top, right - 1, bottom - 1), color, style.line_thickness)
        else:
            cv2.rectangle(out, (left, top), (right - 1, bottom - 1), color, style.line_thickness)
    for text, rect, baseline, color in zip(
        layout.texts, layout.labels, layout.baselines, colors, strict=True
    ):
        _draw_label(
            out,
            text,
            rect,
            baseline=baseline,
            color=color,
            scale=style.scale,
            thickness=style.text_thickness,
        )
    if layout.header is not None:
        _draw_label(
            out,
            header,
            layout.header,
            baseline=layout.header_baseline,
            color=(32, 32, 32),
            scale=style.scale * 1.2,
            thickness=style.text_thickness,
        )
    return out


def _corners(image: ImageU8, box: Rect, color: tuple[int, int, int], thickness: int) -> None:
    """A box drawn as its four corners (a quarter of each side): a predicted box."""
    x1, y1, x2, y2 = box
    dx, dy = max(2, (x2 - x1) // 4), max(2, (y2 - y1) // 4)
    for x, y, sx, sy in ((x1, y1, 1, 1), (x2, y1, -1, 1), (x1, y2, 1, -1), (x2, y2, -1, -1)):
        cv2.line(image, (x, y), (x + sx * dx, y), color, thickness)
        cv2.line(image, (x, y), (x, y + sy * dy), color, thickness)


def frame_header(result: FrameResult) -> str:
    """The header line of an annotated frame: camera, frame index, end-to-end latency, and
    "predicted" for a frame the tracker answered (a detection interval)."""
    predicted = "  predicted" if result.detections.predicted else ""
    header = f"{result.camera}  #{result.frame_index}  {result.timing.end_to_end_ms:.1f} ms"
    return header + predicted


def _letterbox(image: ImageU8, size: tuple[int, int]) -> tuple[ImageU8, float, int, int]:
    """`image` scaled to fit `size` (w, h) keeping its aspect -> (resized, scale, pad_x, pad_y)."""
    tile_w, tile_h = size
    height, width = image.shape[:2]
    scale = min(tile_w / width, tile_h / height)
    new_w = max(1, min(tile_w, round(width * scale)))
    new_h = max(1, min(tile_h, round(height * scale)))
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)
    return np.asarray(resized, dtype=np.uint8), scale, (tile_w - new_w) // 2, (tile_h - new_h) // 2


def annotated_tile(
    result: FrameResult, image_bgr: ImageU8, size: tuple[int, int], *, header: str | None = None
) -> ImageU8:
    """The frame letterboxed into a (w, h) tile, then annotated (text stays readable when
    small)."""
    resized, scale, pad_x, pad_y = _letterbox(image_bgr, size)
    det = result.detections
    scaled = Detections(
        (det.xyxy.reshape(-1, 4) * np.float32(scale)).astype(np.float32),
        det.scores,
        det.labels,
        det.class_names,
        track_ids=det.track_ids,
        global_ids=det.global_ids,
    )
    tile_w, tile_h = size
    tile = np.zeros((tile_h, tile_w, 3), np.uint8)
    annotated = draw_detections(resized, scaled, header=header or frame_header(result))
    tile[pad_y : pad_y + annotated.shape[0], pad_x : pad_x + annotated.shape[1]] = annotated
    return tile
