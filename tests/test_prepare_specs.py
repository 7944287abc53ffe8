"""Frames prepared exactly as each detector's `InputSpec` says (issue 12).

For every combination of placement (letterbox centred, letterbox top-left, stretch), resize
filter (area, bilinear), channel order (RGB, BGR) and value range (1, 255), with a per-channel
mean/std and pad colour in half of them: the pipeline's boxes equal those of the same model
run on a reference preparation written here independently (numpy/cv2 resize, manual padding,
channel swap and scaling; torch's bilinear `interpolate` too), mapped back by hand, and land
on the object's true position in the original frame. The detector is content-dependent: it
finds the red rectangle of a frame that also holds a blue one, so a wrong channel order finds
the blue one, and a wrong value range or mean/std finds nothing.

Then the two real preparations the specs stand for: torchvision's own transform (a Faster
R-CNN run on the raw frame against our preparation of it) and YOLOX's (pixel for pixel).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import pytest
import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from drivepercept.engine.stages import to_model_input
from drivepercept.models import _torchvision
from drivepercept.models.base import Detector
from drivepercept.models.yolox_weights import input_spec as yolox_input_spec
from drivepercept.run import RunOptions, run
from drivepercept.sources.prepare import prepare
from drivepercept.types import ColorOrder, ImageU8, InputSpec, Interpolation, PadPlacement

pytestmark = pytest.mark.timeout(120)

Box = tuple[int, int, int, int]  # xyxy, original-frame pixels
F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]


INPUT_SIZE = (320, 192)
BACKGROUND_BGR = (100, 100, 100)
TARGET_BGR = (30, 30, 230)  # red: what the detector looks for
DECOY_BGR = (230, 30, 30)  # blue: what it finds when the channels are swapped
# The detector's thresholds in uint8 levels: half-way between the rectangle and the background
# (an edge pixel blended half and half sits on both at once), and never on a whole level, so
# float rounding cannot put a pixel on different sides in different paths.
RED_ABOVE, BLUE_BELOW = 165.5, 64.5

# (target, decoy) per frame, per frame size. Edges sit on grids that every placement below maps
# onto whole input pixels (1280x720: x by 4, y by 60; 640x480: x by 10, y by 5; 160x120: by 5),
# so a correct preparation finds them to the pixel. The second frames touch the right and
# bottom edges, where a top-left letterbox starts its padding. 160x120 is enlarged.
SCENES: dict[tuple[int, int], tuple[tuple[Box, Box], ...]] = {
    (1280, 720): (
        ((200, 120, 520, 360), (800, 360, 1080, 600)),
        ((960, 420, 1280, 720), (40, 60, 360, 300)),
    ),
    (640, 480): (
        ((100, 80, 300, 240), (400, 260, 560, 420)),
        ((420, 300, 640, 480), (30, 40, 200, 200)),
    ),
    (160, 120): (
        ((20, 15, 70, 60), (95, 65, 140, 105)),
        ((110, 70, 160, 120), (10, 10, 50, 45)),
    ),
}
TRUE_TOLERANCE_PX = 2.0

# ------------------------------------------------------------------ the combinations

PLACEMENTS = ("center", "top-left", "stretch")
FILTERS = (Interpolation.AREA, Interpolation.BILINEAR)


def make_spec(
    placement: str, interpolation: Interpolation, channels: ColorOrder, value_range: float
) -> InputSpec:
    """One combination; half of them (for every channel order and range) also normalise with
    a mean/std and pad with a colour that differ per channel, given in the input's order. The
    means and stds are chosen so that, left out or applied to the wrong channels, they move
    the detector's thresholds past the rectangle's or the background's levels (it then finds
    nothing)."""
    normalised = (PLACEMENTS.index(placement) + FILTERS.index(interpolation)) % 2 == 0
    scale = value_range
    return InputSpec(
        size=INPUT_SIZE,
        mean=(0.10 * scale, 0.40 * scale, 0.30 * scale) if normalised else (0.0, 0.0, 0.0),
        std=(0.50 * scale, 0.25 * scale, 0.20 * scale) if normalised else (1.0, 1.0, 1.0),
        letterbox=placement != "stretch",
        pad_value=(0, 60, 120) if normalised else 114,
        interpolation=interpolation,
        pad=PadPlacement.TOP_LEFT if placement == "top-left" else PadPlacement.CENTER,
        channels=channels,
        value_range=value_range,
    )


COMBINATIONS: dict[str, InputSpec] = {
    f"{placement}-{interpolation.value}-{channels.value}-{value_range:g}": make_spec(
        placement, interpolation, channels, value_range
    )
    for placement, interpolation, channels, value_range in itertools.product(
        PLACEMENTS, FILTERS, (ColorOrder.RGB, ColorOrder.BGR), (1.0, 255.0)
    )
}
SPECS = [pytest.param(spec, id=name) for name, spec in COMBINATIONS.items()]

# ------------------------------------------------------------------ the detector


class RedRectangleFinder(torch.nn.Module):
    """Finds the red rectangle of each image as its spec prepares images: the pixels whose red
    channel is above `RED_ABOVE` and blue channel below `BLUE_BELOW`, both thresholds taken
    through the spec's channel order, value range and mean/std. Its box is the extent of those
    pixels, in input pixel edges (score 0.9, label 0; none when no pixel qualifies)."""

    def __init__(self, spec: InputSpec) -> None:
        super().__init__()
        self.red = 0 if spec.channels is ColorOrder.RGB else 2
        self.blue = 2 - self.red
        self.red_above = _model_level(spec, self.red, RED_ABOVE)
        self.blue_below = _model_level(spec, self.blue, BLUE_BELOW)

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        out = []
        for image in images:
            mask = (image[self.red] > self.red_above) & (image[self.blue] < self.blue_below)
            ys, xs = torch.nonzero(mask, as_tuple=True)
            if xs.numel():
                extent = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
                boxes = torch.stack(extent).to(torch.float32).reshape(1, 4)
            else:
                boxes = torch.zeros((0, 4), dtype=torch.float32, device=images.device)
            n = boxes.shape[0]
            out.append(
                {
                    "boxes": boxes,
                    "scores": torch.full((n,), 0.9, device=images.device),
                    "labels": torch.zeros(n, dtype=torch.int64, device=images.device),
                }
            )
        return out


def _model_level(spec: InputSpec, channel: int, level_u8: float) -> float:
    return (level_u8 / 255.0 * spec.value_range - spec.mean[channel]) / spec.std[channel]


def finder(spec: InputSpec) -> Detector:
    module = RedRectangleFinder(spec).eval()
    return Detector(name="red-rectangle", module=module, input=spec, class_names=("target",))


def find_boxes(spec: InputSpec, model_input: F32) -> F64:
    """The finder run directly on one (3, H, W) float input: boxes in input pixels."""
    with torch.inference_mode():
        found = RedRectangleFinder(spec)(torch.from_numpy(model_input)[None])[0]["boxes"]
    boxes: F64 = found.numpy().astype(np.float64)
    return boxes


# ------------------------------------------------------------------ the reference preparation


@dataclass(frozen=True)
class Placed:
    """Where the reference put a frame: its size in the input, and its top-left corner."""

    frame: tuple[int, int]  # (w, h)
    resized: tuple[int, int]  # (w, h)
    left: int
    top: int

    def to_original(self, boxes_in: F64) -> F64:
        (w, h), (nw, nh) = self.frame, self.resized
        out: F64 = boxes_in.reshape(-1, 4).astype(np.float64)
        out[:, 0::2] = (out[:, 0::2] - self.left) * (w / nw)
        out[:, 1::2] = (out[:, 1::2] - self.top) * (h / nh)
        out[:, 0::2] = out[:, 0::2].clip(0, w)
        out[:, 1::2] = out[:, 1::2].clip(0, h)
        return out


def reference_place(frame_size: tuple[int, int], spec: InputSpec) -> Placed:
    w, h = frame_size
    dw, dh = spec.size
    if not spec.letterbox:
        return Placed((w, h), (dw, dh), 0, 0)
    r = min(dw / w, dh / h)
    nw, nh = int(w * r), int(h * r)
    if spec.pad is PadPlacement.TOP_LEFT:
        return Placed((w, h), (nw, nh), 0, 0)
    return Placed((w, h), (nw, nh), (dw - nw) // 2, (dh - nh) // 2)


def reference_resize_cv2(frame_bgr: ImageU8, spec: InputSpec, place: Placed) -> ImageU8:
    (w, h), (nw, nh) = place.frame, place.resized
    shrinking = nw <= w and nh <= h
    area = spec.interpolation is Interpolation.AREA and shrinking
    flag = cv2.INTER_AREA if area else cv2.INTER_LINEAR
    return np.asarray(cv2.resize(frame_bgr, (nw, nh), interpolation=flag), np.uint8)


def reference_resize_torch(frame_bgr: ImageU8, place: Placed, mode: str) -> F64:
    """Bilinear (no antialias, pixel centres) or area resize by torch, unrounded floats."""
    nw, nh = place.resized
    x = torch.from_numpy(frame_bgr).permute(2, 0, 1)[None].to(torch.float64)
    if mode == "bilinear":
        y = F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)
    else:
        y = F.interpolate(x, size=(nh, nw), mode="area")
    out: F64 = y[0].permute(1, 2, 0).numpy()
    return out


def reference_canvas(resized_bgr: npt.NDArray[np.generic], spec: InputSpec, place: Placed) -> F64:
    """Channel swap by hand, then the resized frame on a canvas of the pad colour."""
    dw, dh = spec.size
    pixels = resized_bgr[..., ::-1] if spec.channels is ColorOrder.RGB else resized_bgr
    canvas = np.empty((dh, dw, 3), np.float64)
    canvas[...] = np.array(spec.pad_color, np.float64)
    nw, nh = place.resized
    canvas[place.top : place.top + nh, place.left : place.left + nw] = pixels
    return canvas


def reference_normalise(canvas: F64, spec: InputSpec) -> F32:
    """uint8 levels -> the value range, then mean/std per channel; (3, H, W) float32."""
    x = canvas * (spec.value_range / 255.0)
    x = (x - np.array(spec.mean)) / np.array(spec.std)
    out: F32 = np.ascontiguousarray(x.transpose(2, 0, 1), np.float32)
    return out


def pipeline_input(prepared: ImageU8, spec: InputSpec) -> F32:
    """What the engine makes of a prepared frame (`to_model_input`), as (3, H, W)."""
    x = to_model_input(
        torch.from_numpy(prepared)[None], mean=spec.mean, std=spec.std, value_range=spec.value_range
    )
    out: F32 = x[0].numpy()
    return out


# ------------------------------------------------------------------ frames and videos


def scene(size: tuple[int, int], index: int) -> ImageU8:
    w, h = size
    frame = np.empty((h, w, 3), np.uint8)
    frame[...] = BACKGROUND_BGR
    target, decoy = SCENES[size][index]
    for (x0, y0, x1, y1), colour in ((target, TARGET_BGR), (decoy, DECOY_BGR)):
        frame[y0:y1, x0:x1] = colour
    return frame


def texture(size: tuple[int, int], seed: int) -> ImageU8:
    """Noise: the frame on which every resize filter, placement and channel mix-up shows."""
    w, h = size
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@dataclass(frozen=True)
class Video:
    camera: str
    path: Path
    size: tuple[int, int]
    frames: tuple[ImageU8, ...]  # as decoded, the pixels the pipeline sees


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Video]:
    """One lossless (FFV1) video per frame size, read back the way the pipeline reads it."""
    folder = tmp_path_factory.mktemp("prepare-specs")
    out: dict[str, Video] = {}
    for size, frames in SCENES.items():
        camera = f"cam{size[0]}x{size[1]}"
        path = folder / f"{camera}.avi"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"FFV1"), 10, size)
        if not writer.isOpened():
            pytest.skip("this OpenCV build cannot write FFV1 video")
        written = [scene(size, i) for i in range(len(frames))]
        for frame in written:
            writer.write(frame)
        writer.release()
        capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
        decoded = []
        while True:
            ok, image = capture.read()
            if not ok:
                break
            decoded.append(np.asarray(image, np.uint8))
        capture.release()
        assert len(decoded) == len(written)
        for a, b in zip(decoded, written, strict=True):
            np.testing.assert_array_equal(a, b)  # lossless: the true positions hold
        out[camera] = Video(camera, path, size, tuple(decoded))
    return out


# ------------------------------------------------------------------ preparation, pixel for pixel


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("size", list(SCENES), ids=lambda s: f"{s[0]}x{s[1]}")
def test_prepare_equals_the_reference_preparation(spec: InputSpec, size: tuple[int, int]) -> None:
    # given a noise frame (every filter, placement and channel mix-up shows on it)
    frame = texture(size, seed=size[0])
    place = reference_place(size, spec)
    # when the pipeline prepares it on the CPU and normalises it as the engine does
    prepared, box = prepare(frame, spec)
    # then the uint8 input is the reference's pixel for pixel (padding colour included)
    resized = reference_resize_cv2(frame, spec, place)
    canvas = reference_canvas(resized, spec, place)
    np.testing.assert_array_equal(prepared, canvas.astype(np.uint8))
    # and the geometry it records is where the reference put the frame
    assert (box.pad_x, box.pad_y) == (place.left, place.top)
    assert (box.scale_x, box.scale_y) == pytest.approx(
        (place.resized[0] / size[0], place.resized[1] / size[1]), rel=1e-12
    )
    # and the float input is the reference's value range and mean/std per channel
    np.testing.assert_allclose(
        pipeline_input(prepared, spec), reference_normalise(canvas, spec), rtol=0, atol=1e-4
    )
    # and the resize is the filter the spec names, as torch computes it too (where torch has
    # it: bilinear always, area for whole-number shrink factors), within a rounding level
    nw, nh = place.resized
    shrink_whole = size[0] % nw == 0 and size[1] % nh == 0 and nw < size[0]
    if spec.interpolation is Interpolation.BILINEAR or shrink_whole:
        mode = "bilinear" if spec.interpolation is Interpolation.BILINEAR else "area"
        by_torch = reference_canvas(reference_resize_torch(frame, place, mode), spec, place)
        assert float(np.abs(prepared - by_torch).max()) <= 1.0


# ------------------------------------------------------------------ the pipeline, end to end


@pytest.mark.parametrize("spec", SPECS)
def test_pipeline_boxes_equal_the_model_on_the_reference_preparation(
    spec: InputSpec, videos: dict[str, Video], tmp_path: Path
) -> None:
    # given videos of 1280x720, 640x480 and 160x120 frames with a red and a blue rectangle,
    # and a detector that finds the red one as its spec prepares frames
    cameras = list(videos.values())
    # when they run through the pipeline
    result = run(
        RunOptions(
            sources=tuple(str(v.path) for v in cameras),
            weights=None,
            settings={"device": "cpu", "sample_hz": 0.0, "warmup": False},
            out_root=tmp_path,
            report_formats=(),
        ),
        detector=finder(spec),
    )
    frames = list(result.detections())
    assert result.failure() is None
    assert sorted((f["camera"], f["frame_index"]) for f in frames) == sorted(
        (v.camera, i) for v in cameras for i in range(len(v.frames))
    )
    for got in frames:
        video = videos[got["camera"]]
        decoded = video.frames[got["frame_index"]]
        place = reference_place(video.size, spec)
        where = f"{video.camera} frame {got['frame_index']}"
        pipeline_boxes = np.array(got["boxes"], np.float64).reshape(-1, 4)
        assert got["class_names"] == ["target"], where
        # then its boxes are the model's on the reference preparation, mapped back by hand
        resized = reference_resize_cv2(decoded, spec, place)
        reference_in = reference_normalise(reference_canvas(resized, spec, place), spec)
        expected = place.to_original(find_boxes(spec, reference_in))
        assert expected.shape == (1, 4), where
        np.testing.assert_allclose(pipeline_boxes, expected, rtol=0, atol=1.0, err_msg=where)
        # and those of the model on torch's bilinear resize (unrounded), for bilinear specs
        if spec.interpolation is Interpolation.BILINEAR:
            by_torch = reference_resize_torch(decoded, place, "bilinear")
            torch_in = reference_normalise(reference_canvas(by_torch, spec, place), spec)
            np.testing.assert_allclose(
                pipeline_boxes,
                place.to_original(find_boxes(spec, torch_in)),
                rtol=0,
                atol=1.0,
                err_msg=where,
            )
        # and they land on the red rectangle in the original frame (padding never counts)
        true_box = np.array(SCENES[video.size][got["frame_index"]][0], np.float64)
        np.testing.assert_allclose(
            pipeline_boxes[0], true_box, rtol=0, atol=TRUE_TOLERANCE_PX, err_msg=where
        )


# ------------------------------------------------------------------ torchvision's own transform

TORCHVISION_MODEL = "fasterrcnn_mobilenet_v3_large_320_fpn"


def _rgb01(frame_bgr: ImageU8) -> torch.Tensor:
    rgb = np.ascontiguousarray(frame_bgr[..., ::-1])
    return torch.from_numpy(rgb).permute(2, 0, 1).to(torch.float32).div(255.0)


def _street(size: tuple[int, int], seed: int) -> ImageU8:
    """Smooth coloured blocks: content a convolutional network responds to."""
    w, h = size
    rng = np.random.default_rng(seed)
    frame = np.full((h, w, 3), 90, np.uint8)
    for _ in range(14):
        x0, y0 = int(rng.integers(0, w - 60)), int(rng.integers(0, h - 60))
        bw, bh = int(rng.integers(w // 20, w // 4)), int(rng.integers(h // 12, h // 3))
        frame[y0 : y0 + bh, x0 : x0 + bw] = rng.integers(0, 256, 3)
    return np.asarray(cv2.GaussianBlur(frame, (0, 0), 2.0), np.uint8)


def test_torchvision_sees_the_frame_and_maps_boxes_back_as_its_own_transform() -> None:
    # given the registered Faster R-CNN with random weights (fixed seed), keeping every box
    torch.manual_seed(0)
    detector = _torchvision.build(TORCHVISION_MODEL, None)
    module: Any = detector.module  # a FasterRCNN: its transform and heads are used below
    module.roi_heads.score_thresh = 0.001
    spec = detector.input
    frames = [_street((1280, 720), 0), _street((640, 480), 1)]
    with torch.inference_mode():
        # when (a) the frames go through our preparation, the module and Letterbox.to_original
        prepared = [prepare(f, spec) for f in frames]
        ours_in = to_model_input(
            torch.from_numpy(np.stack([p for p, _ in prepared])),
            mean=spec.mean,
            std=spec.std,
            value_range=spec.value_range,
        )
        ours = module(ours_in)
        # and (b) the raw RGB 0-1 frames go through the module alone: its own transform
        # resizes them and batches them top-left on one zero canvas (as wide as our input)
        raw = [_rgb01(f) for f in frames]
        theirs = module(raw)
        ours_batch, _ = module.transform(ours_in)
        their_batch, _ = module.transform(raw)
    # then the network sees the same pixels either way: the same canvas, each frame at the
    # size our letterbox gave it, within a uint8 rounding level (normalised by std)
    assert ours_batch.tensors.shape == their_batch.tensors.shape == (2, 3, 320, 576)
    for i, (_, box) in enumerate(prepared):
        h, w = their_batch.image_sizes[i]
        src_w, src_h = box.src_size
        assert (round(src_w * box.scale_x), round(src_h * box.scale_y)) == (w, h)
        diff = (ours_batch.tensors[i] - their_batch.tensors[i]).abs()
        assert float(diff[:, :h, :w].max()) < 0.03  # 1/255/0.225 = 0.017: a rounding level
        assert float(diff.max()) < 0.03  # padding: the mean colour, zero once normalised
        # and boxes found in that image map back to the pixels its own postprocess gives
        corners = torch.rand((50, 2, 2), generator=torch.Generator().manual_seed(i))
        in_image = (corners * torch.tensor([w, h], dtype=torch.float32)).sort(dim=1).values
        boxes = in_image.reshape(-1, 4)
        mapped = module.transform.postprocess([{"boxes": boxes}], [(h, w)], [(src_h, src_w)])
        np.testing.assert_allclose(
            box.to_original(boxes.numpy()), mapped[0]["boxes"].numpy(), rtol=0, atol=0.01
        )
    # and end to end most of the 100 boxes kept are the raw run's within 1 px, same label. Not
    # all, nor a top-N by score: at random initialisation the classifier is blind to content
    # (every box scores the same, to five digits), so which boxes fill the 100 kept is a tie
    # broken by rounding noise (77-94% matched over a few seeds and frames)
    for i, (_, box) in enumerate(prepared):
        mine = box.to_original(ours[i]["boxes"].numpy())
        ref = theirs[i]["boxes"].numpy()
        assert len(mine) == len(ref) == 100
        iou = box_iou(torch.from_numpy(mine), torch.from_numpy(ref))
        overlap, best = iou.max(dim=1)
        close = np.abs(mine - ref[best.numpy()]).max(axis=1) <= 1.0
        same = (ours[i]["labels"] == theirs[i]["labels"][best]).numpy()
        matched = (overlap.numpy() > 0.9) & close & same
        assert matched.mean() >= 0.7, f"frame {box.src_size}: {matched.mean():.2f} matched"


# ------------------------------------------------------------------ YOLOX's own preparation


def yolox_reference(frame_bgr: ImageU8, size: tuple[int, int]) -> tuple[F32, float]:
    """YOLOX's `preproc`: resize by r = min(h_in / h, w_in / w) (`int` sizes, INTER_LINEAR),
    top-left on a canvas of 114, BGR float 0-255, (3, H, W); and r."""
    w_in, h_in = size
    h, w = frame_bgr.shape[:2]
    r = min(h_in / h, w_in / w)
    resized = cv2.resize(frame_bgr, (int(w * r), int(h * r)), interpolation=cv2.INTER_LINEAR)
    canvas = np.full((h_in, w_in, 3), 114, np.uint8)
    canvas[: resized.shape[0], : resized.shape[1]] = resized
    out: F32 = np.ascontiguousarray(canvas.transpose(2, 0, 1), np.float32)
    return out, r


def test_yolox_preparation_equals_yolox_preproc_pixel_for_pixel(yolox_nano_onnx: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(yolox_nano_onnx), providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0].name
    spec = yolox_input_spec((416, 416))
    for size in ((1280, 720), (1920, 1080), (640, 480)):
        # given a noise frame
        frame = texture(size, seed=size[1])
        # when it is prepared as the spec says and normalised as the engine does
        prepared, box = prepare(frame, spec)
        ours = pipeline_input(prepared, spec)
        # then the input is YOLOX's own preparation pixel for pixel
        theirs, r = yolox_reference(frame, spec.size)
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{size}")
        # and so the network's output is the same, to the bit
        out_ours = session.run(None, {feed: ours[None]})[0]
        out_theirs = session.run(None, {feed: theirs[None]})[0]
        np.testing.assert_array_equal(out_ours, out_theirs)
        # and boxes map back as YOLOX's demo does it (divided by r)
        whole = np.array([[0.0, 0.0, size[0] * r, size[1] * r]])
        np.testing.assert_allclose(box.to_original(whole), whole / r, atol=0.01)


def test_the_combinations_are_all_there() -> None:
    # 24 distinct specs, half of them normalised, each channel order and range in both halves
    specs = list(COMBINATIONS.values())
    assert len(set(specs)) == 24
    normalised = {(s.channels, s.value_range) for s in specs if s.mean != (0.0, 0.0, 0.0)}
    assert len(normalised) == 4 and sum(s.mean != (0.0, 0.0, 0.0) for s in specs) == 12
