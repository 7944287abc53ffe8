"""`drivepercept eval`: detection accuracy against ground truth, with COCO metrics.

The detections come from the replay pipeline (the same code path as `replay`); the metrics
from pycocotools' COCOeval, the reference implementation. Objects too hidden or too small to
be fair targets (visibility or box height below the thresholds), and those the labels mark as
ignore regions, become COCO "crowd" regions: a detection of their class on one is neither a
hit nor a false positive, and missing one costs nothing.

Classes are matched by name, on the driving classes: a model's class names are lower-cased,
spaces become underscores, and COCO names are mapped (person -> pedestrian, bicycle and
motorcycle -> cyclist, traffic light -> traffic_light, stop sign -> traffic_sign). Labelled
data maps onto them by a table per format (KITTI, nuScenes, MOTChallenge, COCO: below).
Detections of classes the ground truth does not have are left out.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from drivepercept.errors import ConfigError
from drivepercept.types import COCO_TO_DRIVING, DRIVING_CLASSES

GROUND_TRUTH_FILE = "ground_truth.json"
EVAL_SCHEMA_VERSION = 2  # 2: recall at IoU .5 and targets per class

# COCO names as model outputs spell them (lower case, "_" for spaces) -> driving classes
CLASS_ALIASES: Mapping[str, str] = {
    coco.replace(" ", "_"): driving for coco, driving in COCO_TO_DRIVING.items()
}


def canonical_class(name: str) -> str:
    """A model's class name as the ground truth spells it."""
    key = name.strip().lower().replace(" ", "_")
    return CLASS_ALIASES.get(key, key)


@dataclass(frozen=True)
class ClassRule:
    """What a labelled class becomes: a target of a driving class, or an ignore region of one
    (a fair confusion: a detection of that class on it costs nothing)."""

    driving_class: str
    scored: bool = True

    def __post_init__(self) -> None:
        if self.driving_class not in DRIVING_CLASSES:
            raise ConfigError(f"expected one of {DRIVING_CLASSES}, got {self.driving_class!r}")


def _t(name: str) -> ClassRule:
    return ClassRule(name)


def _i(name: str) -> ClassRule:
    return ClassRule(name, scored=False)


# KITTI's own benchmark ignores Van for Car and Person_sitting for Pedestrian; trams look like
# buses. Misc and DontCare are dropped.
KITTI_CLASSES: Mapping[str, ClassRule] = {
    "Car": _t("car"),
    "Van": _i("car"),
    "Truck": _t("truck"),
    "Tram": _i("bus"),
    "Pedestrian": _t("pedestrian"),
    "Person_sitting": _i("pedestrian"),
    "Cyclist": _t("cyclist"),
}
# trailers and construction vehicles pass for trucks; cones and barriers are no driving class
NUSCENES_CLASSES: Mapping[str, ClassRule] = {
    "car": _t("car"),
    "truck": _t("truck"),
    "bus": _t("bus"),
    "pedestrian": _t("pedestrian"),
    "bicycle": _t("cyclist"),
    "motorcycle": _t("cyclist"),
    "trailer": _i("truck"),
    "construction_vehicle": _i("truck"),
}
# MOTChallenge scores pedestrians (class 1, consider == 1) only; its distractors (person on a
# vehicle, static person, distractor, reflection) are ignore regions of pedestrians, as in its
# own benchmark; vehicles are ignore regions of their class (MOT labels them incompletely, so
# they are never targets); non-motorised vehicles and occluders (6, 9-11) are dropped.
MOT_CLASSES: Mapping[int, ClassRule] = {
    1: _t("pedestrian"),
    2: _i("pedestrian"),
    7: _i("pedestrian"),
    8: _i("pedestrian"),
    12: _i("pedestrian"),
    3: _i("car"),
    4: _i("cyclist"),
    5: _i("cyclist"),
}
# a COCO json's table, chosen by its category names: all of them named (or dropped) by one
TABLES: Mapping[str, tuple[Mapping[str, ClassRule], frozenset[str]]] = {
    "kitti": (KITTI_CLASSES, frozenset({"Misc", "DontCare"})),
    "nuscenes": (NUSCENES_CLASSES, frozenset({"traffic_cone", "barrier"})),
}


def class_table(names: Iterable[str]) -> str:
    """kitti or nuscenes when every category name is one of theirs, else coco."""
    names = set(names)
    for table, (rules, dropped) in TABLES.items():
        if names and names <= set(rules) | dropped:
            return table
    return "coco"


def class_rule(table: str, name: str) -> ClassRule | None:
    """A category of a COCO json's table; None: dropped. The coco table maps names as model
    outputs are (`canonical_class`: person -> pedestrian, ...), so our own names map too."""
    if table in TABLES:
        return TABLES[table][0].get(name)
    key = canonical_class(name)
    return _t(key) if key in DRIVING_CLASSES else None


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


def load_ground_truth(path: str | Path, *, cameras: Sequence[str] | None = None) -> dict[str, Any]:
    """Read and check a COCO ground-truth file in the `simulate` format.

    Raises:
        ConfigError: missing, not JSON, missing COCO sections, or lacking a rig camera.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"no ground truth at {path}: eval needs a clip with "
            f"{GROUND_TRUTH_FILE} (as `drivepercept simulate` writes)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read ground truth {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"ground truth {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), list) for k in ("images", "annotations", "categories")
    ):
        raise ConfigError(f"ground truth {path} lacks COCO images/annotations/categories lists")
    try:
        gt_cameras = {str(im["camera"]) for im in data["images"]}
        for im in data["images"]:
            _require_ints(im, "id", "frame_index")
        for cat in data["categories"]:
            _require_ints(cat, "id")
            if not isinstance(cat["name"], str):
                raise ValueError(f"category name must be a string, got {cat['name']!r}")
        for ann in data["annotations"]:
            _require_ints(ann, "id", "image_id", "category_id")
            box = ann["bbox"]
            if len(box) != 4 or not all(_is_number(v) for v in box):
                raise ValueError(f"bbox of annotation {ann['id']} is not 4 numbers [x, y, w, h]")
            if not _is_number(ann.get("visibility", 1.0)):
                raise ValueError(f"visibility of annotation {ann['id']} is not a number")
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"ground truth {path} is malformed ({type(exc).__name__}: {exc}); "
            "see the format `drivepercept simulate` writes"
        ) from None
    if cameras is not None:
        missing = [c for c in cameras if c not in gt_cameras]
        if missing:
            raise ConfigError(
                f"ground truth {path} has no camera {', '.join(missing)}; it has: "
                f"{', '.join(sorted(gt_cameras)) or 'none'}"
            )
    return dict(data)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _require_ints(item: Mapping[str, Any], *keys: str) -> None:
    for key in keys:
        if isinstance(item[key], bool) or not isinstance(item[key], int):
            raise ValueError(f"{key} must be an integer, got {item[key]!r}")


def evaluate(
    ground_truth: Mapping[str, Any],
    frames: Iterable[Mapping[str, Any]],
    *,
    thresholds: EvalThresholds | None = None,
    images: Iterable[tuple[str, int]] | None = None,
    by_camera: bool = True,
) -> EvalReport:
    """Score detections against ground truth with COCOeval.

    Args:
        ground_truth: a COCO dict as `load_ground_truth` returns.
        frames: one mapping per camera frame with camera, frame_index, boxes (xyxy, original
            pixels), scores and class_names (the format of detections.jsonl lines).
        thresholds: which ground truth is a target and which an ignore region.
        images: the (camera, frame_index) pairs to score; a pair with no detection frame
            counts every object in it as missed. Default: the pairs `frames` has.
        by_camera: also score each camera alone (one more COCO evaluation a camera: a
            fleet's pooled score of hundreds of cameras leaves them out).

    Raises:
        ConfigError: no scored image is in the ground truth (the wrong clip, say).
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    th = thresholds or EvalThresholds()
    frames = list(frames)
    scored_keys = (
        {(str(c), int(k)) for c, k in images}
        if images is not None
        else {(str(f["camera"]), int(f["frame_index"])) for f in frames}
    )
    images_ = [
        im
        for im in ground_truth["images"]
        if (str(im["camera"]), int(im["frame_index"])) in scored_keys
    ]
    if not images_:
        raise ConfigError(
            "none of the evaluated frames (camera, frame_index) is in the ground truth: "
            "is it the ground truth of this clip?"
        )
    image_ids = {(str(im["camera"]), int(im["frame_index"])): int(im["id"]) for im in images_}
    cat_ids = {str(c["name"]): int(c["id"]) for c in ground_truth["categories"]}
    wanted = set(image_ids.values())
    annotations = []
    ignored = 0
    for ann in ground_truth["annotations"]:
        if int(ann["image_id"]) not in wanted:
            continue
        a = dict(ann)
        small = float(a["bbox"][3]) < th.min_height_px
        hidden = float(a.get("visibility", 1.0)) < th.min_visibility
        a["iscrowd"] = 1 if (small or hidden or a.get("iscrowd")) else 0
        a.setdefault("area", float(a["bbox"][2]) * float(a["bbox"][3]))
        ignored += a["iscrowd"]
        annotations.append(a)
    results = []
    for f in frames:
        img = image_ids.get((str(f["camera"]), int(f["frame_index"])))
        if img is None:
            continue
        for box, score, name in zip(f["boxes"], f["scores"], f["class_names"], strict=True):
            cat = cat_ids.get(canonical_class(str(name)))
            if cat is None:
                continue
            x0, y0, x1, y1 = (float(v) for v in box)
            results.append(
                {
                    "image_id": img,
                    "category_id": cat,
                    "score": float(score),
                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                }
            )

    gt_dict = {
        "images": copy.deepcopy(images_),
        "annotations": annotations,
        "categories": copy.deepcopy(list(ground_truth["categories"])),
    }

    def run(img_ids: list[int], cat: list[int] | None = None) -> COCOeval | None:
        if not img_ids:
            return None
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
            gt = COCO()
            gt.dataset = copy.deepcopy(gt_dict)
            gt.createIndex()
            dt = gt.loadRes(copy.deepcopy(results)) if results else None
            if dt is None:
                return None
            ev = COCOeval(gt, dt, iouType="bbox")
            ev.params.imgIds = img_ids
            if cat is not None:
                ev.params.catIds = cat
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        return ev

    all_ids = sorted(wanted)
    main = run(all_ids)
    report_stats = main.stats if main is not None else np.full(12, -1.0)
    per_class: dict[str, dict[str, float]] = {}
    if main is not None:
        precision = main.eval["precision"]  # [T, R, K, A, M]
        recall = main.eval["recall"]  # [T, K, A, M]; -1: no target of that class
        for k, cat in enumerate(main.params.catIds):
            name = next(n for n, i in cat_ids.items() if i == cat)
            p = precision[:, :, k, 0, -1]
            if (p > -1).any():
                per_class[name] = {
                    "ap_50_95": float(np.mean(p[p > -1])),
                    "ap_50": _mean_valid(precision[0, :, k, 0, -1]),
                    "recall_50": float(recall[0, k, 0, -1]),
                    "targets": sum(
                        1 for a in annotations if a["category_id"] == cat and not a["iscrowd"]
                    ),
                }
    targets = [a for a in annotations if not a["iscrowd"]]
    if not results and targets:  # nothing detected: every target missed, AP and recall 0
        report_stats = np.zeros(12)
        for name, cat in cat_ids.items():
            n = sum(1 for a in targets if a["category_id"] == cat)
            if n:
                per_class[name] = {"ap_50_95": 0.0, "ap_50": 0.0, "recall_50": 0.0, "targets": n}
    per_camera: dict[str, dict[str, float]] = {}
    for cam in sorted({c for c, _ in image_ids}) if by_camera else ():
        ids = sorted(i for (c, _), i in image_ids.items() if c == cam)
        ev = run(ids)
        missed = 0.0 if any(a["image_id"] in ids for a in targets) else -1.0
        stats = ev.stats if ev is not None else np.full(12, missed)
        per_camera[cam] = {
            "ap_50_95": float(stats[0]),
            "ap_50": float(stats[1]),
            "recall_50": _mean_valid(ev.eval["recall"][0, :, 0, -1], empty=-1.0)
            if ev is not None
            else missed,
        }
    return EvalReport(
        map_50_95=float(report_stats[0]),
        map_50=float(report_stats[1]),
        recall=float(report_stats[8]),
        per_class=per_class,
        per_camera=per_camera,
        images=len(images_),
        targets=len(annotations) - ignored,
        ignored=ignored,
        detections=len(results),
        thresholds=th,
        recall_50=float(np.mean([c["recall_50"] for c in per_class.values()]))
        if per_class
        else -1.0,
    )


def _mean_valid(values: np.ndarray[Any, Any], *, empty: float = 0.0) -> float:
    valid = values[values > -1]
    return float(valid.mean()) if valid.size else empty


def clip_paths(clip: str | Path, ground_truth: str | Path | None = None) -> tuple[Path, Path]:
    """(rig.toml, ground_truth.json) of a clip given as its folder or its rig file."""
    clip = Path(clip)
    rig = clip / "rig.toml" if clip.is_dir() else clip
    if not rig.exists():
        raise ConfigError(f"no rig file at {rig}: give a clip folder or its rig.toml")
    gt = Path(ground_truth) if ground_truth is not None else rig.parent / GROUND_TRUTH_FILE
    return rig, gt
