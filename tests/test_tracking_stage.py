"""`--track` end to end (issue 29): per-camera track ids, velocities and the rig's global ids
in detections.jsonl, one objects.jsonl line per rig step, the tracking section of run.json and
the report; a rig without geometry tracks per camera only, with one line saying so."""

from __future__ import annotations

import json
import runpy
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from drivepercept.rig import CameraConfig
from drivepercept.tracking.appearance import LooksRequest, read_looks
from drivepercept.tracking.stage import RigTracker
from drivepercept.types import (
    DRIVING_CLASSES,
    Detections,
    FrameMeta,
    FrameResult,
    FrameTiming,
    Letterbox,
)

SAMPLE = Path(__file__).resolve().parents[1] / "sample_videos"
Cli = Callable[[list[str]], tuple[int, str]]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.timeout(180)
def test_track_adds_identities_and_the_rigs_objects(in_process: Cli, tmp_path: Path) -> None:
    # given the sample rig (its rig.toml has every camera's intrinsics and mount)
    code, err = in_process(
        ["replay", str(SAMPLE / "rig.toml"), "--max-frames", "20", "--track", "--out",
         str(tmp_path), "--name", "t", "--no-progress", "--report", "html,json"]
    )  # fmt: skip
    assert code == 0, err
    run = tmp_path / "t"
    frames = _lines(run / "detections.jsonl")
    # then every frame's boxes carry a track id, a velocity and a global id each
    for f in frames:
        n = len(f["boxes"])  # type: ignore[arg-type]
        assert len(f["track_ids"]) == n and len(f["global_ids"]) == n  # type: ignore[arg-type]
        assert len(f["velocities"]) == n  # type: ignore[arg-type]
    ids = [(f["camera"], t) for f in frames for t in f["track_ids"] if t >= 0]  # type: ignore[attr-defined]
    assert len(ids) > 50 and len(set(ids)) < len(ids) / 3  # ids held over frames
    # and a global id is the same object in every camera: a box with one has its track's
    placed = {
        (f["camera"], t): g
        for f in frames
        for t, g in zip(f["track_ids"], f["global_ids"], strict=True)  # type: ignore[call-overload]
        if g >= 0
    }
    assert placed and all(t >= 0 for _, t in placed)
    # and objects.jsonl has a line per rig step whose objects list the boxes behind them
    steps = _lines(run / "objects.jsonl")
    # one per instant (a replay's rig steps are formed by frame time; its batches too)
    assert (
        len(steps) == len({f["pts_s"] for f in frames}) == len({f["batch_index"] for f in frames})
    )
    objects = [o for s in steps for o in s["objects"]]  # type: ignore[attr-defined]
    assert objects and all(o["boxes"] and -100 < o["x_m"] < 100 for o in objects)
    assert {o["id"] for o in objects} == set(placed.values())
    multi = [o for o in objects if len({b["camera"] for b in o["boxes"]}) > 1]
    assert multi, "no object was seen by two cameras at once in 20 frames of the sample rig"
    # and run.json and the report say how many tracks each camera had and how long they lived
    record = json.loads((run / "run.json").read_text())
    tracking = record["tracking"]
    assert tracking["placed"] is True and tracking["rig_objects"] == len({o["id"] for o in objects})
    assert sum(c["tracks"] for c in tracking["cameras"].values()) == len(set(ids))
    assert 0 < tracking["ms_per_frame"] < 1000  # the stage's own time, per camera frame
    assert 0 < tracking["cpu_ms_per_frame"] <= tracking["ms_per_frame"] * 1.05  # (CPU <= wall)
    assert all(c["unconfirmed_died"] >= 0 for c in tracking["cameras"].values())
    assert "died unconfirmed" in (run / "report.html").read_text()
    assert record["summary"]["source_spread_ms"]["max"] == 0.0  # batches in time order
    html = (run / "report.html").read_text()
    assert "<h2>Tracking</h2>" in html and "objects across the rig" in html
    assert "ms of its thread&#x27;s CPU)" in html  # (the report escapes the apostrophe)


@pytest.mark.timeout(180)
def test_a_rig_without_geometry_tracks_per_camera_only(in_process: Cli, tmp_path: Path) -> None:
    # given two videos, no rig file: no intrinsics, no mounts
    code, err = in_process(
        ["replay", str(SAMPLE / "front.mp4"), str(SAMPLE / "back.mp4"), "--model",
         "drivepercept-tiny", "--max-frames", "10", "--track", "--out", str(tmp_path),
         "--name", "bare", "--no-progress", "--no-report"]
    )  # fmt: skip
    # then the run succeeds, says once that it tracks per camera only, writes track ids but
    # no global ids and no objects file
    assert code == 0, err
    said = [line for line in err.splitlines() if "tracking per camera only" in line]
    assert len(said) == 1, err
    frames = _lines(tmp_path / "bare" / "detections.jsonl")
    assert all("track_ids" in f and "global_ids" not in f for f in frames)
    assert not (tmp_path / "bare" / "objects.jsonl").exists()
    assert json.loads((tmp_path / "bare" / "run.json").read_text())["tracking"]["placed"] is False


@pytest.mark.timeout(180)
def test_a_camera_pointing_at_the_sky_is_no_traceback(in_process: Cli, tmp_path: Path) -> None:
    # given the sample rig with its front camera pitched 80 degrees up
    text = (SAMPLE / "rig.toml").read_text()
    head, sep, rest = text.partition('name = "front"')
    rest = rest.replace("pitch_deg = ", "pitch_deg = -80.0 # was ", 1)
    rig = tmp_path / "rig.toml"
    rig.write_text(head + sep + rest)
    for video in SAMPLE.glob("*.mp4"):
        (tmp_path / video.name).symlink_to(video)
    code, err = in_process(
        ["replay", str(rig), "--max-frames", "30", "--track", "--out", str(tmp_path),
         "--name", "sky", "--no-progress", "--no-report"]
    )  # fmt: skip
    # then it runs; the front camera's tracks are written, with no global id
    assert code == 0 and "Traceback" not in err, err
    frames = _lines(tmp_path / "sky" / "detections.jsonl")
    front = [f for f in frames if f["camera"] == "front" and f["track_ids"]]
    assert front and all(g == -1 for f in front for g in f["global_ids"])  # type: ignore[attr-defined]
    assert any(t >= 0 for f in front for t in f["track_ids"])  # type: ignore[attr-defined]


def test_the_video_label_names_the_object_else_the_track() -> None:
    from drivepercept.sinks import draw_detections

    boxes = np.array([[10, 10, 60, 60], [80, 10, 130, 60], [10, 80, 60, 130]], np.float32)
    det = Detections(
        boxes,
        np.array([0.9, 0.8, 0.7], np.float32),
        np.zeros(3, np.int64),
        DRIVING_CLASSES,
        track_ids=np.array([5, 6, -1]),
        global_ids=np.array([3, -1, -1]),
    )
    from drivepercept.sinks.video_labels import label_texts

    assert label_texts(det) == ["#3 car 0.90", "c6 car 0.80", "car 0.70"]
    plain = Detections(boxes, det.scores, det.labels, DRIVING_CLASSES)
    image = np.zeros((160, 160, 3), np.uint8)
    # the labels drawn differ from an untracked frame's only by the identities
    assert label_texts(plain) == ["car 0.90", "car 0.80", "car 0.70"]
    assert not np.array_equal(draw_detections(image, det), draw_detections(image, plain))


@pytest.mark.timeout(180)
def test_track_in_the_config_file_is_the_flag(in_process: Cli, tmp_path: Path) -> None:
    # given `track = true` in a config file, and no --track
    config = tmp_path / "run.toml"
    config.write_text("track = true\n")
    code, err = in_process(
        ["replay", str(SAMPLE / "rig.toml"), "--config", str(config), "--max-frames", "4",
         "--out", str(tmp_path), "--name", "c", "--no-progress", "--report", "json"]
    )  # fmt: skip
    # then the run tracks: ids in detections.jsonl, an objects.jsonl, a tracking section
    assert code == 0, err
    frames = _lines(tmp_path / "c" / "detections.jsonl")
    assert frames and all("track_ids" in f for f in frames)
    assert (tmp_path / "c" / "objects.jsonl").exists()
    assert json.loads((tmp_path / "c" / "run.json").read_text())["tracking"] is not None


def test_the_stage_changes_only_the_tracking_fields() -> None:
    """`RigTracker` builds its results field by field (cheaper than `dataclasses.replace`):
    every other field of the frame and of its detections must come through as it was."""
    import dataclasses

    tracker = RigTracker([CameraConfig(name="front")])
    box = np.array([[10.0, 20.0, 60.0, 80.0]], np.float32)
    for k in range(3):
        det = Detections(box + 2 * k, np.array([0.9], np.float32), np.array([2]), DRIVING_CLASSES)
        lb = Letterbox((640, 360), (448, 256), 0.7, 0.7, 0, 4)
        meta = FrameMeta(
            "front", 0, k, k / 15, 100 + k, 200 + k, 300 + k, lb, stamp_ns=k * 66_000_000
        )
        timing = FrameTiming(*range(k, k + 11))
        (out,) = tracker([FrameResult(meta, 7 + k, 1, det, timing)])
        assert (out.meta, out.batch_index, out.batch_size, out.timing) == (meta, 7 + k, 1, timing)
        for field in dataclasses.fields(Detections):
            if field.name in ("track_ids", "velocities", "global_ids"):
                continue
            before, after = getattr(det, field.name), getattr(out.detections, field.name)
            assert (
                np.array_equal(before, after) if isinstance(before, np.ndarray) else before == after
            )
        assert out.detections.track_ids is not None and out.detections.velocities is not None
    ids = out.detections.track_ids
    assert ids is not None and ids.tolist() == [1]  # the same object, one track


_LB = Letterbox((640, 360), (640, 360), 1.0, 1.0, 0, 0)
_NOTHING = Detections.empty(DRIVING_CLASSES, predicted=True)  # a frame the model did not see


def _frame(camera: str, k: int, det: Detections) -> FrameResult:
    meta = FrameMeta(camera, 0, k, k / 10, 0, 0, 0, _LB)
    return FrameResult(meta, k, 2, det, FrameTiming(*range(11)))


def _seen(k: int) -> Detections:  # a car moving right at 100 px/s
    xyxy = np.array([[100.0 + 10 * k, 100.0, 160.0 + 10 * k, 150.0]], np.float32)
    return Detections(xyxy, np.array([0.9], np.float32), np.array([0]), DRIVING_CLASSES)


def test_a_frame_that_was_not_detected_gets_its_tracks_moved_on() -> None:
    """A predicted frame (a detection interval) is answered with the camera's tracks at its
    time, ids kept; a camera with no track yet gets an empty predicted frame."""

    tracker = RigTracker([CameraConfig(name="front"), CameraConfig(name="back")])
    for k in range(5):
        tracker([_frame("front", k, _seen(k))])
    # when front's frame 5 and back's first frame were not detected
    front, back = tracker([_frame("front", 5, _NOTHING), _frame("back", 5, _NOTHING)])
    # then front has its car 10 px further on, its id and score, flagged as predicted
    det = front.detections
    assert det.predicted and det.track_ids is not None and det.track_ids.tolist() == [1]
    assert np.abs(det.xyxy[0] - [150.0, 100.0, 210.0, 150.0]).max() < 3.0
    assert det.scores.tolist() == pytest.approx([0.9]) and det.names == ["car"]
    # and back, never detected, has nothing to show, still flagged
    assert back.detections.predicted and len(back.detections) == 0
    # and the next detected frame continues the track
    (after,) = tracker([_frame("front", 6, _seen(6))])
    ids = after.detections.track_ids
    assert ids is not None and ids.tolist() == [1] and not after.detections.predicted


def test_the_stage_keeps_a_pedestrians_id_while_the_detector_calls_it_a_cyclist() -> None:
    """The stage gives the tracker each box's kind from its class name (`same_kind`:
    pedestrian and cyclist are one): a sure cyclist box over a pedestrian's track goes on
    with its id; a car's box there does not."""

    def walker(k: int, label: int) -> Detections:  # moving right at 100 px/s
        xyxy = np.array([[100.0 + 10 * k, 100.0, 130.0 + 10 * k, 180.0]], np.float32)
        return Detections(xyxy, np.array([0.9], np.float32), np.array([label]), DRIVING_CLASSES)

    names = list(DRIVING_CLASSES)
    got = {}
    for then in ("cyclist", "car"):
        tracker = RigTracker([CameraConfig(name="front")])
        ids = []
        for k in range(8):
            label = names.index("pedestrian" if k < 4 else then)
            (out,) = tracker([_frame("front", k, walker(k, label))])
            assert out.detections.track_ids is not None
            ids += out.detections.track_ids.tolist()
        got[then] = ids
    assert got["cyclist"] == [1] * 8
    assert got["car"][:4] == [1] * 4 and 1 not in got["car"][4:]


def test_the_stage_tells_its_cpu_from_its_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cpu_ms_per_frame` is the CPU the calling thread spent in the stage, `ms_per_frame`
    its wall clock: time spent waiting in it (in a run, for a core or the GIL; here a
    sleep) is in the second only."""
    tracker = RigTracker([CameraConfig(name="front")])
    call = tracker._call

    def slow(results: list[FrameResult]) -> list[FrameResult]:
        time.sleep(0.03)
        return call(results)

    monkeypatch.setattr(tracker, "_call", slow)
    for k in range(4):
        tracker([_frame("front", k, _seen(k))])
    summary = tracker.summary()
    assert summary.frames == 4 and summary.ms_per_frame >= 30.0
    assert 0 < summary.cpu_ms_per_frame < 15.0  # a car in one camera: well under a ms


def test_a_frame_the_model_is_late_with_is_answered_from_tracks_once() -> None:
    """`overdue`: a frame whose boxes have not come by its deadline is answered now from its
    camera's tracks; its boxes, when they come, move the tracks on and are not answered
    again. A camera with nothing recent to predict from is left to the model."""
    tracker = RigTracker([CameraConfig(name="front"), CameraConfig(name="back")])
    for k in range(5):
        tracker([_frame("front", k, _seen(k))])
    # when front's frame 5 and back's frame 5 (back never detected) are late
    answered = tracker.overdue([_frame("front", 5, _NOTHING), _frame("back", 5, _NOTHING)])
    # then front's is answered from its track, flagged predicted; back's waits for the model
    assert [(r.camera, r.frame_index) for r in answered] == [("front", 5)]
    det = answered[0].detections
    assert det.predicted and det.track_ids is not None and det.track_ids.tolist() == [1]
    assert np.abs(det.xyxy[0] - [150.0, 100.0, 210.0, 150.0]).max() < 3.0
    # and when the batch's boxes come (the car 15 px further than its motion said), front's
    # frame is not handed on again, back's is
    jumped = _seen(5)
    jumped.xyxy[:, [0, 2]] += 15.0
    late = tracker([_frame("front", 5, jumped), _frame("back", 5, _seen(5))])
    assert [(r.camera, r.frame_index) for r in late] == [("back", 5)]
    # and front's late boxes moved its track on: frame 6, not detected, starts from them
    (guess,) = tracker([_frame("front", 6, _NOTHING)])
    assert guess.detections.track_ids is not None and guess.detections.track_ids.tolist() == [1]
    assert guess.detections.xyxy[0, 0] > 163.0  # from frame 4's box alone: 160
    # and a camera detected over a second before its late frame is left to the model too
    assert tracker.overdue([_frame("front", 20, _NOTHING)]) == []
    # and a replay's stage (rig steps by time) answers nothing early
    held = RigTracker([CameraConfig(name="front")], hold_s=2.0)
    held([_frame("front", 0, _seen(0))])
    assert held.overdue([_frame("front", 1, _NOTHING)]) == []


def test_a_rig_step_older_than_the_last_one_written_writes_no_objects_line() -> None:
    """Live, a forced frame the model was late with can come after other cameras' frames
    answered at their deadline: its rig step is older than the one written before it. The
    objects move on with it, but objects.jsonl stays in time order."""
    from drivepercept.rig import load_rig

    steps: list[float] = []
    cameras = load_rig(SAMPLE / "rig.toml").cameras
    tracker = RigTracker(cameras, on_step=lambda s: steps.append(s.pts_s))
    for k in range(5):
        tracker([_frame("front", k, _seen(k))])
    # when back's frame 2 comes after front's frame 4, then front's frame 5
    (back,) = tracker([_frame("back", 2, _seen(2))])
    tracker([_frame("front", 5, _seen(5))])
    # then back's frame is answered with its tracks, and its step wrote no line
    assert back.detections.track_ids is not None
    assert steps == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]


def _hidden_car_ids(tracker: RigTracker, pixels: bool) -> list[int]:
    """A red car's ids in 35 frames of one camera: hidden in frames 10-29 (past the lost
    time), back beyond where its motion would put it."""
    ids = []
    for k in range(35):
        x = 100.0 + 10 * k if k < 10 else 400.0 + 10 * (k - 30)
        img = np.full((360, 640, 3), 90, np.uint8)
        if not 10 <= k < 30:
            img[100:180, int(x) : int(x) + 40] = (30, 30, 200)
        n = 0 if 10 <= k < 30 else 1
        xyxy = np.array([[x, 100.0, x + 40, 180.0]][:n], np.float32).reshape(n, 4)
        det = Detections(xyxy, np.full(n, 0.9, np.float32), np.zeros(n, np.int64), DRIVING_CLASSES)
        meta = FrameMeta("front", 0, k, k / 10, 0, 0, 0, _LB, original_bgr=img if pixels else None)
        (out,) = tracker([FrameResult(meta, k, 1, det, FrameTiming(*range(11)))])
        assert out.detections.track_ids is not None
        ids += out.detections.track_ids.tolist()
    return ids


def test_the_stage_knows_a_hidden_car_again_by_the_looks_it_reads_from_the_frame() -> None:
    """Issue 44: the stage reads each detected frame's boxes' looks from its pixels (the
    pipeline keeps them for it: `wants_images`). A red car hidden for 2 s (past the lost
    time) that comes back beyond where its motion would put it keeps its id; a stage told
    not to look (or a frame without its pixels: offline re-tracking) tracks by motion alone
    and gives it a new one."""
    looking = RigTracker([CameraConfig(name="front")])
    assert looking.wants_images and _hidden_car_ids(looking, pixels=True) == [1] * 15
    blind = RigTracker([CameraConfig(name="front")], appearance=False)
    assert not blind.wants_images
    assert _hidden_car_ids(blind, pixels=True) == [1] * 10 + [-1] + [2] * 4
    unseen = RigTracker([CameraConfig(name="front")])
    assert _hidden_car_ids(unseen, pixels=False) == [1] * 10 + [-1] + [2] * 4


class _OneLook:
    """A `LooksReader` that needs no pixels: every box looks the same (a unit vector of 5),
    and it keeps what it was asked for."""

    needs_pixels = False

    def __init__(self, rows: int | None = None) -> None:
        self.asked: list[LooksRequest] = []
        self.rows = rows  # give this many rows instead of one per box (a broken reader)

    def __call__(self, frames: Sequence[LooksRequest]) -> list[npt.NDArray[np.float32]]:
        self.asked += frames
        out = []
        for f in frames:
            look = np.zeros((len(f.xyxy) if self.rows is None else self.rows, 5), np.float32)
            look[:, 0] = 1.0
            out.append(look)
        return out


def test_a_looks_reader_that_needs_no_pixels_gives_the_tracker_its_looks() -> None:
    """`RigTracker(looks=...)`: another source of looks (a learned appearance, a probe's)
    plugs in without the tracker changing. One that needs no pixels is asked for every
    detected frame, pixels or not (and the pipeline need not keep them: `wants_images`), and
    its looks know the hidden car again where motion alone could not; a reader that gives
    the wrong rows is refused with a clear error."""
    reader = _OneLook()
    tracker = RigTracker([CameraConfig(name="front")], looks=reader)
    assert not tracker.wants_images
    assert _hidden_car_ids(tracker, pixels=False) == [1] * 15
    assert [(f.camera, f.frame_index, len(f.xyxy)) for f in reader.asked[:2]] == [
        ("front", 0, 1),
        ("front", 1, 1),
    ]
    assert len(reader.asked) == 35 and all(f.image is None for f in reader.asked)
    assert reader.asked[31].xyxy.tolist() == [[410.0, 100.0, 450.0, 180.0]]
    broken = RigTracker([CameraConfig(name="front")], looks=_OneLook(rows=2))
    with pytest.raises(ValueError, match=r"gave \(2, 5\) for 1 boxes"):
        _hidden_car_ids(broken, pixels=False)


def test_read_looks_places_each_frames_looks_at_the_rows_asked_for() -> None:
    """Boxes under the low score are not read: their rows stay zeros (no looks)."""
    asked = [
        LooksRequest("front", 3, None, np.array([[0.0, 0, 10, 10], [5, 5, 20, 20]])),
        LooksRequest("back", 3, None, np.zeros((0, 4))),
    ]
    rows = [np.array([0, 2]), np.zeros(0, np.int64)]
    front, back = read_looks(_OneLook(), asked, rows, [3, 1])
    assert front.tolist() == [[1, 0, 0, 0, 0], [0] * 5, [1, 0, 0, 0, 0]]
    assert back.tolist() == [[0] * 5] and read_looks(_OneLook(), [], [], []) == []
    with pytest.raises(ValueError, match="gave 1 arrays for 2 frames"):
        read_looks(lambda frames: [np.zeros((2, 5), np.float32)], asked, rows, [3, 1])  # type: ignore[arg-type]


def test_the_stage_cpu_bench_sets_inside_beside_alone(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/bench_stage_cpu.py: a short replay of the sample rig with --track, then its
    frames tracked again alone; it prints both CPU figures and their ratio, and leaves the
    stage's class as it found it."""
    call = RigTracker.__call__
    argv = ["bench_stage_cpu.py", str(SAMPLE / "rig.toml"), "--max-frames", "8"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(SAMPLE.parent / "scripts" / "bench_stage_cpu.py"), run_name="__main__")
    assert done.value.code == 0 and RigTracker.__call__ is call
    out = capsys.readouterr().out
    assert "inside the replay:" in out and out.count("alone, round") == 3
    ratio = float(out.rsplit("inside / alone: ", 1)[1].split("x", 1)[0])
    assert ratio > 0
