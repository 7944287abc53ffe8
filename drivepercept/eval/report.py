"""The types of an evaluation: which ground truth is a target (`EvalThresholds`), the COCO
metrics it ends in (`EvalReport`, written as eval.json), and with `eval --track` and
`--streaming` the tracking and streaming scores (`TrackingScores`, `StreamingScores`), each
with its printed table."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from drivepercept.errors import ConfigError

# 2: recall at IoU .5 and targets per class; 3: tracking and streaming sections (optional)
EVAL_SCHEMA_VERSION = 3


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


def _f(value: float | None, width: int, digits: int = 3) -> str:
    """A score in a table: n/a where there is none (None, or -1: nothing to score)."""
    if value is None or value < 0:
        return f"{'n/a':>{width}}"
    return f"{value:>{width}.{digits}f}"


@dataclass(frozen=True)
class TrackMetrics:
    """TrackEval's HOTA, CLEAR and Identity metrics of one sequence (or several combined).

    HOTA, DetA and AssA are TrackEval's arrays averaged over its 19 IoU thresholds (0.05 to
    0.95), as its tables print them; MOTA, IDF1 and the ID switches are at IoU 0.5. None: not
    defined for this sequence (the rig's MOTA and switches: see `TrackingScores`).
    """

    hota: float
    deta: float
    assa: float
    mota: float | None
    idf1: float
    id_switches: int | None
    gt_dets: int  # target boxes scored
    pred_dets: int  # tracked boxes scored (those on ignore regions left out)
    gt_ids: int
    pred_ids: int


@dataclass(frozen=True)
class SameIdShare:
    """Pairs of simultaneous sightings of one world object in two cameras, both matched to
    tracked boxes with a global id: the share whose global ids are equal (-1: no pair)."""

    share: float
    pairs: int
    same: int


@dataclass(frozen=True)
class RangeError:
    """|predicted - true| distance from the camera, of the matched sightings whose true
    distance is in [low_m, high_m); median_m and p90_m are -1 where there is none, and
    bias_m (signed) is 0."""

    low_m: float
    high_m: float
    count: int
    median_m: float
    p90_m: float
    bias_m: float = 0.0  # median of predicted - true (< 0: placed too near)


@dataclass(frozen=True)
class TrackingScores:
    """`eval --track`: per camera (per-camera track ids against world ids), all cameras
    combined, the rig (global ids against world ids across cameras; None without global
    ids), the same-id share across cameras, and the ego-position error by range."""

    per_camera: dict[str, TrackMetrics]
    cameras: TrackMetrics
    rig: TrackMetrics | None
    same_id: SameIdShare
    ego_error: tuple[RangeError, ...]
    sightings_placed: int = 0  # matched sightings with a placed object (ego error's pool)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        head = f"{'':<18} {'HOTA':>6} {'DetA':>6} {'AssA':>6} {'MOTA':>6} {'IDF1':>6} "
        rows = [head + f"{'IDsw':>5} {'GT ids':>6} {'ids':>5}"]
        lines = [(f"cam {name}", m) for name, m in self.per_camera.items()]
        lines += [("all cameras", self.cameras)]
        lines += [("rig (global ids)", self.rig)] if self.rig is not None else []
        for name, m in lines:
            sw = f"{m.id_switches:>5}" if m.id_switches is not None else f"{'n/a':>5}"
            rows.append(
                f"{name:<18} {_f(m.hota, 6)} {_f(m.deta, 6)} {_f(m.assa, 6)} {_f(m.mota, 6)} "
                f"{_f(m.idf1, 6)} {sw} {m.gt_ids:>6} {m.pred_ids:>5}"
            )
        s = self.same_id
        rows.append(
            f"same global id across cameras: {_f(s.share, 0).strip()} "
            f"({s.same} of {s.pairs} simultaneous two-camera sighting pairs)"
        )
        rows.append(f"{'ego-position error':<18} {'median':>7} {'p90':>7} {'bias':>7} {'n':>6}")
        for b in self.ego_error:
            bias = f"{b.bias_m:>+7.2f}" if b.count else f"{'n/a':>7}"
            name = f"  {b.low_m:g}-{b.high_m:g} m"
            rows.append(
                f"{name:<18} {_f(b.median_m, 7, 2)} {_f(b.p90_m, 7, 2)} {bias} {b.count:>6}"
            )
        return "\n".join(rows)


@dataclass(frozen=True)
class StreamingScores:
    """`eval --streaming`: COCO AP of each frame scored against the newest output that existed
    when it was captured (`streaming`; `forecast`: those boxes moved on by their velocities
    to the frame's capture time; None unless asked), next to the offline AP of each
    processed frame scored against its own output."""

    offline: EvalReport
    streaming: EvalReport
    forecast: EvalReport | None
    frames: int  # ground-truth frames scored (streaming)
    processed: int  # of them, frames the pipeline emitted (offline's frames)
    without_output: int  # frames captured before any output of their camera existed
    lag_frames: float  # mean over frames with an output: frame index - the output's
    lag_ms: float  # mean: capture time - the output's frame's capture time

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("offline", "streaming", "forecast"):
            if data[key] is not None:
                data[key].pop("thresholds", None)
        return data

    def table(self) -> str:
        lines = [("offline", self.offline), ("streaming", self.streaming)]
        lines += [("streaming+forecast", self.forecast)] if self.forecast is not None else []
        rows = [f"{'':<19} {'mAP@.5:.95':>10} {'mAP@.5':>8} {'recall@.5':>9} {'frames':>6}"]
        for (name, r), n in zip(lines, (self.processed, self.frames, self.frames), strict=False):
            rows.append(
                f"{name:<19} {_f(r.map_50_95, 10)} {_f(r.map_50, 8)} {_f(r.recall_50, 9)} {n:>6}"
            )
        rows.append(
            f"lag: {self.lag_frames:.2f} frames ({self.lag_ms:.1f} ms) mean; "
            f"{self.frames - self.processed} of {self.frames} frames dropped by the live policy, "
            f"{self.without_output} before any output"
        )
        return "\n".join(rows)
