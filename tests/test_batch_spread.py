"""Rig ids that do not depend on the batching (issue 44): the same detections tracked with
batches whose cameras are 0, 3 and 7 frames apart give the same global ids, because a
replay's rig steps are formed by frame time, not by batch; live's (a batch is a step) is
shown beside it."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from labelboxes import detections_from_labels

from drivepercept.eval.tracking import score_tracking
from drivepercept.run.retrack import retrack

Cli = Callable[[list[str]], tuple[int, str]]


def _crossing(
    in_process: Cli, drive: Path, *, seconds: int
) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """A simulated crossing drive (seed 31), its labels and detections made from them."""
    code, err = in_process(
        ["simulate", "--out", str(drive), "--preset", "crossing", "--seed", "31",
         "--seconds", str(seconds)]
    )  # fmt: skip
    assert code == 0, err
    gt = json.loads((drive / "ground_truth.json").read_text())
    return drive, gt, detections_from_labels(gt, seed=5)


@pytest.mark.timeout(240)
def test_the_same_detections_get_the_same_rig_ids_whatever_the_batch_spread(
    in_process: Cli, tmp_path: Path
) -> None:
    drive, gt, lines = _crossing(in_process, tmp_path / "drive", seconds=5)
    shares = {}
    for spread in (0, 3, 7):
        for hold_s, mode in ((2.0, "replay"), (0.0, "live")):
            run = retrack(drive / "rig.toml", lines, spread_frames=spread, hold_s=hold_s)
            scores = score_tracking(gt, run.detections, run.objects)
            shares[(mode, spread)] = scores.same_id
    print({k: round(v.share, 4) for k, v in shares.items()})
    replay = [shares[("replay", s)] for s in (0, 3, 7)]
    assert all(s.pairs > 100 for s in replay)  # many two-camera sightings to agree on
    assert max(s.share for s in replay) - min(s.share for s in replay) <= 0.01
    # with aligned batches (spread 0) a live rig's steps are the replay's
    assert shares[("live", 0)].share == shares[("replay", 0)].share


@pytest.mark.timeout(240)
def test_with_looks_the_rig_ids_hold_whatever_the_batch_spread(
    in_process: Cli, tmp_path: Path
) -> None:
    """As above with each frame's pixels (`RecordedFrames`): the tracker and the fusion
    also use the boxes' looks, and the spread still moves nothing."""
    from drivepercept.rig import load_rig
    from drivepercept.run.recorded_frames import RecordedFrames

    drive, gt, lines = _crossing(in_process, tmp_path / "drive", seconds=5)
    cameras = load_rig(drive / "rig.toml").cameras
    shares, ids = {}, {}
    for spread in (0, 3, 7):
        with RecordedFrames(cameras) as frames:
            run = retrack(drive / "rig.toml", lines, spread_frames=spread, frames=frames)
        assert run.with_pixels == len(lines)  # every frame's looks read
        shares[spread] = score_tracking(gt, run.detections, run.objects).same_id
        ids[spread] = [line["track_ids"] for line in run.detections]
    print({k: round(v.share, 4) for k, v in shares.items()})
    assert all(s.pairs > 100 for s in shares.values())
    assert max(s.share for s in shares.values()) - min(s.share for s in shares.values()) <= 0.01
    assert ids[0] == ids[3] == ids[7]  # each camera's tracks do not depend on the batching
    motion = retrack(drive / "rig.toml", lines)  # the looks were used: other ids somewhere
    assert [line["track_ids"] for line in motion.detections] != ids[0]


def test_a_stalled_camera_holds_back_at_most_max_held_frames(tmp_path: Path) -> None:
    """Five cameras deliver, the sixth stalls after its first frame: the frames waiting for
    their rig step stay bounded (each may carry its original image), and none is lost."""
    from drivepercept.rig import load_rig
    from drivepercept.tracking.stage import MAX_HELD_FRAMES, REPLAY_HOLD_S, RigTracker
    from drivepercept.types import Detections, FrameMeta, FrameResult, FrameTiming, Letterbox

    sample = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
    cameras = load_rig(sample).cameras
    tracker = RigTracker(cameras, hold_s=REPLAY_HOLD_S)
    assert tracker.fusion.placing
    box = Letterbox((640, 360), (640, 360), 1.0, 1.0, 0.0, 0.0)
    timing = FrameTiming(*([0] * 11))
    boxes = Detections(
        np.array([[300.0, 150.0, 340.0, 230.0]], np.float32),
        np.array([0.9], np.float32),
        np.array([3], np.int64),
        ("car", "truck", "bus", "pedestrian"),
    )
    out = 0
    for k in range(300):
        batch = [
            FrameResult(FrameMeta(c.name, i, k, k / 15, 0, 0, 0, box), k, 6, boxes, timing)
            for i, c in enumerate(cameras)
            if i < 5 or k == 0  # the sixth camera stalls after frame 0
        ]
        out += len(tracker(batch))
        assert len(tracker._held) <= MAX_HELD_FRAMES
    out += len(tracker.flush())
    assert out == 5 * 300 + 1  # every frame came out once


def test_retrack_refuses_a_placed_camera_without_its_image_size() -> None:
    """Detection lines do not carry the image size: a camera with geometry but no width and
    height would have every box counted as cut by the image's side, so it is refused."""
    import dataclasses

    from drivepercept.errors import ConfigError
    from drivepercept.rig import load_rig

    sample = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
    cameras = list(load_rig(sample).cameras)
    assert cameras[1].intrinsics is not None and cameras[1].size is not None
    cameras[1] = dataclasses.replace(cameras[1], width=None, height=None)
    with pytest.raises(ConfigError, match=f"camera '{cameras[1].name}' has geometry but no"):
        retrack(cameras, [], spread_frames=0)


def test_retrack_with_a_detection_interval_predicts_the_frames_between(
    in_process: Cli, tmp_path: Path
) -> None:
    """detect_every=3: each camera keeps the boxes of its first frame and of every third
    one after (the cameras staggered); the tracker answers the others, flagged."""
    from drivepercept.errors import ConfigError

    drive, gt, lines = _crossing(in_process, tmp_path / "drive", seconds=3)
    run = retrack(drive / "rig.toml", lines, detect_every=3)
    by_camera: dict[str, list[dict[str, Any]]] = {}
    for line in run.detections:
        by_camera.setdefault(line["camera"], []).append(line)
    staggers = set()
    for camera_lines in by_camera.values():
        camera_lines.sort(key=lambda ln: ln["frame_index"])
        kept = [j for j, ln in enumerate(camera_lines) if not ln.get("predicted")]
        assert kept[0] == 0 and all(b - a <= 3 for a, b in itertools.pairwise(kept))
        assert len(kept) <= len(camera_lines) // 3 + 2
        staggers.add(kept[1] if len(kept) > 1 else None)
        # a kept frame has the boxes it came with; a predicted one the tracker's, with ids
        original = {
            ln["frame_index"]: ln for ln in lines if ln["camera"] == camera_lines[0]["camera"]
        }
        for j, ln in enumerate(camera_lines):
            if j in kept:
                assert ln["boxes"] == original[ln["frame_index"]]["boxes"]
            else:
                assert len(ln["boxes"]) == len(ln["scores"]) == len(ln["track_ids"])
                assert all(t > 0 for t in ln["track_ids"])
    assert len(staggers) > 1  # the cameras do not all detect the same frames
    predicted = [ln for ln in run.detections if ln.get("predicted")]
    assert sum(len(ln["boxes"]) for ln in predicted) > 100  # the tracker answered them
    # and the scorer reads them as any other line
    assert score_tracking(gt, run.detections, run.objects).cameras.hota > 0.2
    # and an interval below 1 is refused
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="detect_every must be an integer >= 1"):
            retrack(drive / "rig.toml", lines, detect_every=bad)  # type: ignore[arg-type]
