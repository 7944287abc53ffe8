"""The engine's device-side steps as small pure tensor functions (testable on the CPU).

to_model_input: uint8 NHWC batch (as uploaded: 4x less traffic than float32) -> normalised
float NCHW. postprocess: per-image detector outputs -> score filter, class filter,
class-aware NMS, top-k over the whole batch at once -> one packed (B, K, 6) tensor
[x0, y0, x1, y1, score, label] plus counts, ready for a single device-to-host copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.ops import batched_nms, nms


def to_model_input(
    batch_u8: torch.Tensor,
    *,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    value_range: float = 1.0,
) -> torch.Tensor:
    """(B, H, W, 3) uint8 (in the model's channel order) -> (B, 3, H, W) float,
    `(x * value_range / 255 - mean) / std`.

    `mean` and `std` may be given as (1, 3, 1, 1) tensors already on the device (the engine
    makes them once) so that no per-batch host-to-device copy is needed.
    """
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    # one pass: the layout change and the conversion in the same copy
    x = batch_u8.permute(0, 3, 1, 2).to(dtype, memory_format=memory_format)
    if value_range != 255.0:
        x = x.div_(255.0 / value_range)
    given_tensors = isinstance(mean, torch.Tensor) or isinstance(std, torch.Tensor)
    # decided on the host: comparing device tensors here would synchronise every batch
    if given_tensors or any(v != 0.0 for v in mean) or any(v != 1.0 for v in std):
        m = torch.as_tensor(mean, dtype=dtype, device=x.device).view(1, 3, 1, 1)
        s = torch.as_tensor(std, dtype=dtype, device=x.device).view(1, 3, 1, 1)
        x = x.sub_(m).div_(s)
    return x


def label_table(table: Sequence[int], device: torch.device) -> torch.Tensor | None:
    """The class map as a lookup tensor (remap[label] = reported label, -1 dropped); None
    when it changes nothing (every label kept as itself)."""
    if list(table) == list(range(len(table))):
        return None
    return torch.tensor(list(table), dtype=torch.int64).to(device)


def grouped_nms(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, iou_threshold: float
) -> torch.Tensor:
    """NMS within each group (image x class) in one call: indices of the kept boxes, highest
    score first.

    Groups are kept apart by shifting each group's boxes by `group x span` (the coordinate
    trick of torchvision's `batched_nms`), but in float64: with a whole batch's image-and-class
    groups the shifts reach millions of pixels, where float32 would round the boxes by a
    tenth of a pixel and move overlaps that sit near the threshold. Above the sizes where
    torchvision itself loops over groups instead (one NMS per group is faster than one over
    everything), its loop is used.
    """
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=boxes.device)
    if boxes.numel() > (4000 if boxes.device.type == "cpu" else 20000):
        kept: torch.Tensor = batched_nms(boxes, scores, groups, iou_threshold)
        return kept
    wide = boxes.double()
    # tensors, not Python numbers: reading them on the host would synchronise the device
    span = wide.max() - wide.min() + 1.0
    shifted = wide + (groups.double() * span)[:, None]
    kept = nms(shifted, scores.double(), iou_threshold)
    return kept


def postprocess(
    outputs: Sequence[dict[str, torch.Tensor]],
    *,
    score_threshold: float,
    iou_threshold: float,
    max_detections: int,
    num_classes: int,
    remap: torch.Tensor | None = None,
    nms: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Filter, suppress and pack a whole batch's detections with batched tensor operations.

    The images' boxes are concatenated and go through one score/class filter and one NMS
    whose groups are (image, class), then are ranked within their image and scattered into
    the packed output. Per image the result is that of filtering, class-aware NMS and top-k
    on that image alone (up to float rounding: the groups are kept apart in float64, where
    a per-image `batched_nms` shifts by class in float32; boxes with a non-finite
    coordinate are dropped). On a GPU only the filter and the NMS read a size back to the
    host (two synchronisations a batch, not four an image; above torchvision's size limit for
    one NMS call, its per-group loop waits once a group), and the engine runs this on its
    completion thread, so they never hold up the next batch's launch.

    Args:
        outputs: one dict per image with boxes (N, 4), scores (N,), labels (N,).
        score_threshold: boxes scoring below are dropped.
        iou_threshold: class-aware NMS overlap.
        max_detections: K, the most boxes kept per image (highest scores).
        num_classes: the count of reported classes; out-of-range labels (negative, or at or
            above it) share one NMS group per image.
        remap: optional lookup table (`label_table`): remap[label] is the label reported for
            a model label, -1 drops it (the class filter); labels past its end are dropped.
        nms: False for a model whose boxes are final (`Detector.final_outputs`): every box
            that passes the filters is kept, highest score first, up to K per image.

    Returns:
        packed (B, K, 6) float32 [x0, y0, x1, y1, score, label] and counts (B,) int32, on
        the outputs' device.
    """
    b, k = len(outputs), max_detections
    device = outputs[0]["boxes"].device if outputs else torch.device("cpu")
    if b == 0:
        empty = torch.zeros(0, dtype=torch.int32, device=device)
        return torch.zeros((0, k, 6), device=device), empty
    boxes = torch.cat([o["boxes"].float().reshape(-1, 4) for o in outputs])
    scores = torch.cat([o["scores"].float().reshape(-1) for o in outputs])
    labels = torch.cat([o["labels"].long().reshape(-1) for o in outputs])
    image = torch.cat(
        [
            torch.full((o["scores"].numel(),), i, dtype=torch.int64, device=device)
            for i, o in enumerate(outputs)
        ]
    )
    # a non-finite box is junk, and would spoil the NMS shifts of the whole batch
    mask = (scores >= score_threshold) & torch.isfinite(boxes).all(dim=1)
    if remap is not None:
        known = (labels >= 0) & (labels < remap.numel())
        labels = torch.where(known, remap[labels.clamp(0, remap.numel() - 1)], -1)
        mask &= labels >= 0
    index = mask.nonzero().squeeze(1)  # the filter's one wait for the device
    boxes, scores = boxes.index_select(0, index), scores.index_select(0, index)
    labels, image = labels.index_select(0, index), image.index_select(0, index)
    in_range = (labels >= 0) & (labels < num_classes)
    groups = image * (num_classes + 1) + torch.where(in_range, labels, num_classes)
    if nms:
        kept = grouped_nms(boxes, scores, groups, iou_threshold)  # highest score first
    else:
        kept = scores.argsort(descending=True, stable=True)
    # rank within the image: a stable sort by image keeps each image's scores descending
    by_image = image[kept].sort(stable=True)
    order = kept[by_image.indices]
    img = by_image.values
    per_image = torch.zeros(b, dtype=torch.int64, device=device)
    per_image.scatter_add_(0, img, torch.ones_like(img))
    first = torch.cumsum(per_image, 0) - per_image
    rank = torch.arange(len(order), device=device) - first[img]
    # rows past K go to a spare column that is cut off below (no boolean mask: no sync)
    column = rank.clamp(max=k)
    packed = torch.zeros((b, k + 1, 6), dtype=torch.float32, device=device)
    packed[img, column] = torch.cat(
        [boxes[order], scores[order, None], labels[order, None].float()], dim=1
    )
    return packed[:, :k].contiguous(), per_image.clamp(max=k).to(torch.int32)
