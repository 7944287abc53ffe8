"""Tracking metrics (TrackEval's HOTA, CLEAR, Identity) and streaming AP, on hand-made
ground truth and predictions whose right answers are worked out by hand; then `eval --track`
and `--forecast` end to end on the sample clip."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from drivepercept.errors import ConfigError
from drivepercept.eval.report import TrackingScores
from drivepercept.eval.streaming import (
    capture_times_ns,
    forecast_boxes,
    newest_outputs,
    score_streaming,
    streaming_frames,
)
from drivepercept.eval.tracking import (
    box_ioa,
    box_iou,
    kept_predictions,
    object_range_m,
    range_errors,
    same_id_share,
    score_tracking,
)

pytestmark = pytest.mark.timeout(300)

SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"
T_NS = 100_000_000  # a frame every 100 ms (10 fps)
Box = Sequence[float]


class Clip:
    """Hand-made labels (COCO, as `simulate` writes them) and detections.jsonl-style lines."""

    def __init__(self, cameras: Sequence[str] = ("front",), frames: int = 10) -> None:
        self.gt: dict[str, Any] = {
            "images": [],
            "annotations": [],
            "categories": [{"id": 1, "name": "car"}],
        }
        self.image: dict[tuple[str, int], int] = {}
        for k in range(frames):
            for cam in cameras:
                self.image[(cam, k)] = len(self.image) + 1
                self.gt["images"].append(
                    {
                        "id": self.image[(cam, k)],
                        "camera": cam,
                        "frame_index": k,
                        "timestamp_s": k * T_NS / 1e9,
                        "width": 640,
                        "height": 360,
                    }
                )
        self.records: dict[tuple[str, int], dict[str, Any]] = {}

    def label(
        self, cam: str, k: int, box: Box, world: int, *, distance_m: float = 20.0, vis: float = 1.0
    ) -> None:
        x0, y0, x1, y1 = box
        self.gt["annotations"].append(
            {
                "id": len(self.gt["annotations"]) + 1,
                "image_id": self.image[(cam, k)],
                "category_id": 1,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "iscrowd": 0,
                "track_id": world,
                "visibility": vis,
                "distance_m": distance_m,
            }
        )

    def detect(
        self,
        cam: str,
        k: int,
        box: Box,
        track: int,
        gid: int = -1,
        *,
        velocity: Sequence[float] | None = None,
    ) -> None:
        r = self.records.setdefault(
            (cam, k),
            {
                "camera": cam,
                "frame_index": k,
                "timestamps": {"capture_ns": k * T_NS, "emitted_ns": k * T_NS + T_NS // 2},
                "boxes": [],
                "scores": [],
                "labels": [],
                "class_names": [],
                "track_ids": [],
                "velocities": [],
                "global_ids": [],
            },
        )
        r["boxes"].append(list(box))
        r["scores"].append(0.9)
        r["labels"].append(0)
        r["class_names"].append("car")
        r["track_ids"].append(track)
        r["velocities"].append(None if velocity is None else list(velocity))
        r["global_ids"].append(gid)

    def lines(self) -> list[dict[str, Any]]:
        return list(self.records.values())

    def score(self, **kwargs: Any) -> TrackingScores:
        return score_tracking(self.gt, self.lines(), **kwargs)


def _box(k: int, y: float = 100.0, dx: float = 0.0) -> tuple[float, float, float, float]:
    x = 50.0 + k * dx
    return (x, y, x + 40.0, y + 40.0)


def _two_objects(clip: Clip, *, frames: int = 10) -> None:
    for k in range(frames):
        clip.label("front", k, _box(k, y=50), world=7)
        clip.label("front", k, _box(k, y=200), world=9)


# --------------------------------------------------------------------------- tracking


def test_a_perfect_tracker_scores_one_everywhere() -> None:
    clip = Clip()
    _two_objects(clip)
    for k in range(10):
        clip.detect("front", k, _box(k, y=50), track=1, gid=101)
        clip.detect("front", k, _box(k, y=200), track=2, gid=102)
    s = clip.score()
    m = s.per_camera["front"]
    assert (m.hota, m.deta, m.assa, m.mota, m.idf1) == pytest.approx((1, 1, 1, 1, 1))
    assert m.id_switches == 0 and m.gt_dets == 20 and m.gt_ids == 2 and m.pred_ids == 2
    assert s.rig is not None and s.rig.hota == pytest.approx(1) and s.rig.idf1 == pytest.approx(1)
    assert s.cameras.idf1 == pytest.approx(1)


def test_one_id_switch_costs_idf1_what_the_hand_count_says() -> None:
    # object 9 is track 2 for frames 0-4, track 3 for 5-9. Identity: 9 <-> 2 (5 IDTP), the
    # other 5 boxes are IDFN (of 9) and IDFP (of 3); 7 <-> 1 is perfect (10 IDTP).
    # IDF1 = 2 IDTP / (2 IDTP + IDFN + IDFP) = 30 / (30 + 5 + 5) = 0.75;
    # MOTA = 1 - (FN + FP + IDSW) / GT = 1 - 1 / 20 = 0.95
    clip = Clip()
    _two_objects(clip)
    for k in range(10):
        clip.detect("front", k, _box(k, y=50), track=1)
        clip.detect("front", k, _box(k, y=200), track=2 if k < 5 else 3)
    m = clip.score().per_camera["front"]
    assert m.idf1 == pytest.approx(0.75)
    assert m.id_switches == 1
    assert m.mota == pytest.approx(0.95)
    assert m.deta == pytest.approx(1) and m.assa < 1 and m.hota < 1


def test_a_missed_object_costs_mota_its_misses() -> None:
    # object 9 missed in 4 of its 10 frames: MOTA = 1 - 4 / 20 = 0.8;
    # IDF1 = 2 * 16 / (2 * 16 + 4 + 0)
    clip = Clip()
    _two_objects(clip)
    for k in range(10):
        clip.detect("front", k, _box(k, y=50), track=1)
        if k < 6:
            clip.detect("front", k, _box(k, y=200), track=2)
    m = clip.score().per_camera["front"]
    assert m.mota == pytest.approx(0.8)
    assert m.idf1 == pytest.approx(32 / 36)
    assert m.id_switches == 0 and m.pred_dets == 16


def test_tracks_on_ignore_regions_are_neither_hits_nor_false_positives() -> None:
    # object 5 is too hidden to be a target (visibility 0.1 < 0.3): a track on it, and a
    # small track inside it (IoU < 0.5, but wholly inside), cost nothing
    clip = Clip()
    _two_objects(clip)
    for k in range(10):
        clip.label("front", k, (300, 100, 400, 200), world=5, vis=0.1)
        clip.detect("front", k, _box(k, y=50), track=1)
        clip.detect("front", k, _box(k, y=200), track=2)
        clip.detect("front", k, (300, 100, 400, 200), track=3)
        clip.detect("front", k, (310, 110, 350, 150), track=4)
    m = clip.score().per_camera["front"]
    assert m.mota == pytest.approx(1) and m.idf1 == pytest.approx(1)
    assert m.pred_dets == 20 and m.gt_dets == 20


def test_kept_predictions_follow_trackeval_preprocessing() -> None:
    targets = np.array([[0, 0, 10, 10]], float)
    ignored = np.array([[100, 100, 200, 200]], float)
    preds = np.array([[0, 0, 10, 10], [100, 100, 200, 200], [110, 110, 150, 150], [50, 50, 60, 60]])
    assert kept_predictions(targets, ignored, preds).tolist() == [True, False, False, True]
    assert box_iou(preds[:1], targets)[0, 0] == pytest.approx(1)
    assert box_ioa(preds[2:3], ignored)[0, 0] == pytest.approx(1)


def test_the_rig_scores_global_ids_across_cameras() -> None:
    # one world object seen by both cameras for 10 frames: each camera's tracks are perfect;
    # one global id for both -> rig IDF1 1; a global id per camera -> 10 IDTP of 20: 0.5
    for gids, rig_idf1 in (((5, 5), 1.0), ((5, 6), 0.5)):
        clip = Clip(cameras=("front", "front_left"))
        for k in range(10):
            for cam, gid in zip(("front", "front_left"), gids, strict=True):
                clip.label(cam, k, _box(k), world=3)
                clip.detect(cam, k, _box(k), track=1, gid=gid)
        s = clip.score()
        assert all(m.idf1 == pytest.approx(1) for m in s.per_camera.values())
        assert s.rig is not None and s.rig.idf1 == pytest.approx(rig_idf1)
        assert s.rig.mota is None and s.rig.gt_dets == 20
        assert s.same_id.pairs == 10 and s.same_id.share == (1.0 if rig_idf1 == 1.0 else 0.0)


def test_same_id_share_of_a_two_camera_case() -> None:
    # three objects seen by both cameras at frame 0: global ids agree for two of them
    clip = Clip(cameras=("front", "front_left"), frames=1)
    for world, (ga, gb) in zip((1, 2, 3), ((10, 10), (11, 11), (12, 13)), strict=True):
        box = _box(0, y=20 + 100 * world)
        clip.label("front", 0, box, world=world)
        clip.label("front_left", 0, box, world=world)
        clip.detect("front", 0, box, track=world, gid=ga)
        clip.detect("front_left", 0, box, track=world, gid=gb)
    s = clip.score().same_id
    assert (s.pairs, s.same) == (3, 2) and s.share == pytest.approx(2 / 3)


def test_same_id_share_counts_every_pair_and_skips_boxes_without_global_ids() -> None:
    s = same_id_share({(0, 1): [4, 4, 5], (0, 2): [6, -1], (1, 1): [4]})
    assert (s.pairs, s.same) == (3, 1)  # (4,4) (4,5) (4,5); 6 has no partner with an id
    assert same_id_share({}).share == -1


def test_ego_error_bins() -> None:
    bins = range_errors([(5, 5.5), (8, 7), (12, 13), (20, 20.2), (25, 24), (40, 44)])
    near, mid, far = bins
    assert near.count == 2 and near.median_m == pytest.approx(0.75)
    assert mid.count == 3 and mid.median_m == pytest.approx(1.0)
    assert mid.p90_m == pytest.approx(1.0)  # |errors| 1, 0.2, 1: the 90th percentile
    assert far.count == 1 and (far.median_m, far.p90_m) == pytest.approx((4, 4))
    assert (near.bias_m, mid.bias_m, far.bias_m) == pytest.approx((-0.25, 0.2, 4.0))
    assert range_errors([])[0].median_m == -1


def test_object_range_from_the_camera_mount_else_its_own() -> None:
    obj = {"x_m": 21.5, "y_m": 3.0, "range_m": 99.0}
    assert object_range_m(obj, (1.5, 3.0)) == pytest.approx(20.0)
    assert object_range_m(obj, None) == pytest.approx(99.0)
    assert object_range_m({"x_m": 1.0, "y_m": 1.0}, None) is None


def test_ego_error_through_the_objects_of_the_run() -> None:
    clip = Clip(frames=2)
    clip.label("front", 0, _box(0), world=1, distance_m=20.5)
    clip.label("front", 1, _box(1), world=1, distance_m=5.0)
    clip.detect("front", 0, _box(0), track=4, gid=8)
    clip.detect("front", 1, _box(1), track=4, gid=8)
    objects = [
        {
            "frame_index": k,
            "objects": [
                {"id": 8, "x_m": x, "y_m": 0.0, "boxes": [{"camera": "front", "track_id": 4}]}
            ],
        }
        for k, x in ((0, 21.5), (1, 7.5))
    ]
    s = clip.score(objects=objects, mounts={"front": (1.5, 0.0)})
    near, mid, _ = s.ego_error
    assert near.count == 1 and near.median_m == pytest.approx(1.0)
    assert mid.count == 1 and mid.median_m == pytest.approx(0.5)
    assert s.sightings_placed == 2


def test_a_camera_that_tracked_nothing_scores_zero_and_the_rest_still_count() -> None:
    clip = Clip(cameras=("front", "back"), frames=4)
    for k in range(4):
        clip.label("front", k, _box(k), world=1)
        clip.label("back", k, _box(k), world=2)
        clip.detect("front", k, _box(k), track=1)
    s = clip.score()
    assert (s.per_camera["back"].hota, s.per_camera["back"].mota) == (0, 0)
    assert s.per_camera["front"].mota == pytest.approx(1)
    assert s.cameras.mota == pytest.approx(0.5) and s.cameras.gt_dets == 8
    assert s.rig is None  # no global ids: no rig line
    assert s.same_id.share == -1 and "cam back" in s.table()


def test_detections_without_track_ids_are_a_clear_error() -> None:
    clip = Clip(frames=1)
    clip.label("front", 0, _box(0), world=1)
    clip.detect("front", 0, _box(0), track=1)
    for r in clip.lines():
        r.pop("track_ids")
    with pytest.raises(ConfigError, match="no track ids"):
        clip.score()


def test_labels_without_track_ids_are_a_clear_error() -> None:
    clip = Clip(frames=1)
    clip.label("front", 0, _box(0), world=1)
    clip.gt["annotations"][0].pop("track_id")
    with pytest.raises(ConfigError, match="labels with track ids"):
        clip.score()


# --------------------------------------------------------------------------- streaming


def _moving(frames: int = 20, dx: float = 20.0) -> Clip:
    """One car moving dx px a frame (200 px/s); each frame's output emitted half a frame
    after its capture: at any capture the newest output is the previous frame's."""
    clip = Clip(frames=frames)
    for k in range(frames):
        clip.label("front", k, _box(k, dx=dx), world=1)
        clip.detect("front", k, _box(k, dx=dx), track=1, velocity=(dx * 10, 0, dx * 10, 0))
    return clip


def test_a_one_frame_lag_costs_streaming_ap_and_forecasting_restores_it() -> None:
    clip = _moving()
    s = score_streaming(clip.gt, clip.lines(), forecast=True)
    assert s.offline.map_50 == pytest.approx(1.0)
    # a box 20 px behind its 40 px object: IoU 20 / 60 < 0.5, every frame a miss
    assert s.streaming.map_50 < 0.05
    # moved on by 200 px/s over 100 ms: where the object is; frame 0 had no output yet
    assert s.forecast is not None and s.forecast.map_50 == pytest.approx(0.95, abs=0.02)
    assert (s.lag_frames, s.lag_ms) == pytest.approx((1.0, 100.0))
    assert (s.frames, s.processed, s.without_output) == (20, 20, 1)
    assert "streaming+forecast" in s.table()


def test_an_output_emitted_after_the_next_capture_is_not_used_for_it() -> None:
    clip = _moving(frames=4)
    clip.records[("front", 0)]["timestamps"]["emitted_ns"] = int(1.5 * T_NS)
    clip.records[("front", 1)]["timestamps"]["emitted_ns"] = int(2.5 * T_NS)
    capture = {k: k * T_NS for k in range(4)}
    used = newest_outputs(capture, clip.lines())
    assert used[0] is None and used[1] is None  # frame 0's output came after frame 1
    assert used[2] is not None and used[2]["frame_index"] == 0
    # frames 1 and 2 were both out by frame 3's capture (at 2.5 frames): the newer one
    assert used[3] is not None and used[3]["frame_index"] == 2
    frames, lags = streaming_frames(clip.gt, clip.lines(), forecast=False)
    assert [f["boxes"] == [] for f in frames] == [True, True, False, False]
    assert lags == [(2, 200.0), (1, 100.0)]


def test_dropped_frames_take_their_capture_time_from_the_labels() -> None:
    stamps = [(k, k * 0.1) for k in range(5)]
    emitted = {0: 1_000, 2: 1_000 + 2 * T_NS, 4: 1_000 + 4 * T_NS + 7}
    got = capture_times_ns(stamps, emitted)
    assert got[1] == 1_000 + T_NS and got[3] == 1_000 + 3 * T_NS and got[4] == emitted[4]
    # without timestamps: the frame period the emitted frames show
    got = capture_times_ns([(k, None) for k in range(5)], {0: 0, 2: 2 * T_NS, 4: 4 * T_NS})
    assert got[1] == T_NS and got[3] == 3 * T_NS


def test_a_frame_the_live_policy_dropped_is_answered_by_an_older_output() -> None:
    clip = _moving(frames=6)
    del clip.records[("front", 3)]
    s = score_streaming(clip.gt, clip.lines(), forecast=False)
    assert (s.frames, s.processed) == (6, 5)
    _, lags = streaming_frames(clip.gt, clip.lines(), forecast=False)
    assert lags[2:4] == [(1, 100.0), (2, 200.0)]  # frames 3 and 4 both answered by frame 2


def test_forecast_moves_boxes_and_clips_them_to_the_image() -> None:
    boxes, kept = forecast_boxes(
        [[0, 0, 10, 10], [600, 0, 630, 10], [5, 5, 6, 6]],
        [[10, 0, 10, 0], [200, 0, 200, 0], None],
        0.5,
        (640, 360),
    )
    assert boxes[0] == [5, 0, 15, 10] and kept == [0, 2]  # the second left the image
    assert boxes[1] == [5, 5, 6, 6]


# --------------------------------------------------------------------------- end to end


def _evaluate(tmp_path: Path, name: str, **kwargs: Any) -> Any:
    from drivepercept.run import evaluate_clip

    settings = {"max_frames": 12, "out": str(tmp_path), "name": name, "sample_hz": 0.0}
    return evaluate_clip(SAMPLE, settings=settings, **kwargs)


def test_eval_track_on_the_sample_clip(tmp_path: Path) -> None:
    result = _evaluate(tmp_path, "track", track=True)
    s = result.tracking
    assert s is not None and set(s.per_camera) == {
        "front",
        "front_left",
        "front_right",
        "back",
        "back_left",
        "back_right",
    }
    assert s.cameras.gt_dets > 0 and 0 <= s.cameras.hota <= 1
    text = result.table()
    assert "HOTA" in text and "same global id" in text and "ego-position error" in text
    saved = json.loads(result.eval_json.read_text())
    assert saved["tracking"]["cameras"]["gt_dets"] == s.cameras.gt_dets


def test_eval_forecast_on_the_sample_clip(tmp_path: Path) -> None:
    result = _evaluate(tmp_path, "stream", forecast=True)
    s = result.streaming
    assert s is not None and s.forecast is not None
    assert s.frames == 6 * 12 and 0 < s.processed <= s.frames
    assert s.lag_frames >= 0 and result.report is s.offline
    assert "streaming" in result.table()


def test_eval_track_command_prints_the_tracking_table(tmp_path: Path) -> None:
    args = ["--track", "--max-frames", "4", "--out", str(tmp_path), "--name", "cli"]
    proc = subprocess.run(
        [sys.executable, "-m", "drivepercept", "eval", str(SAMPLE), *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "HOTA" in proc.stdout and "rig (global ids)" in proc.stdout
    saved = json.loads((tmp_path / "cli" / "eval.json").read_text())
    assert saved["schema_version"] == 3 and "tracking" in saved and "streaming" not in saved


def test_track_on_labels_without_track_ids_fails_before_the_run(tmp_path: Path) -> None:
    from drivepercept.run import evaluate_clip

    clip = tmp_path / "clip"
    shutil.copytree(SAMPLE, clip)
    gt = json.loads((clip / "ground_truth.json").read_text())
    for a in gt["annotations"]:
        a.pop("track_id")
    (clip / "ground_truth.json").write_text(json.dumps(gt))
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match="needs labels with track ids"):
        evaluate_clip(clip, settings={"out": str(out)}, track=True)
    assert not out.exists()  # nothing run


def test_eval_streaming_command_prints_offline_and_streaming_ap(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    # given the sample clip, scored as it streams in real time, with and without forecasting
    for flags in (["--streaming"], ["--streaming", "--forecast"]):
        name = "-".join(f.strip("-") for f in flags)
        args = ["eval", str(SAMPLE), *flags, "--max-frames", "6", "--out", str(tmp_path)]
        code, err = in_process([*args, "--name", name, "--no-progress"])
        # then it succeeds and records the streaming score beside the offline one
        assert code == 0, err
        saved = json.loads((tmp_path / name / "eval.json").read_text())
        streaming = saved["streaming"]
        assert streaming["frames"] == 6 * 6 and 0 < streaming["processed"] <= 36
        for kind in ("offline", "streaming"):
            assert 0.0 <= streaming[kind]["map_50_95"] <= streaming[kind]["map_50"] <= 1.0
        # a real-time run lags: some frames had no output yet when they were captured (on a
        # busy host none of the 0.4 s of frames may have one: then there is no lag to take)
        assert streaming["without_output"] > 0
        assert streaming["lag_ms"] > 0 or streaming["without_output"] == streaming["frames"]
        assert ("forecast" in streaming and streaming["forecast"] is not None) == (
            "--forecast" in flags
        )
