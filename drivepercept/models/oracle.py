"""A detector that answers with boxes fixed in advance: the example plugin and a test tool.

Loaded as `--model drivepercept.models.oracle:make_oracle`, it shows the smallest complete
plugin. In tests it proves the plumbing rather than a network: the boxes it returns are known
in model-input pixels, so a test can check that they come back in original-frame pixels after
letterboxing, batching and post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from drivepercept.models.base import Detector, InputSpec, ModelError


class OracleDetector(torch.nn.Module):
    """Returns the same boxes for every image of every batch.

    The boxes are buffers, so `.to(device)` moves them with the module, and the output is on
    the device of the input, as a real detector's would be.

    Args:
        boxes_xyxy: (N, 4) boxes in model-input pixels.
        scores: (N,) scores.
        labels: (N,) label indices.
        size: (width, height) the input must have; a batch of another size is an error, so
            a wrongly prepared batch fails loudly instead of giving plausible boxes.
    """

    boxes_xyxy: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor

    def __init__(
        self,
        boxes_xyxy: torch.Tensor,
        scores: torch.Tensor,
        labels: torch.Tensor,
        *,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        boxes = torch.as_tensor(boxes_xyxy, dtype=torch.float32).reshape(-1, 4)
        n = boxes.shape[0]
        scores_t = torch.as_tensor(scores, dtype=torch.float32)
        labels_t = torch.as_tensor(labels, dtype=torch.int64)
        if scores_t.shape != (n,) or labels_t.shape != (n,):
            raise ValueError(
                f"oracle wants ({n},) scores and labels for {n} boxes, got "
                f"{tuple(scores_t.shape)} and {tuple(labels_t.shape)}"
            )
        self.register_buffer("boxes_xyxy", boxes)
        self.register_buffer("scores", scores_t)
        self.register_buffer("labels", labels_t)
        self.size = size

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """(B, 3, H, W) float batch -> B dicts of `boxes`, `scores`, `labels`."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"oracle wants a (B, 3, H, W) batch, got {tuple(images.shape)}")
        if self.size is not None and (images.shape[3], images.shape[2]) != self.size:
            w, h = self.size
            raise ValueError(f"oracle wants {w}x{h} input, got {images.shape[3]}x{images.shape[2]}")
        device = images.device
        return [
            {
                "boxes": self.boxes_xyxy.to(device, copy=True),
                "scores": self.scores.to(device, copy=True),
                "labels": self.labels.to(device, copy=True),
            }
            for _ in range(images.shape[0])
        ]


def make_oracle(
    weights: str | None = None,
    *,
    size: tuple[int, int] = (640, 384),
    boxes: Sequence[Sequence[float]] = ((100.0, 80.0, 220.0, 300.0),),
    scores: Sequence[float] | None = None,
    labels: Sequence[int] | None = None,
    letterbox: bool = True,
    keep_labels: frozenset[int] | None = None,
) -> Detector:
    """Builds an oracle detector (a plugin factory: `factory(weights) -> Detector`).

    Args:
        weights: must be None; the oracle has nothing to load.
        size: (width, height) of its input.
        boxes: (N, 4) xyxy boxes in input pixels, returned for every image.
        scores: per box; 0.9 each by default.
        labels: per box, COCO label indices; 1 ("person") each by default.
        letterbox: the input spec's letterbox flag (False: frames are stretched).
        keep_labels: the class filter; None (the default) keeps every box the test set up.

    Raises:
        ModelError: weights were given.
    """
    from drivepercept.models._torchvision import coco_categories

    if weights is not None:
        raise ModelError(f"the oracle detector has no weights to load, got {weights!r}")
    n = len(boxes)
    module = OracleDetector(
        torch.tensor([list(b) for b in boxes], dtype=torch.float32).reshape(n, 4),
        torch.tensor([0.9] * n if scores is None else list(scores), dtype=torch.float32),
        torch.tensor([1] * n if labels is None else list(labels), dtype=torch.int64),
        size=size,
    ).eval()
    return Detector(
        name="oracle",
        module=module,
        input=InputSpec(size=size, letterbox=letterbox),
        class_names=coco_categories(),
        keep_labels=keep_labels,
    )
