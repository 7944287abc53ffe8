"""The types of an evaluation: which ground truth is a target (`EvalThresholds`) and the COCO
metrics it ends in (`EvalReport`, written as eval.json)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from drivepercept.errors import ConfigError

EVAL_SCHEMA_VERSION = 2  # 2: recall at IoU .5 and targets per class


@dataclass(frozen=True)
class EvalThresholds:
    """Ground truth below either threshold is an ignore region, not a target."""

    min_visibility: float = 0.3
    min_height_px: float = 12.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_visibility <= 1.0:
            raise ConfigError(f"min_visibility must be in [0, 1], got {self.min_visibility}")
        if not (math.isfinite(self.min_height_px) and self.min_height_px >= 0):
            raise ConfigError(f"min_height_px must be >= 0, got {self.min_height_px}")


@dataclass(frozen=True)
class EvalReport:
    """COCO metrics of one evaluation (APs in [0, 1]; -1 where nothing could be scored)."""

    map_50_95: float
    map_50: float
    recall: float  # AR@100 over IoU .5:.95
    # per class: ap_50_95, ap_50, recall_50 (at IoU .5, 100 detections per image), targets
    per_class: dict[str, dict[str, float]]
    per_camera: dict[str, dict[str, float]]  # ap_50_95, ap_50, recall_50
    images: int
    targets: int  # ground-truth boxes scored
    ignored: int  # ground-truth boxes turned into ignore regions
    detections: int
    thresholds: EvalThresholds = field(default_factory=EvalThresholds)
    recall_50: float = -1.0  # mean over classes of recall at IoU .5 (100 detections per image)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["schema_version"] = EVAL_SCHEMA_VERSION
        return data

    def table(self) -> str:
        def f(v: float, width: int) -> str:  # -1: nothing to score here
            return f"{v:>{width}.3f}" if v >= 0 else f"{'n/a':>{width}}"

        overall = {"ap_50_95": self.map_50_95, "ap_50": self.map_50, "recall_50": self.recall_50}
        lines = [("all", overall, str(self.targets))]
        lines += [(name, ap, str(int(ap["targets"]))) for name, ap in self.per_class.items()]
        lines += [("cam " + name, ap, "") for name, ap in self.per_camera.items()]
        w = max(16, *(len(name) + 1 for name, _, _ in lines))
        rows = [f"{'':<{w}} {'mAP@.5:.95':>10} {'mAP@.5':>8} {'recall@.5':>9} {'targets':>7}"]
        for name, ap, targets in lines:
            scores = f"{f(ap['ap_50_95'], 10)} {f(ap['ap_50'], 8)} {f(ap['recall_50'], 9)}"
            rows.append(f"{name:<{w}} {scores} {targets:>7}")
        rows.append(
            f"recall (AR@100) {f(self.recall, 5).strip()}; {self.targets} targets, "
            f"{self.ignored} ignored, {self.detections} detections, "
            f"{self.images} images"
        )
        return "\n".join(rows)
