"""COCO evaluation against the simulator's ground truth, and `drivepercept eval`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drivepercept.errors import ConfigError
from drivepercept.eval import EvalThresholds, load_ground_truth, score_detections

SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"
ORACLE = "drivepercept.models.oracle:make_oracle"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ground_truth() -> dict[str, Any]:
    return load_ground_truth(SAMPLE / "ground_truth.json")


def _gt_as_detections(
    gt: dict[str, Any],
    frames: range,
    *,
    shift: float = 0.0,
    swap: dict[str, str] | None = None,
    keep: Any = None,
) -> list[dict[str, Any]]:
    """Ground truth itself as detections.jsonl-style frames (boxes optionally shifted by a
    fraction of their width, cameras optionally swapped)."""
    names = {c["id"]: c["name"] for c in gt["categories"]}
    out: dict[int, dict[str, Any]] = {}
    for im in gt["images"]:
        if im["frame_index"] in frames:
            cam = (swap or {}).get(im["camera"], im["camera"])
            out[im["id"]] = {
                "camera": cam,
                "frame_index": im["frame_index"],
                "boxes": [],
                "scores": [],
                "class_names": [],
            }
    for ann in gt["annotations"]:
        f = out.get(ann["image_id"])
        if f is None or (keep is not None and not keep(ann)):
            continue
        x, y, w, h = ann["bbox"]
        f["boxes"].append([x + shift * w, y, x + w + shift * w, y + h])
        f["scores"].append(0.9)
        f["class_names"].append(names[ann["category_id"]])
    return list(out.values())


def test_ground_truth_scores_one_and_half_width_shift_scores_far_lower(
    ground_truth: dict[str, Any],
) -> None:
    frames = range(0, 120, 10)
    perfect = score_detections(ground_truth, _gt_as_detections(ground_truth, frames))
    assert perfect.map_50 == pytest.approx(1.0)
    assert perfect.map_50_95 == pytest.approx(1.0)
    assert perfect.recall == pytest.approx(1.0)
    assert set(perfect.per_camera) == {
        "front",
        "front_left",
        "front_right",
        "back",
        "back_left",
        "back_right",
    }
    assert all(v["ap_50"] == pytest.approx(1.0) for v in perfect.per_camera.values())
    assert perfect.images == 6 * len(frames) and perfect.targets > 50
    shifted = score_detections(ground_truth, _gt_as_detections(ground_truth, frames, shift=0.5))
    assert shifted.map_50 < 0.1


def test_scoring_without_per_camera_figures_gives_the_same_overall(
    ground_truth: dict[str, Any],
) -> None:
    frames = range(0, 120, 10)
    shifted = _gt_as_detections(ground_truth, frames, shift=0.3)
    full = score_detections(ground_truth, shifted)
    overall = score_detections(ground_truth, shifted, by_camera=False)
    assert overall.per_camera == {} and len(full.per_camera) == 6
    assert (overall.map_50, overall.map_50_95, overall.recall) == (
        full.map_50,
        full.map_50_95,
        full.recall,
    )
    assert 0.0 < overall.map_50 < 1.0


def test_detections_of_the_wrong_camera_score_low(ground_truth: dict[str, Any]) -> None:
    swap = {
        "front": "back",
        "back": "front",
        "front_left": "back_right",
        "back_right": "front_left",
        "front_right": "back_left",
        "back_left": "front_right",
    }
    report = score_detections(
        ground_truth, _gt_as_detections(ground_truth, range(0, 120, 20), swap=swap)
    )
    assert report.map_50 < 0.2


def test_ignore_regions_are_neither_misses_nor_false_positives(
    ground_truth: dict[str, Any],
) -> None:
    th = EvalThresholds(min_visibility=0.5, min_height_px=20)
    frames = range(0, 120, 15)

    def is_target(ann: dict[str, Any]) -> bool:
        return bool(ann["visibility"] >= 0.5 and ann["bbox"][3] >= 20)

    only_targets = score_detections(
        ground_truth, _gt_as_detections(ground_truth, frames, keep=is_target), thresholds=th
    )
    everything = score_detections(
        ground_truth, _gt_as_detections(ground_truth, frames), thresholds=th
    )
    assert only_targets.map_50 == pytest.approx(1.0)  # ignored objects missed: no penalty
    assert everything.map_50 == pytest.approx(1.0)  # ignored objects found: no false positive
    assert everything.ignored > 0 and everything.targets == only_targets.targets
    # while with no ignore regions, the same "only targets" detections miss objects
    strict = score_detections(
        ground_truth,
        _gt_as_detections(ground_truth, frames, keep=is_target),
        thresholds=EvalThresholds(min_visibility=0.0, min_height_px=0),
    )
    assert strict.recall < 0.9


def test_coco_class_names_map_onto_the_rig_classes(ground_truth: dict[str, Any]) -> None:
    frames = _gt_as_detections(ground_truth, range(0, 120, 30))
    coco = {
        "pedestrian": "person",
        "cyclist": "bicycle",
        "traffic_light": "traffic light",
        "traffic_sign": "stop sign",
    }
    for f in frames:
        f["class_names"] = [coco.get(n, n) for n in f["class_names"]]
    assert score_detections(ground_truth, frames).map_50 == pytest.approx(1.0)


def test_camera_with_nothing_to_score_is_not_reported_as_zero(ground_truth: dict[str, Any]) -> None:
    report = score_detections(ground_truth, _gt_as_detections(ground_truth, range(3)))
    empty = [c for c, ap in report.per_camera.items() if ap["ap_50"] < 0]
    assert empty == ["front_right"]  # no objects there in frames 0-2: n/a, not 0.0
    assert all(
        ap["ap_50"] == pytest.approx(1.0) for c, ap in report.per_camera.items() if c not in empty
    )
    assert "n/a" in report.table()


def test_frames_without_detections_count_as_misses(ground_truth: dict[str, Any]) -> None:
    half = _gt_as_detections(ground_truth, range(0, 10))
    wanted = [
        (im["camera"], im["frame_index"]) for im in ground_truth["images"] if im["frame_index"] < 20
    ]
    report = score_detections(ground_truth, half, images=wanted)
    assert report.images == 6 * 20
    assert report.recall < 0.7 and report.map_50 < 0.7
    with pytest.raises(ConfigError, match="none of the evaluated frames"):
        score_detections(
            ground_truth, [{**f, "frame_index": f["frame_index"] + 1000} for f in half]
        )


def test_a_model_that_detects_nothing_scores_zero_not_n_a(ground_truth: dict[str, Any]) -> None:
    nothing = [
        {**f, "boxes": [], "scores": [], "class_names": []}
        for f in _gt_as_detections(ground_truth, range(3))
    ]
    report = score_detections(ground_truth, nothing)
    assert report.targets > 0 and report.detections == 0
    assert (report.map_50, report.map_50_95, report.recall, report.recall_50) == (0, 0, 0, 0)
    assert report.per_class and all(
        (c["ap_50"], c["recall_50"]) == (0.0, 0.0) and c["targets"] > 0
        for c in report.per_class.values()
    )
    # a camera with nothing to score stays n/a; the others missed everything
    assert report.per_camera["front_right"]["ap_50"] < 0
    assert all(v["ap_50"] == 0.0 for c, v in report.per_camera.items() if c != "front_right")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["annotations"][0].pop("id"), "malformed"),
        (lambda d: d["annotations"][0].update(bbox=["a", 1, 2, 3]), "4 numbers"),
        (lambda d: d["annotations"][0].update(visibility=None), "visibility"),
        (lambda d: d["categories"][0].pop("name"), "malformed"),
    ],
)
def test_structurally_malformed_ground_truth(tmp_path: Path, mutate: Any, message: str) -> None:
    data = json.loads((SAMPLE / "ground_truth.json").read_text())
    mutate(data)
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_ground_truth(path)


def test_bad_ground_truth_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no ground truth"):
        load_ground_truth(tmp_path / "ground_truth.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_ground_truth(bad)
    bad.write_text('{"images": []}')
    with pytest.raises(ConfigError, match="lacks COCO"):
        load_ground_truth(bad)
    bad.write_text('{"images": [{"id": 1}], "annotations": [], "categories": []}')
    with pytest.raises(ConfigError, match="malformed"):
        load_ground_truth(bad)
    with pytest.raises(ConfigError, match="no camera rear"):
        load_ground_truth(SAMPLE / "ground_truth.json", cameras=["front", "rear"])


def _eval_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drivepercept", "eval", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_eval_command_writes_eval_json(tmp_path: Path) -> None:
    proc = _eval_cli(
        str(SAMPLE),
        "--model",
        ORACLE,
        "--weights",
        "none",
        "--max-frames",
        "3",
        "--out",
        str(tmp_path),
        "--name",
        "e",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert report["images"] == 18 and report["targets"] > 0
    assert report["pipeline"]["score_threshold"] == 0.05 and report["device"] == "cpu"
    assert report["map_50"] < 0.2  # the oracle's one fixed box is not where objects are
    assert set(report["per_camera"]) == {
        "front",
        "front_left",
        "front_right",
        "back",
        "back_left",
        "back_right",
    }
    assert "mAP@.5" in proc.stdout


@pytest.mark.parametrize("case", ["no_gt", "other_cameras", "corrupt", "two_clips"])
def test_bad_eval_input_is_one_clear_line(
    tmp_path: Path,
    case: str,
    in_process: Callable[[list[str]], tuple[int, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clip = tmp_path / "clip"
    shutil.copytree(SAMPLE, clip)
    args = [str(clip)]
    gt = clip / "ground_truth.json"
    if case == "no_gt":
        gt.unlink()
        message = "no ground truth"
    elif case == "other_cameras":
        data = json.loads(gt.read_text())
        for im in data["images"]:
            im["camera"] = "cam_" + im["camera"]
        gt.write_text(json.dumps(data))
        message = "has no camera"
    elif case == "corrupt":
        gt.write_text(gt.read_text()[:5000])
        message = "not valid JSON"
    else:
        args.append(str(clip))
        message = "exactly one clip"
    args += ["--model", ORACLE, "--weights", "none", "--out", str(tmp_path)]
    if case == "corrupt":
        # the real command once (no test_the_real_command_prints_one_line case runs eval):
        # its stderr holds whatever OpenCV and torch print themselves too, without the
        # OpenCV settings an in-process `main` before it may have left in this environment
        for name in ("OPENCV_LOG_LEVEL", "OPENCV_FFMPEG_LOGLEVEL"):
            monkeypatch.delenv(name, raising=False)
        proc = _eval_cli(*args)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = in_process(["eval", *args, "--no-progress"])
    assert code == 2  # bad input
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("eval-*"))  # nothing run, no half-made run folder
