"""DetectorStep: one detector set up for a device and config, shared by engine and bench."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivepercept.config import PipelineConfig
from drivepercept.engine.precision import ReducedPrecision
from drivepercept.engine.step import DetectorStep
from drivepercept.models import load_detector
from drivepercept.models.base import Detector, InputSpec, ModelError
from drivepercept.models.oracle import OracleDetector

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")


def _oracle(**kwargs: object) -> Detector:
    boxes = torch.tensor([[10.0, 10.0, 30.0, 40.0], [12.0, 11.0, 31.0, 41.0], [50, 5, 60, 20]])
    module = OracleDetector(boxes, torch.tensor([0.9, 0.8, 0.7]), torch.tensor([1, 1, 2]))
    return Detector(
        name="oracle",
        module=module,
        input=InputSpec(size=(64, 48)),
        class_names=("bg", "car", "person"),
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_step_runs_normalise_model_and_postprocess_and_returns_host_tensors() -> None:
    step = DetectorStep(_oracle(), PipelineConfig(device="cpu", iou_threshold=0.5), CPU)
    packed, counts = step(torch.zeros(2, 48, 64, 3, dtype=torch.uint8))
    # per image: the overlapping car box is suppressed, the person box stays
    assert counts.tolist() == [2, 2]
    assert packed.device.type == "cpu" and packed.shape == (2, 100, 6)
    assert packed[0, :2, 5].tolist() == [1.0, 2.0]


def test_thresholds_go_into_the_models_own_postprocessing() -> None:
    seen: list[tuple[float, float, int]] = []
    detector = _oracle(set_postprocess=lambda *args: seen.append(args))
    DetectorStep(detector, PipelineConfig(device="cpu", score_threshold=0.4), CPU)
    assert seen == [(0.4, 0.5, 100)]


def test_set_up_twice_with_other_precisions_leaves_one_wrapper_or_none() -> None:
    detector = load_detector("ssdlite320_mobilenet_v3_large", weights="none")
    bf16 = PipelineConfig(device="cpu", precision="bf16")
    DetectorStep(detector, bf16, CPU)
    step = DetectorStep(detector, bf16, CPU)
    backbone = step.model.backbone
    assert isinstance(backbone, ReducedPrecision) and not isinstance(
        backbone.inner, ReducedPrecision
    )
    step = DetectorStep(detector, dataclasses.replace(bf16, precision="fp32"), CPU)
    assert not isinstance(step.model.backbone, ReducedPrecision)


def test_a_plugin_naming_a_part_it_lacks_is_a_model_error() -> None:
    detector = _oracle(reduced_precision=("backbone",))
    with pytest.raises(ModelError, match=r"model oracle: reduced_precision: .*'backbone'"):
        DetectorStep(detector, PipelineConfig(device="cpu", precision="bf16"), CPU)
