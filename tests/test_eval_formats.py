"""`drivepercept eval` on labelled data: MOTChallenge, COCO json (the mmdetection3d KITTI
and nuScenes files too), class tables, ignore regions and bad input.

The format tests read the third-party fixtures beside the project (../shared/reallabeled,
non-commercial licences: used in place, never copied) when they are there, and hold them to
their known facts (88 considered pedestrians, ...). Where they are not (a fresh clone, or
DRIVEPERCEPT_TEST_SHARED=none), the same tests run on made stand-ins of the same structure
(tests/madelabels.py: a MOT17-style sequence, KITTI and nuScenes `*.coco.json` files, noise
images) against the facts counted from what was written. Nothing here skips.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from madelabels import Labelled, make_labelled
from thirdparty import REAL_LABELED, present

from drivepercept.errors import ConfigError
from drivepercept.eval import (
    MOT_CLASSES,
    ClassRule,
    EvalThresholds,
    class_rule,
    class_table,
    score_detections,
)
from drivepercept.run.groundtruth import GroundTruth, read_ground_truth
from drivepercept.types import DRIVING_CLASSES

ORACLE = "drivepercept.models.oracle:make_oracle"
PEDESTRIAN = DRIVING_CLASSES.index("pedestrian") + 1

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Labelled:
    """The real MOT17, KITTI and nuScenes fixtures and their known facts where they are there,
    else made stand-ins (tests/madelabels.py) and the facts counted from what they hold."""
    if not present(REAL_LABELED):
        return make_labelled(tmp_path_factory.mktemp("madelabels"))
    return Labelled(
        made=False,
        mot=REAL_LABELED / "mot17" / "MOT17-02-FRCNN",
        mot_name="MOT17-02-FRCNN",
        mot_frames=4,
        mot_considered=88,
        mot_person_like=48,
        mot_visible=43,  # 43 at least half visible
        kitti=REAL_LABELED / "kitti" / "kitti_infos_mono3d.coco.json",
        kitti_frame=1,  # 000000, 000007, 000008: 000007 is second
        kitti_folder_frames=3,
        kitti_missing=0,
        kitti_kinds={("car", "target"): 3, ("cyclist", "target"): 1},
        nuscenes=REAL_LABELED / "nuscenes_one_camera" / "nus_infos_mono3d.coco.json",
        nuscenes_camera="CAM_BACK_LEFT",
        nuscenes_missing=5,
        nuscenes_kinds={("pedestrian", "target"): 2},  # its 3 traffic cones: dropped
    )


def _as_detections(truth: GroundTruth, *, ignores: bool = True) -> list[dict[str, Any]]:
    """The labels themselves as detections.jsonl-style frames (ignore regions too, unless
    `ignores` is False)."""
    frames = {
        im["id"]: {
            "camera": im["camera"],
            "frame_index": im["frame_index"],
            "boxes": [],
            "scores": [],
            "class_names": [],
        }
        for im in truth.coco["images"]
    }
    for ann in truth.coco["annotations"]:
        if ann["iscrowd"] and not ignores:
            continue
        x, y, w, h = ann["bbox"]
        frame = frames[ann["image_id"]]
        frame["boxes"].append([x, y, x + w, y + h])
        frame["scores"].append(0.9)
        frame["class_names"].append(DRIVING_CLASSES[ann["category_id"] - 1])
    return list(frames.values())


def _kinds(truth: GroundTruth) -> Counter[tuple[str, str]]:
    """(class, target or ignore) -> count."""
    return Counter(
        (DRIVING_CLASSES[a["category_id"] - 1], "ignore" if a["iscrowd"] else "target")
        for a in truth.coco["annotations"]
    )


# --------------------------------------------------------------------------- class tables


def test_class_tables_map_each_format_onto_the_driving_classes() -> None:
    assert class_table(["Pedestrian", "Cyclist", "Car"]) == "kitti"
    assert class_table(["car", "trailer", "traffic_cone", "barrier"]) == "nuscenes"
    assert class_table(["person", "car", "dog"]) == "coco"
    assert class_table([]) == "coco"
    assert class_rule("kitti", "Car") == ClassRule("car")
    assert class_rule("kitti", "Van") == ClassRule("car", scored=False)
    assert class_rule("kitti", "Person_sitting") == ClassRule("pedestrian", scored=False)
    assert class_rule("kitti", "Misc") is None
    assert class_rule("nuscenes", "motorcycle") == ClassRule("cyclist")
    assert class_rule("nuscenes", "bicycle") == ClassRule("cyclist")
    assert class_rule("nuscenes", "trailer") == ClassRule("truck", scored=False)
    assert class_rule("nuscenes", "traffic_cone") is None
    assert class_rule("coco", "person") == ClassRule("pedestrian")
    assert class_rule("coco", "motorcycle") == ClassRule("cyclist")
    assert class_rule("coco", "stop sign") == ClassRule("traffic_sign")
    assert class_rule("coco", "pedestrian") == ClassRule("pedestrian")  # our own names too
    assert class_rule("coco", "dog") is None
    # MOT: the benchmark's distractors are ignore regions of pedestrians; occluders dropped
    assert {c for c, r in MOT_CLASSES.items() if r == ClassRule("pedestrian", False)} == {
        2,
        7,
        8,
        12,
    }
    assert MOT_CLASSES[1] == ClassRule("pedestrian") and 9 not in MOT_CLASSES
    with pytest.raises(ConfigError, match="expected one of"):
        ClassRule("tram")


# --------------------------------------------------------------------------- real formats


def _mot_rows(labelled: Labelled) -> list[list[float]]:
    """The gt.txt rows of the frames that have an image (the rest are not scored)."""
    with (labelled.mot / "gt" / "gt.txt").open() as fh:
        rows = [[float(v) for v in r] for r in csv.reader(fh)]
    return [r for r in rows if r[0] <= labelled.mot_frames]


def test_mot_sequence_scores_considered_pedestrians_and_ignores_the_rest(
    labelled: Labelled,
) -> None:
    mot, name = labelled.mot, labelled.mot_name
    truth = read_ground_truth(mot)
    assert truth.format == "mot" and truth.cameras == (name,)
    assert truth.sources == (f"{name}={mot / 'img1'}",)
    images = sorted((im["frame_index"], Path(im["file_name"]).name) for im in truth.coco["images"])
    # frame N is frame_index N-1
    assert images == [(i, f"{i + 1:06d}.jpg") for i in range(labelled.mot_frames)]
    rows = _mot_rows(labelled)
    considered = [r for r in rows if r[7] == 1 and r[6] == 1]
    person_like = [r for r in rows if (r[7] in (2, 7, 8, 12) or (r[7] == 1 and r[6] == 0))]
    kinds = _kinds(truth)
    assert kinds["pedestrian", "target"] == len(considered) == labelled.mot_considered
    assert kinds["pedestrian", "ignore"] == len(person_like) == labelled.mot_person_like
    assert kinds["cyclist", "ignore"] == sum(r[7] in (4, 5) for r in rows)
    assert kinds["car", "ignore"] == sum(r[7] == 3 for r in rows)
    assert sum(kinds.values()) == len(rows) - sum(r[7] in (6, 9, 10, 11) for r in rows)
    # 1-based pixels -> 0-based: the first considered row of frame 1
    first = next(r for r in considered if r[0] == 1)
    boxes = [a["bbox"] for a in truth.coco["annotations"] if a["image_id"] == 1]
    assert [first[2] - 1, first[3] - 1, first[4], first[5]] in boxes


def test_min_visibility_turns_hidden_pedestrians_into_ignore_regions(
    labelled: Labelled,
) -> None:
    truth = read_ground_truth(labelled.mot)
    targets_only = _as_detections(truth, ignores=False)
    loose = score_detections(truth.coco, targets_only, thresholds=EvalThresholds(0.0, 0.0))
    strict = score_detections(truth.coco, targets_only, thresholds=EvalThresholds(0.5, 0.0))
    considered, visible = labelled.mot_considered, labelled.mot_visible
    assert 0 < visible < considered
    assert visible == sum(r[7] == 1 and r[6] == 1 and r[8] >= 0.5 for r in _mot_rows(labelled))
    assert (loose.targets, strict.targets) == (considered, visible)
    assert strict.ignored - loose.ignored == considered - visible
    for report in (loose, strict):  # the hidden ones, found or not, cost nothing
        assert report.per_class["pedestrian"]["ap_50"] == pytest.approx(1.0)
        assert report.per_class["pedestrian"]["recall_50"] == pytest.approx(1.0)


def test_kitti_coco_json_matches_its_image_by_base_name(labelled: Labelled) -> None:
    listed = json.loads(labelled.kitti.read_text())["images"]
    assert "training/image_2/000007.png" in [im["file_name"] for im in listed]
    truth = read_ground_truth(labelled.kitti)
    assert truth.format == "kitti" and truth.missing_images == labelled.kitti_missing
    placed = [(im["camera"], im["frame_index"]) for im in truth.coco["images"]]
    assert placed == [("image_2", labelled.kitti_frame)]
    (image,) = truth.coco["images"]
    assert Path(image["file_name"]).name == "000007.png"
    assert truth.folder_frames == {"image_2": labelled.kitti_folder_frames}
    assert _kinds(truth) == labelled.kitti_kinds


def test_nuscenes_scores_only_the_camera_image_that_is_present(labelled: Labelled) -> None:
    truth = read_ground_truth(labelled.nuscenes)
    assert truth.format == "nuscenes" and truth.missing_images == labelled.nuscenes_missing
    assert truth.cameras == (labelled.nuscenes_camera,)
    (image,) = truth.coco["images"]
    assert labelled.nuscenes_camera in image["file_name"]
    assert _kinds(truth) == labelled.nuscenes_kinds


@pytest.mark.parametrize("source", ["mot", "kitti", "nuscenes"])
def test_the_labels_as_detections_score_one(labelled: Labelled, source: str) -> None:
    truth = read_ground_truth(getattr(labelled, source))
    report = score_detections(
        truth.coco, _as_detections(truth), thresholds=EvalThresholds(0.0, 0.0), images=None
    )
    assert report.map_50 == pytest.approx(1.0) and report.recall_50 == pytest.approx(1.0)
    for name, scores in report.per_class.items():
        assert scores["ap_50"] == pytest.approx(1.0), name
        assert scores["recall_50"] == pytest.approx(1.0), name
    moved = _as_detections(truth)  # every box three of its heights lower: no hit left
    for frame in moved:
        frame["boxes"] = [
            [x0, y1 + 2 * (y1 - y0), x1, y1 + 3 * (y1 - y0)] for x0, y0, x1, y1 in frame["boxes"]
        ]
    assert score_detections(truth.coco, moved, thresholds=EvalThresholds(0.0, 0.0)).map_50 < 0.1


# --------------------------------------------------------------------------- generic COCO


def _images(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        cv2.imwrite(str(folder / name), np.full((48, 64, 3), 100, np.uint8))


def _coco(images: list[dict[str, Any]], annotations: list[dict[str, Any]]) -> dict[str, Any]:
    categories = [
        {"id": 1, "name": "person"},
        {"id": 2, "name": "car"},
        {"id": 3, "name": "dog"},
        {"id": 4, "name": "motorcycle"},
    ]
    return {"images": images, "annotations": annotations, "categories": categories}


def _ann(n: int, image_id: int, cat: int, box: list[float], **extra: Any) -> dict[str, Any]:
    return {"id": n, "image_id": image_id, "category_id": cat, "bbox": box, **extra}


@pytest.fixture
def coco_set(tmp_path: Path) -> Path:
    """A COCO json whose file_names keep a folder that is not there (as exported elsewhere);
    the images: cam/a.png (not listed), cam/b.png, cam/c.png."""
    _images(tmp_path / "data" / "cam", "a.png", "b.png", "c.png")
    data = _coco(
        [
            {"id": 10, "file_name": "export/cam/b.png", "width": 64, "height": 48},
            {"id": 11, "file_name": "cam/c.png", "width": 64, "height": 48},
            {"id": 12, "file_name": "cam/gone.png", "width": 64, "height": 48},
        ],
        [
            _ann(1, 10, 1, [5, 5, 10, 20]),
            _ann(2, 10, 3, [30, 5, 10, 10]),  # dog: dropped
            _ann(3, 11, 2, [2, 2, 30, 20]),
            _ann(4, 11, 1, [40, 10, 10, 25], iscrowd=1),  # a crowd: ignore region
            _ann(5, 11, 4, [40, 30, 12, 14]),
            _ann(6, 12, 2, [1, 1, 5, 5]),  # on an image that is absent
        ],
    )
    path = tmp_path / "data" / "instances.json"
    path.write_text(json.dumps(data))
    return path


def test_coco_json_maps_coco_names_and_keeps_crowds_as_ignore_regions(coco_set: Path) -> None:
    truth = read_ground_truth(coco_set)
    assert truth.format == "coco" and truth.missing_images == 1
    placed = {Path(im["file_name"]).name: im["frame_index"] for im in truth.coco["images"]}
    assert placed == {"b.png": 1, "c.png": 2}  # the folder reader's order, a.png first
    assert _kinds(truth) == {
        ("pedestrian", "target"): 1,
        ("pedestrian", "ignore"): 1,
        ("car", "target"): 1,
        ("cyclist", "target"): 1,
    }
    # the same labels given as an image folder and --ground-truth
    again = read_ground_truth(coco_set.parent / "cam", annotations=coco_set)
    assert again.coco == truth.coco and again.sources == truth.sources


def test_detections_on_ignore_regions_and_unlabelled_classes_cost_nothing(
    coco_set: Path,
) -> None:
    truth = read_ground_truth(coco_set)
    frames = _as_detections(truth)  # the crowd found as a pedestrian too
    frames[0]["boxes"].append([30, 5, 40, 15])  # a "traffic light" on the dog: no such class
    frames[0]["scores"].append(0.95)
    frames[0]["class_names"].append("traffic light")
    report = score_detections(truth.coco, frames, thresholds=EvalThresholds(0.0, 0.0))
    assert report.map_50 == pytest.approx(1.0)
    assert set(report.per_class) == {"pedestrian", "car", "cyclist"}
    assert report.per_class["pedestrian"]["targets"] == 1


# --------------------------------------------------------------------------- bad input


def _mot_sequence(root: Path, gt_rows: str | None) -> Path:
    seq = root / "SEQ-01"
    _images(seq / "img1", "000001.jpg", "000002.jpg")
    (seq / "seqinfo.ini").write_text("[Sequence]\nname=SEQ-01\nimDir=img1\nseqLength=2\n")
    if gt_rows is not None:
        (seq / "gt").mkdir()
        (seq / "gt" / "gt.txt").write_text(gt_rows)
    return seq


def test_a_small_mot_sequence_reads(tmp_path: Path) -> None:
    seq = _mot_sequence(tmp_path, "1,1,11,11,10,20,1,1,0.9\n2,1,12,11,10,20,0,1,1.0\n")
    truth = read_ground_truth(seq)
    assert _kinds(truth) == {("pedestrian", "target"): 1, ("pedestrian", "ignore"): 1}
    assert truth.coco["annotations"][0]["bbox"] == [10.0, 10.0, 10.0, 20.0]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no_gt", "no ground truth at"),
        ("short_row", "line 2: expected frame, id, x, y, w, h"),
        ("text_row", "line 1: expected"),
        ("no_section", "no [Sequence] section"),
        ("not_coco", "is not a COCO annotation file"),
        ("not_json", "is not valid JSON"),
        ("bad_bbox", "malformed COCO annotations"),
        ("no_images", "none of the 1 images"),
        ("folder_without_labels", "is no labelled data eval reads"),
        ("nothing_there", "no such file or folder"),
    ],
)
def test_bad_labelled_data_is_one_config_error(tmp_path: Path, case: str, message: str) -> None:
    source: Path = tmp_path
    if case in ("no_gt", "short_row", "text_row", "no_section"):
        rows = {"short_row": "1,1,1,1,5,5,1,1,1\n2,1,1,1,5\n", "text_row": "frame,id\n"}
        source = _mot_sequence(tmp_path, None if case == "no_gt" else rows.get(case, ""))
        if case == "no_section":
            (source / "seqinfo.ini").write_text("name=SEQ-01\n")
    elif case in ("not_coco", "not_json", "bad_bbox", "no_images"):
        source = tmp_path / "labels.json"
        _images(tmp_path / "imgs", "x.png")
        image = {"id": 1, "file_name": "x.png" if case != "no_images" else "y.png"}
        data: Any = _coco([image], [_ann(1, 1, 1, [0, 0, 5, 5])])
        if case == "bad_bbox":
            data["annotations"][0]["bbox"] = [0, 0, "w", 5]
        text = json.dumps(data if case != "not_coco" else [data])
        source.write_text(text if case != "not_json" else text[:20])
    elif case == "folder_without_labels":
        _images(tmp_path / "imgs", "x.png")
        source = tmp_path / "imgs"
    else:
        source = tmp_path / "missing"
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as caught:
        read_ground_truth(source)
    assert "\n" not in str(caught.value)


def _eval_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drivepercept", "eval", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def test_cli_bad_labelled_data_is_one_line(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    # in this process; test_eval.py's test_bad_eval_input_is_one_clear_line[corrupt] runs the
    # real eval command on bad input
    seq = _mot_sequence(tmp_path, "1,1,1,1,5\n")
    argv = ["eval", str(seq), "--model", ORACLE, "--weights", "none", "--out", str(tmp_path)]
    code, err = in_process([*argv, "--no-progress"])
    assert code == 2, err
    assert err.count("\n") == 1 and "line 1: expected frame" in err, err
    assert "Traceback" not in err and not list(tmp_path.glob("eval-*"))


def test_an_image_the_reader_skips_is_an_error_not_shifted_frames(tmp_path: Path) -> None:
    seq = _mot_sequence(tmp_path, "1,1,11,11,10,20,1,1,1.0\n")
    (seq / "img1" / "000002.jpg").write_bytes(b"not a jpeg")  # read past with a warning
    proc = _eval_cli(str(seq), "--model", ORACLE, "--weights", "none", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "read 1 of its 2 images" in proc.stderr and "Traceback" not in proc.stderr


def _summary(report: Mapping[str, Any]) -> dict[str, Any]:
    return {k: report[k] for k in ("format", "images", "targets", "schema_version")}


def test_cli_eval_of_a_mot_sequence_with_the_bundled_model(
    labelled: Labelled, tmp_path: Path
) -> None:
    proc = _eval_cli(
        str(labelled.mot),
        "--model",
        "drivepercept-tiny",
        "--weights",
        "DEFAULT",
        "--min-visibility",
        "0.5",
        "--out",
        str(tmp_path),
        "--name",
        "mot",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "mot" / "eval.json").read_text())
    assert _summary(report) == {
        "format": "mot",
        "images": labelled.mot_frames,
        "targets": labelled.mot_visible,  # every one at least 12 pixels tall too
        "schema_version": 3,
    }
    pedestrians = report["per_class"]["pedestrian"]
    assert set(pedestrians) == {"ap_50_95", "ap_50", "recall_50", "targets"}
    assert 0.0 <= pedestrians["recall_50"] <= 1.0
    assert pedestrians["targets"] == labelled.mot_visible
    assert set(report["per_camera"]) == {labelled.mot_name}
    assert report["model"] == "drivepercept-tiny" and report["detections"] >= 0
    table = proc.stdout.splitlines()
    assert "recall@.5" in table[0]
    assert any(line.split()[:1] == ["pedestrian"] for line in table)
