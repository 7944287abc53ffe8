"""`drivepercept eval`'s accuracy side: detections against ground truth, with COCO metrics.

The detections come from the replay pipeline (`drivepercept.run.evaluation`, the same code path
as `replay`); this package is pure, one job a module:

* `classes`: class rules, how a model's and a labelled data set's class names map onto the
  driving classes (targets, ignore regions, dropped);
* `truth`: ground-truth files read and checked (the one COCO validator, MOTChallenge files);
* `scoring`: `score_detections`, pycocotools' COCOeval over detections.jsonl-style frames;
* `report`: `EvalThresholds` and the `EvalReport` it ends in.
"""

from __future__ import annotations

from drivepercept.eval.classes import (
    CLASS_ALIASES,
    KITTI_CLASSES,
    MOT_CLASSES,
    NUSCENES_CLASSES,
    TABLES,
    ClassRule,
    canonical_class,
    class_rule,
    class_table,
)
from drivepercept.eval.report import EVAL_SCHEMA_VERSION, EvalReport, EvalThresholds
from drivepercept.eval.scoring import score_detections
from drivepercept.eval.truth import (
    COCO_ANNOTATIONS,
    COCO_SECTIONS,
    GROUND_TRUTH_FILE,
    MOT_COLUMNS,
    SIMULATED_TRUTH,
    CocoKind,
    clip_paths,
    load_ground_truth,
    read_coco_json,
    read_mot_rows,
    read_seqinfo,
)

__all__ = [
    "CLASS_ALIASES",
    "COCO_ANNOTATIONS",
    "COCO_SECTIONS",
    "EVAL_SCHEMA_VERSION",
    "GROUND_TRUTH_FILE",
    "KITTI_CLASSES",
    "MOT_CLASSES",
    "MOT_COLUMNS",
    "NUSCENES_CLASSES",
    "SIMULATED_TRUTH",
    "TABLES",
    "ClassRule",
    "CocoKind",
    "EvalReport",
    "EvalThresholds",
    "canonical_class",
    "class_rule",
    "class_table",
    "clip_paths",
    "load_ground_truth",
    "read_coco_json",
    "read_mot_rows",
    "read_seqinfo",
    "score_detections",
]
