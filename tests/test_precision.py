"""Mixed precision keeps geometry in float32 (engine/precision.py).

The detector here is torchvision's own RetinaNet machinery (anchor generator, box coder,
post-processing, `batched_nms`) at 1344x768 with 60 classes, so the half-precision failures
the module docstring names can happen to it. Its head reproduces a known crowded scene: for
every anchor that overlaps an object it gives that object's class a logit and the deltas that
decode (within a pixel of jitter) to the object's box, and it passes both through linear
layers that run in the reduced precision, as a real head's last layers would. The kept boxes
of a float32 run are then the scene's objects, and a reduced-precision run must keep the same
boxes: the logits and deltas carry half-precision error, the coordinates must not.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torchvision.models.detection import RetinaNet
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.image_list import ImageList
from torchvision.ops import box_iou

from drivepercept.config import PipelineConfig
from drivepercept.engine.precision import ReducedPrecision, set_reduced_precision, to_float32
from drivepercept.engine.step import DetectorStep
from drivepercept.models.base import Detector, InputSpec, ModelError

pytestmark = pytest.mark.timeout(120)

WIDTH, HEIGHT, CLASSES = 1344, 768, 60


class _Features(torch.nn.Module):
    """A cheap backbone: five maps at strides 8 to 128 (their values do not matter here)."""

    out_channels = 4

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 8, stride=8)
        self.down = torch.nn.ModuleList(
            [torch.nn.Conv2d(4, 4, 3, stride=2, padding=1) for _ in range(4)]
        )

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        maps = [self.stem(x)]
        for conv in self.down:
            maps.append(conv(maps[-1]))
        return OrderedDict((str(i), m) for i, m in enumerate(maps))


class _SceneHead(torch.nn.Module):
    """Logits and deltas of a fixed scene, through identity linear layers (in fp16/bf16
    under mixed precision, so they come out rounded as a real head's would)."""

    def __init__(self, logits: torch.Tensor, deltas: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("logits", logits)
        self.register_buffer("deltas", deltas)
        self.cls = torch.nn.Linear(logits.shape[-1], logits.shape[-1])
        self.reg = torch.nn.Linear(4, 4)
        with torch.no_grad():
            for layer in (self.cls, self.reg):
                layer.weight.copy_(torch.eye(layer.weight.shape[0]))
                layer.bias.zero_()

    def forward(self, features: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        n = features[0].shape[0]
        return {
            "cls_logits": self.cls(self.logits).expand(n, -1, -1),
            "bbox_regression": self.reg(self.deltas).expand(n, -1, -1),
        }


def _crowded_scene(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """~40 cars and pedestrians, neighbours overlapping but no same-class pair at IoU > 0.3."""
    rng = np.random.default_rng(seed)
    boxes: list[list[float]] = []
    labels: list[int] = []
    while len(boxes) < 40:
        pedestrian = rng.random() < 0.4
        w, h = (
            (rng.uniform(30, 60), rng.uniform(90, 180))
            if pedestrian
            else (
                rng.uniform(110, 260),
                rng.uniform(70, 140),
            )
        )
        x0, y0 = rng.uniform(0, WIDTH - w), rng.uniform(250, HEIGHT - h)
        box = [x0, y0, x0 + w, y0 + h]
        # labels >= 49: where fp16 overflowed torchvision's batched_nms offsets
        label = int(rng.integers(50, 60)) if pedestrian else int(rng.integers(1, 12))
        if boxes:
            iou = box_iou(torch.tensor([box]), torch.tensor(boxes))[0]
            same = torch.tensor(labels) == label
            if bool((iou[same] > 0.3).any()) or bool((iou > 0.6).any()):
                continue
        boxes.append(box)
        labels.append(label)
    return torch.tensor(boxes), torch.tensor(labels)


def _scene_detector() -> tuple[Detector, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    anchors = AnchorGenerator(
        sizes=((32,), (64,), (128,), (256,), (512,)), aspect_ratios=((0.5, 1.0, 2.0),) * 5
    )
    backbone = _Features()
    model = RetinaNet(
        backbone,
        num_classes=CLASSES,
        min_size=HEIGHT,
        max_size=WIDTH,
        anchor_generator=anchors,
        score_thresh=0.3,
        nms_thresh=0.5,
        detections_per_img=300,
    )
    image = torch.zeros(1, 3, HEIGHT, WIDTH)
    with torch.no_grad():
        feats = list(backbone(image).values())
        grid = anchors(ImageList(image, [(HEIGHT, WIDTH)]), feats)[0]
    gt, gt_labels = _crowded_scene()
    for _ in range(3):  # keep the objects that are some anchor's best match
        best_iou, best = box_iou(grid, gt).max(dim=1)
        covered = torch.zeros(len(gt), dtype=torch.bool)
        covered[best[best_iou > 0.45]] = True
        gt, gt_labels = gt[covered], gt_labels[covered]
    best_iou, best = box_iou(grid, gt).max(dim=1)
    on = best_iou > 0.45
    logits = torch.full((len(grid), CLASSES), -6.0)
    # distinct per object, falling with the anchor's overlap: one clear winner per object
    base = torch.linspace(1.5, 3.5, len(gt))[best]
    logits[on, gt_labels[best][on]] = base[on] + 2.0 * (best_iou[on] - 1.0)
    jitter = (torch.rand(len(grid), 4) - 0.5) * 1.0  # duplicates differ by under a pixel
    deltas = model.box_coder.encode_single(gt[best] + jitter, grid)
    model.head = _SceneHead(logits[None], deltas[None])
    model.eval()
    detector = Detector(
        name="scene-retinanet",
        module=model,
        input=InputSpec(size=(WIDTH, HEIGHT)),
        class_names=tuple(f"class{i}" for i in range(CLASSES)),
        reduced_precision=("backbone", "head"),
    )
    return detector, gt, gt_labels


def _kept(detector: Detector, precision: str, device: str = "cpu") -> tuple[np.ndarray, int]:
    config = PipelineConfig(
        device=device,
        precision=precision,
        score_threshold=0.3,
        max_detections=300,
        channels_last=False,
    )
    step = DetectorStep(detector, config, torch.device(device))
    packed, counts = step(torch.zeros(1, HEIGHT, WIDTH, 3, dtype=torch.uint8))
    n = int(counts[0])
    return packed[0, :n].numpy(), n


def _matched(a: np.ndarray, b: np.ndarray, tol_px: float) -> float:
    """Share of a's boxes with a box of the same label in b whose corners are within tol."""
    if len(a) == 0 or len(b) == 0:
        return 0.0
    close = np.abs(a[:, None, :4] - b[None, :, :4]).max(axis=2) <= tol_px
    same = a[:, None, 5] == b[None, :, 5]
    return float((close & same).any(axis=1).mean())


def _assert_same_as_fp32(detector: Detector, precision: str, device: str) -> None:
    ref, n_ref = _kept(detector, "fp32", device)
    got, n_got = _kept(detector, precision, device)
    assert n_got == n_ref
    assert _matched(ref, got, tol_px=2.0) == 1.0
    assert _matched(got, ref, tol_px=2.0) == 1.0


def test_fp32_run_keeps_the_scene() -> None:
    detector, gt, gt_labels = _scene_detector()
    kept, n = _kept(detector, "fp32")
    assert n == len(gt) >= 30
    truth = np.concatenate([gt.numpy(), np.zeros((n, 1)), gt_labels.numpy()[:, None]], axis=1)
    assert _matched(truth, kept, tol_px=1.0) == 1.0


def test_bf16_keeps_the_fp32_boxes_on_a_crowded_scene() -> None:
    detector, _, _ = _scene_detector()
    _assert_same_as_fp32(detector, "bf16", "cpu")


def test_whole_model_autocast_would_break_the_geometry() -> None:
    # the old behaviour, as a control: the same check fails when anchors, decoding and NMS
    # run in bf16 too (the test above could fail)
    detector, _, _ = _scene_detector()
    ref, n_ref = _kept(detector, "fp32")
    set_reduced_precision(detector.module, ("backbone", "head"), "fp32", torch.device("cpu"))
    whole = dataclasses.replace(detector, reduced_precision=None)
    got, n_got = _kept(whole, "bf16")
    assert n_got != n_ref or _matched(ref, got, tol_px=2.0) < 0.8


def test_reduced_precision_parts_are_wrapped_once_and_unwrapped_for_fp32() -> None:
    detector, _, _ = _scene_detector()
    model = detector.module
    cpu = torch.device("cpu")
    set_reduced_precision(model, ("backbone", "head"), "bf16", cpu)
    set_reduced_precision(model, ("backbone", "head"), "fp16", cpu)
    assert isinstance(model.backbone, ReducedPrecision)
    assert not isinstance(model.backbone.inner, ReducedPrecision)
    assert model.backbone.dtype is torch.float16
    set_reduced_precision(model, ("backbone", "head"), "fp32", cpu)
    assert isinstance(model.backbone, _Features) and isinstance(model.head, _SceneHead)
    with pytest.raises(ModelError, match="no submodule 'nothing_here'"):
        set_reduced_precision(model, ("nothing_here",), "bf16", cpu)
    with pytest.raises(ModelError, match=r"no submodule 'head\.nothing'"):
        set_reduced_precision(model, ("head.nothing",), "bf16", cpu)


def test_to_float32_reaches_into_containers() -> None:
    half = torch.ones(2, dtype=torch.bfloat16)
    out = to_float32(OrderedDict(a=[half, (half, torch.ones(1, dtype=torch.int64))]))
    assert isinstance(out, OrderedDict)
    assert out["a"][0].dtype is torch.float32 and out["a"][1][0].dtype is torch.float32
    assert out["a"][1][1].dtype is torch.int64


def test_every_registered_torchvision_detector_names_parts_it_has() -> None:
    from drivepercept.models import _torchvision

    cpu = torch.device("cpu")
    for name in _torchvision.NAMES:
        detector = _torchvision.build(name, weights=None)
        assert detector.reduced_precision
        set_reduced_precision(detector.module, detector.reduced_precision, "bf16", cpu)
        set_reduced_precision(detector.module, detector.reduced_precision, "fp32", cpu)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_keeps_the_fp32_boxes_on_cuda(precision: str) -> None:
    detector, _, _ = _scene_detector()
    _assert_same_as_fp32(detector, precision, "cuda")
