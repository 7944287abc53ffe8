"""A detection interval (`--detect-every N`, issue 45 part 1): the model sees each camera's
first frame and every N-th one after it, the cameras staggered; the tracking stage answers
the others with its tracks moved on to their time, and every frame gets its line."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from drivepercept.alignment import DETECT_AFTER_GAP_NS
from drivepercept.batching import Batcher
from drivepercept.buffers import StagingRing
from drivepercept.config import PipelineConfig
from drivepercept.errors import ConfigError
from drivepercept.queues import CameraQueues
from drivepercept.types import Batch, DropPolicy, Frame, FrameMeta, Letterbox

Cli = Callable[[list[str]], tuple[int, str]]
SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"

pytestmark = pytest.mark.timeout(240)


def _frame(camera: int, index: int, pts_s: float) -> Frame:
    box = Letterbox((8, 8), (8, 8), 1.0, 1.0, 0.0, 0.0)
    now = time.monotonic_ns()
    meta = FrameMeta(f"c{camera}", camera, index, pts_s, now, now, now, box)
    return Frame(meta, np.full((8, 8, 3), 10 * camera + index, np.uint8))


def _batches(frames: list[Frame], *, cameras: int, every: int) -> list[Batch]:
    """The batches a replay's batcher makes of `frames` with a detection interval."""
    stop = threading.Event()
    qs = CameraQueues([f"c{i}" for i in range(cameras)], capacity=64, policy=DropPolicy.BLOCK)
    ring = StagingRing(slots=4, max_batch=cameras, height=8, width=8, pin_memory=False)
    out: queue.Queue[Batch | None] = queue.Queue(maxsize=4)
    batcher = Batcher(
        queues=qs, ring=ring, out=out, timeout_ms=5, stop=stop, align=True, detect_every=every
    )
    for frame in frames:
        qs.put(frame.meta.camera_index, frame, stop=stop)
    for cam in range(cameras):
        qs.end(cam)
    batcher.start()
    batches = []
    while (item := out.get(timeout=10)) is not None:
        rows = ring.arrays[item.slot]
        for row, meta in enumerate(item.frames):  # every frame's pixels, predicted or not
            assert rows[row, 0, 0, 0] == 10 * meta.camera_index + meta.frame_index
        batches.append(item)
        ring.release(item.slot)
    batcher.thread.join(timeout=2)
    return batches


def test_each_camera_is_detected_first_then_every_nth_frame_staggered() -> None:
    # given 3 cameras of 10 frames at 15 fps and an interval of 3
    frames = [_frame(c, k, k / 15) for k in range(10) for c in range(3)]
    # when the batcher makes batches
    batches = _batches(frames, cameras=3, every=3)
    # then every frame is in a batch once, the detected ones first in each batch
    detected: dict[int, list[int]] = defaultdict(list)
    seen = []
    for batch in batches:
        seen += [(m.camera_index, m.frame_index) for m in batch.frames]
        for meta in batch.frames[: batch.detected]:
            detected[meta.camera_index].append(meta.frame_index)
    assert sorted(seen) == sorted((c, k) for c in range(3) for k in range(10))
    # and camera c's detected frames are 0, then those k with (k + c) % 3 == 0
    for c in range(3):
        assert detected[c] == [k for k in range(10) if k == 0 or (k + c) % 3 == 0], c
    # and after the first, no batch is all detected or all predicted (the stagger)
    assert all(0 < b.detected < b.size for b in batches[1:])


def test_a_camera_back_after_a_gap_is_detected_first() -> None:
    # given one camera whose frames stop for 1.5 s after frame 4 (a reconnect, a stall)
    gap_s = 1.5
    assert gap_s * 1e9 > DETECT_AFTER_GAP_NS
    times = [k / 15 for k in range(5)] + [4 / 15 + gap_s + k / 15 for k in range(5)]
    frames = [_frame(0, k, t) for k, t in enumerate(times)]
    # when batched with an interval of 4
    batches = _batches(frames, cameras=1, every=4)
    # then frame 5, the first after the gap, is detected (its tracks are stale), as are 0 and 4
    detected = [b.frames[0].frame_index for b in batches if b.detected]
    assert detected == [0, 4, 5, 8]


def test_detect_every_must_be_a_whole_number_from_1_to_100() -> None:
    assert PipelineConfig(detect_every=100).detect_every == 100
    for bad in (0, -2, 101):
        with pytest.raises(ConfigError, match=r"detect_every must be 1\.\.100"):
            PipelineConfig(detect_every=bad)
    with pytest.raises(ConfigError, match="detect_every"):
        PipelineConfig(detect_every=2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--detect-every", "0"], "detect_every must be 1..100"),
        (["--detect-every", "-3"], "detect_every must be 1..100"),
        (["--detect-every", "two"], "invalid int value: 'two'"),
    ],
)
def test_a_bad_interval_is_one_line_and_exit_2(
    in_process: Cli, tmp_path: Path, args: list[str], says: str
) -> None:
    code, err = in_process(
        ["replay", str(SAMPLE / "rig.toml"), *args, "--out", str(tmp_path), "--no-progress"]
    )
    assert code == 2, err
    assert says in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())  # refused before any run folder


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_replay_answers_every_frame_detected_or_predicted(in_process: Cli, tmp_path: Path) -> None:
    # given the sample rig (6 cameras), 30 frames each, the model on every 3rd
    code, err = in_process(
        ["replay", str(SAMPLE / "rig.toml"), "--model", "drivepercept-tiny", "--max-frames",
         "30", "--detect-every", "3", "--out", str(tmp_path), "--name", "e3", "--no-progress",
         "--report", "json"]
    )  # fmt: skip
    assert code == 0, err
    # then tracking came on by itself, said in one line
    assert err.count("detect every 3 frames: tracking is on") == 1
    lines = _lines(tmp_path / "e3" / "detections.jsonl")
    # and every frame of every camera has its line, once
    keys = [(ln["camera"], ln["frame_index"]) for ln in lines]
    assert len(keys) == len(set(keys)) == 6 * 30
    by_camera: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_camera[line["camera"]].append(line)
    for camera, camera_lines in by_camera.items():
        camera_lines.sort(key=lambda ln: ln["frame_index"])
        predicted = [ln.get("predicted", False) for ln in camera_lines]
        # the first frame detected, then about one in three
        assert predicted[0] is False, camera
        assert 9 <= predicted.count(False) <= 11, (camera, predicted)
        # a predicted frame's boxes come from its camera's tracks: each has a track id
        for ln in camera_lines:
            if ln.get("predicted"):
                assert all(t > 0 for t in ln["track_ids"]), ln
                assert len(ln["boxes"]) == len(ln["scores"]) == len(ln["global_ids"])
    assert sum(len(ln["boxes"]) for ln in lines if ln.get("predicted")) > 100
    # and run.json counts each camera's predicted frames
    cameras = json.loads((tmp_path / "e3" / "run.json").read_text())["summary"]["cameras"]
    for camera, camera_lines in by_camera.items():
        predicted_count = sum(1 for ln in camera_lines if ln.get("predicted"))
        assert cameras[camera]["frames_predicted"] == predicted_count
        assert cameras[camera]["frames"] == 30


def test_a_bench_refuses_a_detection_interval(in_process: Cli, tmp_path: Path) -> None:
    # a bench measures the model on every frame: an interval would measure something else
    code, err = in_process(
        ["bench", str(SAMPLE / "rig.toml"), "--mode", "pipeline", "--detect-every", "2"]
    )
    assert code == 2, err
    assert "--detect-every is for replay, live and eval" in err and "Traceback" not in err


def _rig_with(tmp_path: Path, front: str) -> Path:
    """The sample rig with `front` added to its front camera's table."""
    rig = (SAMPLE / "rig.toml").read_text()
    assert 'name = "front"\n' in rig
    rig = rig.replace('name = "front"\n', f'name = "front"\n{front}\n', 1)
    rig = rig.replace('video = "', f'video = "{SAMPLE}/')
    (tmp_path / "rig.toml").write_text(rig)
    return tmp_path / "rig.toml"


def test_a_rig_file_gives_one_camera_its_own_interval(in_process: Cli, tmp_path: Path) -> None:
    # given the sample rig whose front camera says detect_every = 2, the others nothing
    rig = _rig_with(tmp_path, "detect_every = 2")
    code, err = in_process(
        ["replay", str(rig), "--model", "drivepercept-tiny", "--max-frames", "20", "--out",
         str(tmp_path), "--name", "own", "--no-progress", "--no-report"]
    )  # fmt: skip
    assert code == 0, err
    assert err.count("detect every 2/1 frames: tracking is on") == 1
    # then the front camera's odd frames are predicted, and no other camera's frame is
    cameras = json.loads((tmp_path / "own" / "run.json").read_text())["summary"]["cameras"]
    assert cameras["front"]["frames_predicted"] == 10  # frames 1, 3, ..., 19 (front is c0)
    assert all(c["frames_predicted"] == 0 for n, c in cameras.items() if n != "front")
    assert all(c["frames"] == 20 for c in cameras.values())


def test_a_rig_file_interval_out_of_range_is_one_line_and_exit_2(
    in_process: Cli, tmp_path: Path
) -> None:
    rig = _rig_with(tmp_path, "detect_every = 0")
    code, err = in_process(["replay", str(rig), "--out", str(tmp_path / "o"), "--no-progress"])
    assert code == 2, err
    assert "camera 'front': detect_every must be 1..100" in err and "Traceback" not in err
