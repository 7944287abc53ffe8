"""What a box looks like, as a small vector the tracker can compare: the colours inside it.

A motion-only tracker cannot tell two objects apart where their boxes meet (a pedestrian
walking past a parked car's box, two cars crossing) and cannot know an object again after
it was hidden for a second; both were most of its identity switches. Each box's colours are
cheap to read from the frame the model already decoded, and they differ between most pairs
of objects and change little along one object's track. On the crossing drives' boxes (IoU >=
0.5 to one object, score >= 0.5, pairs 0.2-2 s apart) a cosine distance of 0.2 kept 97.5-99 %
of same-object pairs and separated 84-94 % of different-object pairs.

`box_features` gives, per box, two stacked halves (top and bottom: a pedestrian's shirt and
trousers, a truck's cab and box), each a histogram of the inner part of the box (15 % cut
from each side, 10 % from top and bottom: less background) read as 8 x 16 cells, each the
mean of 2 x 2 points of a grid over it (the arithmetic for a whole batch of frames at once,
one gather per frame): 12 hue bins weighted by saturation, 4 brightness bins weighted by its
lack (grey, black and white have no hue), each half normalised, square-rooted (Hellinger)
and the whole made a unit vector. A box too small to read (under 2 pixels inside) gets a
row of zeros: no appearance.
No learned weights: nothing to download, and the same on any frame source.

The tracking stage asks a `LooksReader` for its looks (`ColourLooks`, these colours, by
default): looks of another kind (a learned appearance; `scripts/probe_looks.py`'s, which
know the ground truth) plug in there, unit vectors compared as these are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import cv2
import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Features = npt.NDArray[np.float32]
ImageU8 = npt.NDArray[np.uint8]
IntArray = npt.NDArray[np.int64]

HUE_BINS = 12
VALUE_BINS = 4
BANDS = 2  # horizontal bands, top to bottom
CROP_W, CROP_H = 8, 16  # each box is read as this many cells (a grid over its inside) ...
SAMPLES = 2  # ... each the mean of SAMPLES x SAMPLES points
SIDE_CUT, END_CUT = 0.15, 0.10  # of the box's width and height, cut from each side
DIM = BANDS * (HUE_BINS + VALUE_BINS)
MAX_BOXES = 4096  # boxes read per frame at most (the others get no appearance)
_BAND = (np.arange(CROP_H) * BANDS // CROP_H)[:, None].repeat(CROP_W, axis=1).ravel()
# per 8-bit HSV channel value (OpenCV's hue runs 0-179): its hue bin, its brightness bin
# (after the hue bins), its saturation (a hue's weight) and its lack (a brightness's weight)
_LEVELS = np.arange(256)
_HUE_BIN = np.minimum(_LEVELS * HUE_BINS // 180, HUE_BINS - 1)
_VALUE_BIN = HUE_BINS + np.minimum(_LEVELS * VALUE_BINS // 256, VALUE_BINS - 1)
_SATURATION = _LEVELS.astype(np.float32) / 255.0
_GREY = 1.0 - _SATURATION


def box_features(image_bgr: ImageU8, xyxy: FloatArray) -> Features:
    """`(N, DIM)` the colour features of boxes `(N, 4)` (xyxy, pixels of `image_bgr`),
    unit rows; zeros for a box that is not finite or has under 2 pixels inside the image.

    Raises:
        ValueError: an image that is not (H, W, 3) uint8, or boxes not (N, 4).
    """
    return frames_features([(image_bgr, xyxy)])[0]


def _checked(image_bgr: ImageU8, xyxy: npt.ArrayLike) -> tuple[ImageU8, FloatArray]:
    """The image and its boxes as arrays, refused where they have the wrong shape."""
    image = np.ascontiguousarray(image_bgr)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be (H, W, 3) uint8, got {image.dtype} {image.shape}")
    boxes = np.asarray(xyxy, np.float64)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"boxes must have shape (N, 4), got {boxes.shape}")
    return image, boxes


def _grids(
    images: Sequence[ImageU8], boxes: FloatArray, frame: IntArray
) -> tuple[IntArray, IntArray, ImageU8]:
    """Which of all frames' `boxes` (each of frame `frame[i]`, in frame order) can be read
    (their rows, at most MAX_BOXES a frame), where each frame's start in them (`bounds`,
    one more than frames) and their grids of points `(R * CROP_H * SAMPLES, CROP_W *
    SAMPLES, 3)` stacked: the arithmetic for every box at once, one gather per frame."""
    shapes = np.array([image.shape[:2] for image in images], np.int64).reshape(-1, 2)
    height, width = shapes[frame, 0], shapes[frame, 1]
    with np.errstate(invalid="ignore", over="ignore"):
        size = boxes[:, 2:] - boxes[:, :2]
        inner = np.concatenate(
            [
                boxes[:, :2] + size * (SIDE_CUT, END_CUT),
                boxes[:, 2:] - size * (SIDE_CUT, END_CUT),
            ],
            axis=1,
        )
        inner = np.where(np.isfinite(inner), inner, -1.0)
    x1 = np.clip(inner[:, 0], 0, width).astype(np.int64)
    x2 = np.clip(inner[:, 2], 0, width).astype(np.int64)
    y1 = np.clip(inner[:, 1], 0, height).astype(np.int64)
    y2 = np.clip(inner[:, 3], 0, height).astype(np.int64)
    readable = np.isfinite(boxes).all(axis=1) & (x2 - x1 >= 2) & (y2 - y1 >= 2)
    # at most MAX_BOXES read in each frame: the first ones
    counts = np.cumsum(readable)
    first = np.searchsorted(frame, np.arange(len(images)))  # each frame's first box
    before = np.concatenate([[0], counts])[first]
    readable &= counts - before[frame] <= MAX_BOXES
    rows: IntArray = readable.nonzero()[0]
    wide, tall = CROP_W * SAMPLES, CROP_H * SAMPLES
    xs = x1[rows, None] + ((np.arange(wide) + 0.5) / wide)[None, :] * (x2 - x1)[rows, None]
    ys = y1[rows, None] + ((np.arange(tall) + 0.5) / tall)[None, :] * (y2 - y1)[rows, None]
    index = (
        ys.astype(np.int64)[:, :, None] * width[rows, None, None] + xs.astype(np.int64)[:, None, :]
    )
    grid = np.empty((len(rows), tall, wide, 3), np.uint8)
    bounds = np.searchsorted(frame[rows], np.arange(len(images) + 1))
    for k, image in enumerate(images):
        if bounds[k] < bounds[k + 1]:
            np.take(
                image.reshape(-1, 3),
                index[bounds[k] : bounds[k + 1]],
                axis=0,
                out=grid[bounds[k] : bounds[k + 1]],
                mode="clip",  # (every index is inside its image: no checking pass)
            )
    return rows, bounds, grid.reshape(len(rows) * tall, wide, 3)


def frames_features(frames: Sequence[tuple[ImageU8, npt.ArrayLike]]) -> list[Features]:
    """`box_features` of several frames' boxes ((image, boxes) pairs), one `(N_i, DIM)`
    each, in one pass: the tracking stage reads a whole batch's boxes with a handful of
    calls (each call's overhead, not its arithmetic, was most of the cost).

    Raises:
        ValueError: an image that is not (H, W, 3) uint8, or boxes not (N, 4).
    """
    checked = [_checked(image, boxes) for image, boxes in frames]
    sizes = [len(boxes) for _, boxes in checked]
    outs = [np.zeros((size, DIM), np.float32) for size in sizes]
    if not sum(sizes):
        return outs
    frame = np.repeat(np.arange(len(checked)), sizes)
    rows, bounds, grid = _grids(
        [image for image, _ in checked], np.concatenate([b for _, b in checked]), frame
    )
    n = len(rows)
    if not n:
        return outs
    # each cell the mean of its SAMPLES x SAMPLES points: one resize of the stacked grids
    crops = cv2.resize(grid, (CROP_W, n * CROP_H), interpolation=cv2.INTER_AREA)
    hsv = cv2.cvtColor(crops, cv2.COLOR_BGR2HSV).reshape(n, CROP_H * CROP_W, 3)
    bins = HUE_BINS + VALUE_BINS
    base = (np.arange(n)[:, None] * BANDS + _BAND[None, :]) * bins
    index = np.concatenate(
        [(base + _HUE_BIN[hsv[..., 0]]).ravel(), (base + _VALUE_BIN[hsv[..., 2]]).ravel()]
    )
    weight = np.concatenate([_SATURATION[hsv[..., 1]].ravel(), _GREY[hsv[..., 1]].ravel()])
    hist = np.bincount(index, weights=weight, minlength=n * BANDS * bins).astype(float)
    hist = hist.reshape(n, BANDS, bins)
    hist /= np.maximum(hist.sum(axis=2, keepdims=True), 1e-12)
    flat = np.sqrt(hist).reshape(n, DIM)
    flat /= np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
    start = 0
    for k, out in enumerate(outs):  # (each frame's rows are one run of them)
        out[rows[bounds[k] : bounds[k + 1]] - start] = flat[bounds[k] : bounds[k + 1]]
        start += sizes[k]
    return outs


def has_features(features: Features) -> npt.NDArray[np.bool_]:
    """`(K,)` which rows hold a feature (not all zeros)."""
    return np.asarray(features.any(axis=1), np.bool_)


def feature_distance(
    tracks: Features, boxes: Features, known: npt.NDArray[np.bool_] | None = None
) -> FloatArray:
    """`(T, N)` how unlike tracks' and boxes' features look (cosine distance, 0 to 2);
    0 where either has none (a row of zeros): nothing is known against the pair (`known`:
    the pairs where both have, if the caller has it already)."""
    has = has_features(tracks)[:, None] & has_features(boxes)[None, :] if known is None else known
    out: FloatArray = np.where(has, 1.0 - tracks @ boxes.T, 0.0).astype(np.float64)
    return out


def blend(old: Features, new: Features, momentum: float) -> Features:
    """Running appearances `old` `(K, D)` that take in `new` `(K, D)`: `momentum` of the old
    and the rest of the new, made unit again; a row with no appearance yet becomes the new."""
    blank = ~has_features(old)[:, None]
    mixed = np.where(blank, new, momentum * old + (1.0 - momentum) * new)
    out: Features = mixed / np.maximum(np.linalg.norm(mixed, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32)


@dataclass(frozen=True, eq=False)
class LooksRequest:
    """One frame's boxes whose looks the tracking stage wants (`LooksReader`).

    Attributes:
        camera: the frame's camera.
        frame_index: its index in that camera's stream.
        image: its original BGR pixels, or None where it has none (a reader that
            `needs_pixels` is only asked for frames that have them).
        xyxy: `(N, 4)` the boxes to read, in that image's pixels.
    """

    camera: str
    frame_index: int
    image: ImageU8 | None
    xyxy: FloatArray | npt.NDArray[np.float32]


class LooksReader(Protocol):
    """Where the tracking stage gets each box's looks (`RigTracker(looks=...)`): for a batch of
    frames' boxes, one `(N_i, D)` array each, unit rows (cosine distances are compared with
    the tracker's and the fusion's gates) or rows of zeros for boxes with no looks; `D` the
    same for every call. The default is `ColourLooks`; another reader (a learned appearance,
    or a probe's, `scripts/probe_looks.py`) plugs in here without touching the tracker."""

    @property
    def needs_pixels(self) -> bool:
        """Whether it reads the frames' pixels (the pipeline then keeps them for the stage)."""
        ...

    def __call__(self, frames: Sequence[LooksRequest]) -> list[Features]: ...


class ColourLooks:
    """The default `LooksReader`: `frames_features`, the colours inside each box."""

    @property
    def needs_pixels(self) -> bool:
        return True

    def __call__(self, frames: Sequence[LooksRequest]) -> list[Features]:
        reads = []
        for frame in frames:
            if frame.image is None:
                raise ValueError(f"{frame.camera} frame {frame.frame_index} has no pixels to read")
            reads.append((frame.image, frame.xyxy))
        return frames_features(reads) if reads else []


def read_looks(
    reader: LooksReader,
    asked: Sequence[LooksRequest],
    rows: Sequence[IntArray],
    sizes: Sequence[int],
) -> list[Features]:
    """`reader`'s looks of the `asked` boxes, one call for them all, each frame's placed at
    its `rows` in an array of its `sizes` boxes (rows of zeros for the others: not read).

    Raises:
        ValueError: a reader that gave the wrong number of arrays, or of rows.
    """
    if not asked:
        return []
    reads = reader(asked)
    if len(reads) != len(asked):
        raise ValueError(f"the looks reader gave {len(reads)} arrays for {len(asked)} frames")
    out = []
    for read, used, size in zip(reads, rows, sizes, strict=True):
        read = np.asarray(read, np.float32)
        if read.ndim != 2 or len(read) != len(used):
            raise ValueError(f"the looks reader gave {read.shape} for {len(used)} boxes")
        looks = np.zeros((size, read.shape[1]), np.float32)
        looks[used] = read
        out.append(looks)
    return out
