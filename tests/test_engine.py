"""The engine's stages and its buffer discipline, on the CPU and (marked `cuda`) on a GPU."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from fakereaders import FakeReader

from drivepercept.buffers import StagingRing
from drivepercept.config import PipelineConfig
from drivepercept.engine.stages import postprocess, to_model_input
from drivepercept.models.base import Detector, InputSpec
from drivepercept.pipeline import Pipeline
from drivepercept.types import FrameResult

pytestmark = pytest.mark.timeout(120)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class MeanDetector(torch.nn.Module):
    """One box per image whose score is the image's mean pixel (0-1) and whose label is
    the batch row: proves that each row held the pixels of its own frame."""

    def __init__(self, work: int = 0) -> None:
        super().__init__()
        self.work = work

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        x = images
        for _ in range(self.work):  # optional busy work so device spans are measurable
            x = torch.nn.functional.avg_pool2d(x, 3, stride=1, padding=1)
        means = images.float().mean(dim=(1, 2, 3))
        box = torch.tensor([[1.0, 1.0, 9.0, 9.0]], device=images.device)
        return [
            {
                "boxes": box,
                "scores": m.reshape(1),
                "labels": torch.ones(1, dtype=torch.long, device=images.device),
            }
            for m in means
        ]


def _mean_detector(size: tuple[int, int] = (64, 64), work: int = 0) -> Detector:
    return Detector(
        name="mean",
        module=MeanDetector(work),
        input=InputSpec(size=size),
        class_names=("bg", "thing"),
    )


class Collect:
    def __init__(self) -> None:
        self.results: list[FrameResult] = []

    def write(self, result: FrameResult) -> None:
        self.results.append(result)

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    yield
    assert not [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("decode-", "batcher", "engine", "gpu-monitor"))
    ]


def test_to_model_input_normalises_and_transposes() -> None:
    batch = torch.tensor([[[[0, 128, 255]]]], dtype=torch.uint8)  # (1, 1, 1, 3)
    x = to_model_input(batch, mean=(0.5, 0.5, 0.5), std=(0.5, 0.25, 0.5))
    assert x.shape == (1, 3, 1, 1)
    np.testing.assert_allclose(
        x.flatten().numpy(), [-1.0, (128 / 255 - 0.5) / 0.25, 1.0], atol=1e-6
    )


def test_postprocess_filters_by_score_and_class_and_suppresses_overlaps() -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60.0]])
    outputs = [
        {
            "boxes": boxes,
            "scores": torch.tensor([0.9, 0.8, 0.7, 0.2]),
            "labels": torch.tensor([1, 1, 2, 1]),
        }
    ]
    keep = torch.tensor([False, True, True])
    packed, counts = postprocess(
        outputs, score_threshold=0.5, iou_threshold=0.5, max_detections=5, keep=keep
    )
    # the second box overlaps the first (same class) and goes; the low score goes;
    # the same box with another class stays (NMS is per class)
    assert counts.tolist() == [2]
    assert packed[0, :2, 4].tolist() == pytest.approx([0.9, 0.7])
    assert packed[0, :2, 5].tolist() == [1.0, 2.0]
    packed, counts = postprocess(
        outputs,
        score_threshold=0.5,
        iou_threshold=0.5,
        max_detections=5,
        keep=torch.tensor([False, True, False]),
    )
    assert counts.tolist() == [1]


def _run_mean(
    config: PipelineConfig, frames: int = 60, cameras: int = 4, work: int = 0
) -> list[FrameResult]:
    sink = Collect()
    cams = [(f"c{i}", FakeReader(size=(64, 64), frames=frames)) for i in range(cameras)]
    with Pipeline(
        cameras=cams, detector=_mean_detector(work=work), config=config, sinks=[sink]
    ) as p:
        p.run()
    return sink.results


def _assert_each_frame_saw_its_own_pixels(results: list[FrameResult]) -> None:
    # FakeReader fills frame k with the value k % 256; the letterbox pads with 114
    for r in results:
        assert len(r.detections) == 1
        assert r.detections.scores[0] * 255 == pytest.approx(r.frame_index % 256, abs=0.6), (
            r.camera,
            r.frame_index,
        )


def test_staging_slots_are_never_overwritten_while_in_flight_cpu() -> None:
    results = _run_mean(
        PipelineConfig(device="cpu", ring_slots=2, max_in_flight=1, score_threshold=0.0)
    )
    assert len(results) == 240
    _assert_each_frame_saw_its_own_pixels(results)


def test_staging_ring_hands_out_each_slot_once() -> None:
    ring = StagingRing(slots=2, max_batch=3, height=8, width=8, pin_memory=False)
    a = ring.acquire(timeout=0.1)
    b = ring.acquire(timeout=0.1)
    assert {a, b} == {0, 1}
    assert ring.acquire(timeout=0.05) is None  # none free until one is released
    assert a is not None
    ring.release(a)
    assert ring.acquire(timeout=0.1) == a
    with pytest.raises(ValueError):
        ring.release(7)


@pytest.mark.cuda
@needs_cuda
def test_ring_is_pinned_on_cuda() -> None:
    ring = StagingRing(slots=3, max_batch=6, height=32, width=32, pin_memory=True)
    assert all(t.is_pinned() for t in ring.tensors)


@pytest.mark.cuda
@needs_cuda
def test_staging_slots_are_never_overwritten_while_in_flight_cuda() -> None:
    # few slots and large frames (6 MB a batch row): a slot refilled before its upload
    # finished would hand the model another frame's pixels
    sink = Collect()
    cams = [(f"c{i}", FakeReader(size=(1920, 1080), frames=150)) for i in range(4)]
    config = PipelineConfig(device="cuda", ring_slots=3, max_in_flight=2, score_threshold=0.0)
    with Pipeline(
        cameras=cams,
        detector=_mean_detector(size=(1920, 1080), work=5),
        config=config,
        sinks=[sink],
    ) as p:
        p.run()
    assert len(sink.results) == 600
    _assert_each_frame_saw_its_own_pixels(sink.results)


@pytest.mark.cuda
@needs_cuda
def test_copy_of_next_batch_overlaps_compute_of_current() -> None:
    # given big uploads (6 x 1080p) and a model that keeps the device busy for a while
    sink = Collect()
    cams = [(f"c{i}", FakeReader(size=(1920, 1080), frames=40)) for i in range(6)]
    with Pipeline(
        cameras=cams,
        detector=_mean_detector(size=(1920, 1080), work=60),
        config=PipelineConfig(device="cuda", score_threshold=0.0),
        sinks=[sink],
    ) as p:
        p.run()
    by_batch: dict[int, FrameResult] = {}
    for r in sink.results:
        by_batch.setdefault(r.batch_index, r)
    ordered = [by_batch[i] for i in sorted(by_batch)]
    # then for many consecutive batches the upload span of n+1 intersects the compute span
    # of n (both from CUDA events): the copy engine and the SMs worked at the same time
    overlapped = sum(
        1
        for cur, nxt in itertools.pairwise(ordered)
        if nxt.timing.copy_start_ns < cur.timing.inference_done_ns
        and cur.timing.compute_start_ns < nxt.timing.copy_done_ns
    )
    assert overlapped >= len(ordered) // 3, (overlapped, len(ordered))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_on_cuda(precision: str) -> None:
    from drivepercept.models import load_detector

    detector = load_detector("ssdlite320_mobilenet_v3_large", weights="none")
    sink = Collect()
    cams = [(f"c{i}", FakeReader(size=(640, 360), frames=10)) for i in range(3)]
    with Pipeline(
        cameras=cams,
        detector=detector,
        sinks=[sink],
        config=PipelineConfig(device="cuda", precision=precision),
    ) as p:
        stats = p.run()
    assert stats.frames == 30 and stats.device.startswith("cuda")
