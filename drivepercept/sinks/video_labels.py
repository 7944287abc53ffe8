"""Where an annotated frame's labels go: their text and their place, as pure functions (no pixels).

A label is a filled strip reading "<id> <class> <score>": `#3 car 0.87` for a box with an object
id across the rig, `c5 car 0.87` for one with only its camera's track, `car 0.87` for an
untracked box. The id comes first so that it is the part left visible should a label ever be
cut by the image edge.

Labels are placed so that none covers another: each tries above its box, then inside the box's
top, then below it, then steps up and down from above by its own height, always kept inside the
image. Smaller boxes place theirs first: a small box has no room inside for its label and its
label is what tells it apart, while a large box can take its label inside its top.

All rectangles here are `(x1, y1, x2, y2)` in integer pixel edges: x2 and y2 are exclusive, so
a rectangle's width is `x2 - x1`.
"""

from __future__ import annotations

from collections.abc import Sequence

from drivepercept.types import Detections

Rect = tuple[int, int, int, int]

MAX_NUDGES = 8  # vertical steps tried once above, inside and below are all taken


def label_texts(detections: Detections) -> list[str]:
    """Each box's label, id first: "#3 car 0.87" (its object across the rig, where fusion placed
    it), "c5 car 0.87" (its track in its camera), or "car 0.87" (untracked)."""
    n = len(detections)
    tracks = detections.track_ids.tolist() if detections.track_ids is not None else [-1] * n
    rig = detections.global_ids.tolist() if detections.global_ids is not None else [-1] * n
    texts = []
    for name, score, g, t in zip(
        detections.names, detections.scores.tolist(), rig, tracks, strict=True
    ):
        ident = f"#{g} " if g >= 0 else f"c{t} " if t >= 0 else ""
        texts.append(f"{ident}{name} {score:.2f}")
    return texts


def overlap_area(a: Rect, b: Rect) -> int:
    """Pixels two rectangles share (0 when they only touch)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def _candidate_tops(box: Rect, label_h: int, image_h: int, max_nudges: int) -> list[int]:
    """The label's top rows to try for `box`, best first, each inside the image."""
    _, top, _, bottom = box
    lowest = max(0, image_h - label_h)
    tops: list[int] = []
    if top - label_h >= 0:
        tops.append(top - label_h)  # above the box, its bottom on the box's top edge
    if top + label_h <= image_h:
        tops.append(max(0, top))  # inside the box's top
    if bottom + label_h <= image_h:
        tops.append(bottom)  # below the box
    base = _clamp(top - label_h, 0, lowest)
    step = max(1, label_h)
    for k in range(1, max_nudges + 1):  # up, down, further up, further down, ...
        offset = step * ((k + 1) // 2) * (-1 if k % 2 else 1)
        tops.append(base + offset)
    # in order, without repeats; inside the image even for a box that is not
    return list(dict.fromkeys(_clamp(t, 0, lowest) for t in tops))


def place_labels(
    boxes: Sequence[Rect],
    text_sizes: Sequence[tuple[int, int]],
    image_size: tuple[int, int],
    *,
    reserved: Sequence[Rect] = (),
    max_nudges: int = MAX_NUDGES,
) -> list[Rect]:
    """Each box's label rectangle, so that no two labels (nor a label and `reserved`) overlap.

    Boxes place their labels smallest first (by area). A label keeps its box's left edge (moved
    left where it would leave the image) and takes the first free place of: above the box,
    inside its top, below it, then `max_nudges` vertical steps of its own height around "above".
    Where none is free (a very crowded frame) it takes the tried place that overlaps placed
    labels least. Every label lies inside the image, unless it is larger than the image.

    Args:
        boxes: each box as pixel edges `(x1, y1, x2, y2)`, inside the image.
        text_sizes: each label's `(width, height)` in pixels, parallel to `boxes`.
        image_size: `(width, height)` of the image.
        reserved: rectangles no label may cover (e.g. the frame's header).
        max_nudges: vertical steps tried after above, inside and below.

    Returns:
        The label rectangles, parallel to `boxes`.

    Raises:
        ValueError: `boxes` and `text_sizes` differ in length.
    """
    if len(boxes) != len(text_sizes):
        raise ValueError(
            f"one text size per box: got {len(boxes)} boxes and {len(text_sizes)} sizes"
        )
    image_w, image_h = image_size
    taken: list[Rect] = list(reserved)
    placed: list[Rect] = [(0, 0, 0, 0)] * len(boxes)
    order = sorted(range(len(boxes)), key=lambda i: _area(boxes[i]))  # stable: ties keep order
    for i in order:
        box = boxes[i]
        label_w, label_h = text_sizes[i]
        x = _clamp(box[0], 0, max(0, image_w - label_w))
        # the label keeps this column, so only what shares it can be in the way: (shared
        # width, top, bottom) of each
        column = [
            (min(x + label_w, r[2]) - max(x, r[0]), r[1], r[3])
            for r in taken
            if r[0] < x + label_w and x < r[2]
        ]
        tops = _candidate_tops(box, label_h, image_h, max_nudges)
        free = (y for y in tops if not any(a < y + label_h and y < b for _, a, b in column))
        y = next(free, None)
        if y is None:  # crowded: the tried place that overlaps placed labels least
            y = min(tops, key=lambda t: _covered(t, t + label_h, column))
        placed[i] = (x, y, x + label_w, y + label_h)
        taken.append(placed[i])
    return placed


def _covered(top: int, bottom: int, column: list[tuple[int, int, int]]) -> int:
    """Pixels of rows [top, bottom) of a column that the (width, top, bottom) strips cover."""
    return sum(w * max(0, min(bottom, b) - max(top, a)) for w, a, b in column)


def _area(box: Rect) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])
