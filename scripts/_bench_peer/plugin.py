"""bench_peer's network as a drivepercept model plugin, so that a `drivepercept live` child
process (of this checkout or of another commit's) runs the very network bench_peer builds:

    drivepercept live URL... --model _bench_peer.plugin:yolov8n --weights yolov8n-bench.pt

with `scripts/` on PYTHONPATH and Ultralytics importable (the file holds the pickled module).
`save` writes such a file from a settled and calibrated network.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drivepercept.models.base import Detector


def save(path: Path, net: Any, names: Sequence[str], imgsz: int) -> None:
    """Write the network (pickled whole: its Ultralytics classes must import where it is
    loaded), its class names and its input size."""
    import torch

    torch.save({"net": net, "names": list(names), "imgsz": imgsz}, path)


def yolov8n(weights: str | None) -> Detector:
    """The plugin factory: `weights` is the path `save` wrote."""
    import torch

    from _bench_peer.network import YoloAsDetector

    if weights is None or weights == "DEFAULT":
        raise ValueError("expected --weights PATH, a file written by _bench_peer.plugin.save")
    saved = torch.load(weights, weights_only=False, map_location="cpu")
    return YoloAsDetector.build(saved["net"], saved["names"], int(saved["imgsz"]))
