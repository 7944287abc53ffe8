"""Detections scored against ground truth with pycocotools' COCOeval, the reference
implementation: pure, from dicts to an `EvalReport`.

Objects too hidden or too small to be fair targets (visibility or box height below the
thresholds), and those the labels mark as ignore regions, become COCO "crowd" regions: a
detection of their class on one is neither a hit nor a false positive, and missing one costs
nothing. Detections are matched to categories by `canonical_class`; those of classes the ground
truth does not have are left out.
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from drivepercept.errors import ConfigError
from drivepercept.eval.classes import canonical_class
from drivepercept.eval.report import EvalReport, EvalThresholds

if TYPE_CHECKING:
    from pycocotools.cocoeval import COCOeval

_NOTHING = -1.0  # COCOeval's mark: nothing to score


def score_detections(
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
    annotations = _targets_and_ignored(ground_truth, set(image_ids.values()), th)
    results = _coco_results(frames, image_ids, cat_ids)
    gt_dict = {
        "images": copy.deepcopy(images_),
        "annotations": annotations,
        "categories": copy.deepcopy(list(ground_truth["categories"])),
    }
    main = _coco_eval(gt_dict, results, sorted(image_ids.values()))
    report_stats = main.stats if main is not None else np.full(12, _NOTHING)
    per_class = _per_class(main, cat_ids, annotations) if main is not None else {}
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
        per_camera[cam] = _camera_scores(_coco_eval(gt_dict, results, ids), ids, targets)
    ignored = sum(a["iscrowd"] for a in annotations)
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
        else _NOTHING,
    )


def _targets_and_ignored(
    ground_truth: Mapping[str, Any], image_ids: set[int], th: EvalThresholds
) -> list[dict[str, Any]]:
    """The annotations of the scored images, those below the thresholds made crowd regions."""
    annotations = []
    for ann in ground_truth["annotations"]:
        if int(ann["image_id"]) not in image_ids:
            continue
        a = dict(ann)
        small = float(a["bbox"][3]) < th.min_height_px
        hidden = float(a.get("visibility", 1.0)) < th.min_visibility
        a["iscrowd"] = 1 if (small or hidden or a.get("iscrowd")) else 0
        a.setdefault("area", float(a["bbox"][2]) * float(a["bbox"][3]))
        annotations.append(a)
    return annotations


def _coco_results(
    frames: list[Mapping[str, Any]],
    image_ids: Mapping[tuple[str, int], int],
    cat_ids: Mapping[str, int],
) -> list[dict[str, Any]]:
    """Detections of scored images and known classes as COCO results (bbox [x, y, w, h])."""
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
    return results


def _coco_eval(
    gt_dict: Mapping[str, Any], results: list[dict[str, Any]], img_ids: list[int]
) -> COCOeval | None:
    """COCOeval of `img_ids`, run and summarised; None: no image or no detection to score."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    if not img_ids or not results:
        return None
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        gt = COCO()
        gt.dataset = copy.deepcopy(dict(gt_dict))
        gt.createIndex()
        dt = gt.loadRes(copy.deepcopy(results))
        ev = COCOeval(gt, dt, iouType="bbox")
        ev.params.imgIds = img_ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev


def _per_class(
    main: COCOeval, cat_ids: Mapping[str, int], annotations: list[dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """ap_50_95, ap_50, recall_50 and targets of each class with something to score."""
    per_class: dict[str, dict[str, float]] = {}
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
    return per_class


def _camera_scores(
    ev: COCOeval | None, ids: list[int], targets: list[dict[str, Any]]
) -> dict[str, float]:
    """One camera's ap_50_95, ap_50 and recall_50: 0 where it missed all, -1 where it had
    nothing to find."""
    missed = 0.0 if any(a["image_id"] in ids for a in targets) else _NOTHING
    if ev is None:
        return {"ap_50_95": missed, "ap_50": missed, "recall_50": missed}
    return {
        "ap_50_95": float(ev.stats[0]),
        "ap_50": float(ev.stats[1]),
        "recall_50": _mean_valid(ev.eval["recall"][0, :, 0, -1], empty=_NOTHING),
    }


def _mean_valid(values: np.ndarray[Any, Any], *, empty: float = 0.0) -> float:
    valid = values[values > -1]
    return float(valid.mean()) if valid.size else empty
