"""The engine's device-side steps as small pure tensor functions (testable on the CPU).

to_model_input: uint8 NHWC batch (as uploaded: 4x less traffic than float32) -> normalised
float NCHW. postprocess: per-image detector outputs -> score filter, class filter,
class-aware NMS, top-k -> one packed (B, K, 6) tensor [x0, y0, x1, y1, score, label] plus
counts, ready for a single device-to-host copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torchvision.ops import batched_nms

from drivepercept.config import PipelineConfig
from drivepercept.models.base import Detector

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def ready_model(
    detector: Detector, config: PipelineConfig, device: torch.device
) -> torch.nn.Module:
    """The detector's module on `device`, in eval mode, set up as `config` says (its own
    post-processing thresholds, channels_last). The engine and the benchmark share it, so
    that both run exactly the same model."""
    detector.configure_postprocess(
        score_threshold=config.score_threshold,
        iou_threshold=config.iou_threshold,
        max_detections=config.max_detections,
    )
    model = detector.module.to(device).eval()
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Mixed-precision context for "fp16"/"bf16"; nothing for "fp32"."""
    dtype = _DTYPES[precision]
    if dtype is torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def to_model_input(
    batch_u8: torch.Tensor,
    *,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """(B, H, W, 3) uint8 RGB -> (B, 3, H, W) float, `(x / 255 - mean) / std`.

    `mean` and `std` may be given as (1, 3, 1, 1) tensors already on the device (the engine
    makes them once) so that no per-batch host-to-device copy is needed.
    """
    x = batch_u8.permute(0, 3, 1, 2).to(dtype).div_(255.0)
    given_tensors = isinstance(mean, torch.Tensor) or isinstance(std, torch.Tensor)
    # decided on the host: comparing device tensors here would synchronise every batch
    if given_tensors or any(v != 0.0 for v in mean) or any(v != 1.0 for v in std):
        m = torch.as_tensor(mean, dtype=dtype, device=x.device).view(1, 3, 1, 1)
        s = torch.as_tensor(std, dtype=dtype, device=x.device).view(1, 3, 1, 1)
        x = x.sub_(m).div_(s)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    return x.contiguous(memory_format=memory_format)


def keep_table(
    keep_labels: frozenset[int] | None, n_classes: int, device: torch.device
) -> torch.Tensor | None:
    """A bool lookup table (keep[label]) for the class filter; None keeps every class."""
    if keep_labels is None:
        return None
    keep = torch.zeros(max(n_classes, max(keep_labels, default=0) + 1), dtype=torch.bool)
    keep[list(keep_labels)] = True
    return keep.to(device)


def postprocess(
    outputs: Sequence[dict[str, torch.Tensor]],
    *,
    score_threshold: float,
    iou_threshold: float,
    max_detections: int,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Filter and pack detections.

    Args:
        outputs: one dict per image with boxes (N, 4), scores (N,), labels (N,).
        score_threshold: boxes scoring below are dropped.
        iou_threshold: class-aware NMS overlap.
        max_detections: K, the most boxes kept per image (highest scores).
        keep: optional bool lookup table, keep[label] says whether a class is kept.

    Returns:
        packed (B, K, 6) float32 and counts (B,) int32, on the outputs' device.
    """
    device = outputs[0]["boxes"].device if outputs else torch.device("cpu")
    packed = torch.zeros((len(outputs), max_detections, 6), dtype=torch.float32, device=device)
    counts = torch.zeros(len(outputs), dtype=torch.int32, device=device)
    for i, out in enumerate(outputs):
        boxes = out["boxes"].float()
        scores = out["scores"].float()
        labels = out["labels"].long()
        mask = scores >= score_threshold
        if keep is not None:
            mask &= keep[labels.clamp(0, keep.numel() - 1)] & (labels < keep.numel())
        boxes, scores, labels = boxes[mask], scores[mask], labels[mask]
        order = batched_nms(boxes, scores, labels, iou_threshold)[:max_detections]
        n = order.numel()
        packed[i, :n, :4] = boxes[order]
        packed[i, :n, 4] = scores[order]
        packed[i, :n, 5] = labels[order].float()
        counts[i] = n
    return packed, counts
