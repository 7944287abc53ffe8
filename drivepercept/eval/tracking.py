"""Tracks scored against ground truth with TrackEval's metric classes: HOTA, CLEAR (MOTA, ID
switches) and Identity (IDF1), per camera and for the rig with global ids.

TrackEval is used as a library: its `HOTA`, `CLEAR` and `Identity` classes are called on the
arrays of each sequence (`eval_sequence`, `combine_sequences`), built here as its datasets
build them (`get_preprocessed_seq_data`): per timestep the ground-truth and tracker ids,
relabelled to 0..n-1 over the sequence, and the IoU of every ground-truth box with every
tracker box. Ignore regions (boxes the `EvalThresholds` find too hidden or small, and
crowd labels: the same rule as the COCO scoring) are treated as TrackEval's KITTI and
BDD100K preprocessing treats distractors and crowd regions: a tracked box matched (IoU >= 0.5,
Hungarian) to an ignored box is dropped, an unmatched one more than half inside (IoA > 0.5)
an ignored box is dropped, and the ignored boxes are not targets.

Scoring is class-agnostic: a track is matched to any labelled object, whatever the class its
detector gave it (class accuracy is the COCO table's business; here it is identity).

A tracked box is one with a per-camera `track_ids` entry >= 0 (the tracker's output; the
detector's other boxes are not tracks). Per camera the tracker ids are its track ids; for the
rig they are the global ids (a tracked box without one is an identity of its own), and the
sequence's timesteps are (frame_index, camera): a labelled object seen by two cameras at one
instant is two targets, each matched only in its own camera, and the association across
cameras is what the rig's AssA and IDF1 score. (TrackEval's metrics need ids unique within a
timestep, which one world object seen twice at one frame_index would break; HOTA and IDF1 do
not depend on the order of timesteps, so splitting an instant by camera changes nothing
else. MOTA and ID switches do depend on it, so the rig has none.)
"""

from __future__ import annotations

import contextlib
import importlib
import io
import itertools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError
from drivepercept.eval.report import (
    EvalThresholds,
    RangeError,
    SameIdShare,
    TrackingScores,
    TrackMetrics,
)
from drivepercept.eval.scoring import _targets_and_ignored

Boxes = npt.NDArray[np.float64]  # (n, 4) xyxy
MATCH_IOU = 0.5  # TrackEval's matching threshold (CLEAR, Identity, preprocessing)
RANGE_BINS_M = ((0.0, 10.0), (10.0, 30.0), (30.0, 60.0))
_EPS = float(np.finfo("float").eps)


@dataclass(frozen=True)
class Step:
    """One timestep of a sequence: target boxes and tracked boxes, each with its id (any
    hashable; relabelled to 0..n-1 over the sequence by `trackeval_data`)."""

    gt_ids: tuple[Hashable, ...]
    gt_boxes: Boxes
    pred_ids: tuple[Hashable, ...]
    pred_boxes: Boxes


def box_iou(a: Boxes, b: Boxes) -> Boxes:
    """IoU of every box of `a` (rows) with every box of `b` (columns), xyxy."""
    return _overlap(a, b, ioa=False)


def box_ioa(a: Boxes, b: Boxes) -> Boxes:
    """The share of each box of `a` inside each box of `b` (intersection over a's area)."""
    return _overlap(a, b, ioa=True)


def _overlap(a: Boxes, b: Boxes, *, ioa: bool) -> Boxes:
    a, b = np.asarray(a, float).reshape(-1, 4), np.asarray(b, float).reshape(-1, 4)
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    denom = area_a[:, None] + (0 if ioa else area_b[None, :] - inter)
    denom = np.broadcast_to(denom, inter.shape)
    out: Boxes = np.zeros_like(inter)
    np.divide(inter, denom, out=out, where=denom > _EPS)
    return out


def match(similarity: Boxes, threshold: float = MATCH_IOU) -> list[tuple[int, int]]:
    """(row, column) pairs of the Hungarian assignment maximising the similarity, pairs
    below `threshold` left out (as TrackEval matches)."""
    from scipy.optimize import linear_sum_assignment

    if similarity.size == 0:
        return []
    scores = np.where(similarity >= threshold - _EPS, similarity, 0.0)
    rows, cols = linear_sum_assignment(-scores)
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if scores[r, c] > _EPS]


def kept_predictions(targets: Boxes, ignored: Boxes, preds: Boxes) -> npt.NDArray[np.bool_]:
    """Which tracked boxes are scored (TrackEval's KITTI / BDD100K preprocessing): those
    matched to an ignored box are not, nor unmatched ones more than half inside one."""
    keep = np.ones(len(preds), dtype=bool)
    if not len(preds) or not len(ignored):
        return keep
    everything = np.concatenate([targets.reshape(-1, 4), ignored.reshape(-1, 4)])
    matched = match(box_iou(everything, preds))
    for row, col in matched:
        keep[col] = row < len(targets)
    unmatched = np.ones(len(preds), dtype=bool)
    unmatched[[c for _, c in matched]] = False
    inside = (box_ioa(preds, ignored) > MATCH_IOU + _EPS).any(axis=1)
    keep[unmatched & inside] = False
    return keep


def trackeval_data(steps: Sequence[Step]) -> dict[str, Any]:
    """A sequence as TrackEval's metrics take it (the keys its datasets'
    `get_preprocessed_seq_data` returns that HOTA, CLEAR and Identity read)."""
    gt_map: dict[Hashable, int] = {}
    pred_map: dict[Hashable, int] = {}
    data: dict[str, Any] = {"gt_ids": [], "tracker_ids": [], "similarity_scores": []}
    for s in steps:
        if len(set(s.gt_ids)) != len(s.gt_ids) or len(set(s.pred_ids)) != len(s.pred_ids):
            raise ValueError("ids must be unique within a timestep")
        data["gt_ids"].append(np.array([gt_map.setdefault(i, len(gt_map)) for i in s.gt_ids], int))
        ids = [pred_map.setdefault(i, len(pred_map)) for i in s.pred_ids]
        data["tracker_ids"].append(np.array(ids, int))
        data["similarity_scores"].append(box_iou(s.gt_boxes, s.pred_boxes))
    data |= {
        "num_timesteps": len(steps),
        "num_gt_ids": len(gt_map),
        "num_tracker_ids": len(pred_map),
        "num_gt_dets": sum(len(s.gt_ids) for s in steps),
        "num_tracker_dets": sum(len(s.pred_ids) for s in steps),
    }
    return data


def _metric_classes() -> tuple[Any, Any, Any]:
    """TrackEval's HOTA, CLEAR and Identity (imported when scoring: scipy, ~0.5 s)."""
    try:  # an untyped library: its classes are Any here
        metrics = importlib.import_module("trackeval.metrics")
    except ImportError:
        raise ConfigError("eval --track needs TrackEval: pip install 'trackeval>=1.3'") from None
    quiet = {"THRESHOLD": MATCH_IOU, "PRINT_CONFIG": False}
    return metrics.HOTA(), metrics.CLEAR(dict(quiet)), metrics.Identity(dict(quiet))


Results = dict[str, dict[str, Any]]  # metric name -> TrackEval's result fields


def evaluate_sequence(data: Mapping[str, Any]) -> Results:
    """HOTA, CLEAR and Identity of one sequence (`trackeval_data`)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return {m.get_name(): m.eval_sequence(data) for m in _metric_classes()}


def combine(results: Mapping[str, Results]) -> Results:
    """Sequences' results combined as TrackEval combines them (sums of counts)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return {
            m.get_name(): m.combine_sequences({k: r[m.get_name()] for k, r in results.items()})
            for m in _metric_classes()
        }


def track_metrics(res: Results, data: Iterable[Mapping[str, Any]], *, clear: bool) -> TrackMetrics:
    """TrackEval's results as `TrackMetrics` (`data`: the sequences' arrays, for counts;
    `clear`: whether MOTA and switches are meaningful)."""
    data = list(data)
    hota, mot, idt = res["HOTA"], res["CLEAR"], res["Identity"]
    return TrackMetrics(
        hota=float(np.mean(hota["HOTA"])),
        deta=float(np.mean(hota["DetA"])),
        assa=float(np.mean(hota["AssA"])),
        mota=float(mot["MOTA"]) if clear else None,
        idf1=float(idt["IDF1"]),
        id_switches=int(mot["IDSW"]) if clear else None,
        gt_dets=sum(int(d["num_gt_dets"]) for d in data),
        pred_dets=sum(int(d["num_tracker_dets"]) for d in data),
        gt_ids=sum(int(d["num_gt_ids"]) for d in data),
        pred_ids=sum(int(d["num_tracker_ids"]) for d in data),
    )


def same_id_share(sightings: Mapping[Any, Sequence[int]]) -> SameIdShare:
    """Of each world object at each instant (key), the global ids of its matched sightings
    (one per camera; -1: matched to a box without one, left out): every pair of them counts,
    and the share whose two ids are equal."""
    pairs = same = 0
    for gids in sightings.values():
        for a, b in itertools.combinations([g for g in gids if g >= 0], 2):
            pairs += 1
            same += a == b
    return SameIdShare(share=same / pairs if pairs else -1.0, pairs=pairs, same=same)


def range_errors(
    pairs: Iterable[tuple[float, float]],
    bins: Sequence[tuple[float, float]] = RANGE_BINS_M,
) -> tuple[RangeError, ...]:
    """|predicted - true| of (true_m, predicted_m) pairs, median and 90th percentile per bin
    of the true distance ([low, high)), and the median signed error (bias)."""
    arr = np.array(list(pairs), float).reshape(-1, 2)
    out = []
    for low, high in bins:
        sel = (arr[:, 0] >= low) & (arr[:, 0] < high)
        signed = arr[sel, 1] - arr[sel, 0]
        if not signed.size:
            out.append(RangeError(low, high, 0, -1.0, -1.0))
            continue
        err = np.abs(signed)
        med, p90 = float(np.median(err)), float(np.percentile(err, 90))
        out.append(RangeError(low, high, int(err.size), med, p90, float(np.median(signed))))
    return tuple(out)


def object_range_m(obj: Mapping[str, Any], mount: tuple[float, float] | None) -> float | None:
    """An object's distance on the ground from a camera: from its place (x_m, y_m, ego
    frame) and the camera's mount (x, y) where that is known, else its own `range_m` (from
    the camera that saw it best); None where neither is there."""
    x, y = obj.get("x_m"), obj.get("y_m")
    if mount is not None and x is not None and y is not None:
        return float(np.hypot(float(x) - mount[0], float(y) - mount[1]))
    r = obj.get("range_m")
    return None if r is None else float(r)


@dataclass(frozen=True)
class _Frame:
    """One camera frame: its labelled boxes and its tracked boxes."""

    world_ids: list[int]
    boxes: Boxes  # labelled, xyxy
    ignored: npt.NDArray[np.bool_]
    distance_m: list[float | None]
    pred_boxes: Boxes
    track_ids: list[int]
    global_ids: list[int]
    kept: npt.NDArray[np.bool_]  # tracked boxes scored (not on an ignore region)


def score_tracking(
    ground_truth: Mapping[str, Any],
    detections: Iterable[Mapping[str, Any]],
    objects: Iterable[Mapping[str, Any]] = (),
    *,
    mounts: Mapping[str, tuple[float, float]] | None = None,
    thresholds: EvalThresholds | None = None,
    images: Iterable[tuple[str, int]] | None = None,
) -> TrackingScores:
    """Score a tracked run against ground truth whose boxes carry world `track_id`s.

    Args:
        ground_truth: a COCO dict (`load_ground_truth`), images with camera and frame_index,
            annotations with track_id (and distance_m for the ego-position error).
        detections: detections.jsonl lines with `track_ids` (and `global_ids`).
        objects: objects.jsonl lines (the rig's placed objects), for the ego-position error.
        mounts: each camera's (x, y) on the vehicle (ego frame, metres), for the range of a
            placed object from the camera that saw it.
        thresholds: which labelled objects are ignore regions (as the COCO scoring).
        images: the (camera, frame_index) pairs scored (default: every labelled image).

    Raises:
        ConfigError: no labelled image to score, labels without track ids, or detections
            without track ids (a run without `track`).
    """
    frames = _frames(ground_truth, list(detections), thresholds or EvalThresholds(), images)
    per_camera: dict[str, Results] = {}
    datas: dict[str, dict[str, Any]] = {}
    for cam in sorted({c for c, _ in frames}):
        steps = [
            _step(frames[key], key, rig=False) for key in sorted(k for k in frames if k[0] == cam)
        ]
        datas[cam] = trackeval_data(steps)
        per_camera[cam] = evaluate_sequence(datas[cam])
    order = sorted(frames, key=lambda key: (key[1], key[0]))  # frame-major, camera-minor
    has_gid = any(g >= 0 for f in frames.values() for g in f.global_ids)
    rig_data = trackeval_data([_step(frames[key], key, rig=True) for key in order])
    rig = track_metrics(evaluate_sequence(rig_data), [rig_data], clear=False) if has_gid else None
    gids, ranges = _sightings(frames, _placed(objects), mounts or {})
    return TrackingScores(
        per_camera={c: track_metrics(r, [datas[c]], clear=True) for c, r in per_camera.items()},
        cameras=track_metrics(combine(per_camera), datas.values(), clear=True),
        rig=rig,
        same_id=same_id_share(gids),
        ego_error=range_errors(ranges),
        sightings_placed=len(ranges),
    )


def _frames(
    gt: Mapping[str, Any],
    detections: list[Mapping[str, Any]],
    th: EvalThresholds,
    images: Iterable[tuple[str, int]] | None,
) -> dict[tuple[str, int], _Frame]:
    """Every scored camera frame, labels and tracked boxes side by side."""
    wanted = None if images is None else {(str(c), int(k)) for c, k in images}
    image_key = {
        int(im["id"]): (str(im["camera"]), int(im["frame_index"]))
        for im in gt["images"]
        if wanted is None or (str(im["camera"]), int(im["frame_index"])) in wanted
    }
    if not image_key:
        raise ConfigError("none of the evaluated frames (camera, frame_index) is labelled")
    anns = _targets_and_ignored(gt, set(image_key), th)
    if anns and not all("track_id" in a for a in anns):
        raise ConfigError("eval --track needs labels with track ids (a simulated clip's)")
    labels: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for a in anns:
        labels[image_key[int(a["image_id"])]].append(a)
    records = {(str(d["camera"]), int(d["frame_index"])): d for d in detections}
    if any(d.get("boxes") and "track_ids" not in d for d in records.values()):
        raise ConfigError("the detections carry no track ids: run with tracking (track=True)")
    return {key: _frame(labels[key], records.get(key)) for key in image_key.values()}


def _frame(labels: list[dict[str, Any]], record: Mapping[str, Any] | None) -> _Frame:
    boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in labels)], float)
    boxes = boxes.reshape(-1, 4)
    ignored = np.array([bool(a["iscrowd"]) for a in labels], bool)
    tracked = [
        (box, int(t), int(g))
        for box, t, g in zip(
            (record or {}).get("boxes", []),
            (record or {}).get("track_ids", []),
            (record or {}).get("global_ids") or itertools.repeat(-1),
            strict=False,
        )
        if int(t) >= 0
    ]
    preds = np.array([b for b, _, _ in tracked], float).reshape(-1, 4)
    return _Frame(
        world_ids=[int(a.get("track_id", -1)) for a in labels],
        boxes=boxes,
        ignored=ignored,
        distance_m=[a.get("distance_m") for a in labels],
        pred_boxes=preds,
        track_ids=[t for _, t, _ in tracked],
        global_ids=[g for _, _, g in tracked],
        kept=kept_predictions(boxes[~ignored], boxes[ignored], preds),
    )


def _step(f: _Frame, key: tuple[str, int], *, rig: bool) -> Step:
    """A frame as a timestep: targets by world id; kept tracked boxes by track id (`rig`:
    by global id, a box without one by its camera's track). A box whose id repeats one of
    its frame's (an id the tracker gave twice) gets an id of its own."""
    cam = key[0]
    ids: list[Hashable] = []
    for i in np.flatnonzero(f.kept):
        t, g = f.track_ids[i], f.global_ids[i]
        one: Hashable = ("g", g) if rig and g >= 0 else ("t", cam, t)
        ids.append(one if one not in ids else ("dup", key, int(i)))
    targets = ~f.ignored
    return Step(
        gt_ids=tuple(w for w, t in zip(f.world_ids, targets, strict=True) if t),
        gt_boxes=f.boxes[targets],
        pred_ids=tuple(ids),
        pred_boxes=f.pred_boxes[f.kept],
    )


def _placed(objects: Iterable[Mapping[str, Any]]) -> dict[tuple[int, str, int], Mapping[str, Any]]:
    """(frame_index, camera, track id) -> the placed object that sighting belongs to."""
    found = {}
    for step in objects:
        for obj in step.get("objects", []):
            for s in obj.get("boxes", []):
                found[(int(step["frame_index"]), str(s["camera"]), int(s["track_id"]))] = obj
    return found


def _sightings(
    frames: Mapping[tuple[str, int], _Frame],
    placed: Mapping[tuple[int, str, int], Mapping[str, Any]],
    mounts: Mapping[str, tuple[float, float]],
) -> tuple[dict[tuple[int, int], list[int]], list[tuple[float, float]]]:
    """Labelled boxes (targets and ignored alike: the thresholds excuse misses, they do not
    hide matches) matched to tracked boxes: each world object's global ids per instant, and
    (true, predicted) distances of the sightings whose object was placed."""
    gids: dict[tuple[int, int], list[int]] = defaultdict(list)
    ranges: list[tuple[float, float]] = []
    for (cam, k), f in frames.items():
        for row, col in match(box_iou(f.boxes, f.pred_boxes)):
            gids[(k, f.world_ids[row])].append(f.global_ids[col])
            obj = placed.get((k, cam, f.track_ids[col]))
            true_m = f.distance_m[row]
            pred_m = object_range_m(obj, mounts.get(cam)) if obj is not None else None
            if true_m is not None and pred_m is not None:
                ranges.append((float(true_m), pred_m))
    return gids, ranges
