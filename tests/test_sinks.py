"""Output writers: JSON Lines detections, frames.csv timings, annotated videos."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest

from drivepercept.errors import OutputError
from drivepercept.sinks import (
    FRAMES_CSV_COLUMNS,
    MOSAIC_FILE,
    AnnotatedVideoSink,
    DetectionsJsonlSink,
    FrameTimingCsvSink,
    ImageSink,
    Sink,
    draw_detections,
)
from drivepercept.sinks.annotate import annotated_tile
from drivepercept.types import (
    STAMPS,
    Detections,
    FrameMeta,
    FrameResult,
    FrameTiming,
    ImageU8,
    Letterbox,
)

CLASS_NAMES = ("person", "bicycle", "car")
CAPTURE_NS = 5_000_000_000


def _detections(n: int, *, seed: int = 0) -> Detections:
    rng = np.random.default_rng(seed)
    x1y1 = rng.uniform(0, 30, size=(n, 2))
    wh = rng.uniform(5, 30, size=(n, 2))
    return Detections(
        xyxy=np.hstack([x1y1, x1y1 + wh]).astype(np.float32),
        scores=rng.uniform(0.3, 1.0, size=n).astype(np.float32),
        labels=rng.integers(0, len(CLASS_NAMES), size=n).astype(np.int64),
        class_names=CLASS_NAMES,
    )


def _result(
    *,
    camera: str = "front",
    camera_index: int = 0,
    frame_index: int = 0,
    boxes: int = 2,
    latency_ns: int = 42_123_456,
) -> FrameResult:
    capture = CAPTURE_NS + frame_index * 66_666_667
    # eleven increasing stamps, ending at capture + latency
    stamps = [capture + latency_ns * k // 10 for k in range(11)]
    meta = FrameMeta(
        camera=camera,
        camera_index=camera_index,
        frame_index=frame_index,
        pts_s=frame_index / 15.0,
        capture_ns=stamps[0],
        decoded_ns=stamps[1],
        preprocessed_ns=stamps[2],
        letterbox=Letterbox((640, 360), (640, 360), 1.0, 1.0, 0.0, 0.0),
        queued_ns=stamps[3],
    )
    return FrameResult(
        meta=meta,
        batch_index=frame_index,
        batch_size=2,
        detections=_detections(boxes, seed=frame_index * 10 + camera_index),
        timing=FrameTiming(*stamps),
    )


def _image(width: int, height: int, value: int = 128) -> ImageU8:
    return np.full((height, width, 3), value, np.uint8)


def _read_video(path: Path) -> Iterator[ImageU8]:
    capture = cv2.VideoCapture(str(path))
    assert capture.isOpened(), f"cannot open {path}"
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                return
            yield np.asarray(frame, dtype=np.uint8)
    finally:
        capture.release()


@pytest.fixture
def blocked_dir(tmp_path: Path) -> Path:
    """A path whose parent is a regular file: nothing can be created under it, even as root."""
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    return blocker / "out"


# --- JSON Lines ---------------------------------------------------------------------------


def test_jsonl_lines_round_trip_the_values(tmp_path: Path) -> None:
    # given two frames of two cameras, one with no boxes
    results = [
        _result(camera="front", camera_index=0, frame_index=3, boxes=3),
        _result(camera="back", camera_index=1, frame_index=3, boxes=0),
    ]
    path = tmp_path / "detections.jsonl"
    # when they are written
    with DetectionsJsonlSink(path) as sink:
        for result in results:
            sink.write(result)
    # then each line is a compact JSON object holding the frame's values
    text = path.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 2
    assert ", " not in lines[0] and ": " not in lines[0]
    for line, result in zip(lines, results, strict=True):
        record = json.loads(line)
        assert record["camera"] == result.camera
        assert record["camera_index"] == result.camera_index
        assert record["frame_index"] == result.frame_index
        assert record["pts_s"] == pytest.approx(result.pts_s)
        assert record["batch_index"] == result.batch_index
        assert record["batch_size"] == result.batch_size
        stamps = record["timestamps"]
        assert stamps["capture_ns"] == result.timing.capture_ns
        assert stamps["emitted_ns"] == result.timing.emitted_ns
        assert stamps["end_to_end_ms"] == 42.123  # 42_123_456 ns, 3 decimals
        det = result.detections
        boxes = np.array(record["boxes"], dtype=np.float64).reshape(-1, 4)
        assert np.allclose(boxes, det.xyxy, atol=0.005 + 1e-6)
        assert all(v == round(v, 2) for box in record["boxes"] for v in box)
        assert np.allclose(record["scores"], det.scores, atol=0.00005 + 1e-7)
        assert record["labels"] == det.labels.tolist()
        assert all(isinstance(v, int) for v in record["labels"])
        assert record["class_names"] == [CLASS_NAMES[i] for i in det.labels]
    assert json.loads(lines[1])["boxes"] == []


def test_jsonl_writes_strict_json_for_non_finite_numbers(tmp_path: Path) -> None:
    result = _result(boxes=1)
    result.detections.xyxy[0, 2] = np.nan
    result.detections.scores[0] = np.inf
    path = tmp_path / "d.jsonl"
    with DetectionsJsonlSink(path) as sink:
        sink.write(result)
    record = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"got {c}"))
    assert record["boxes"][0][2] is None
    assert record["scores"] == [None]


def test_jsonl_file_is_whole_lines_while_the_run_goes_on(tmp_path: Path) -> None:
    # given enough frames to pass the write threshold a few times, sink still open
    path = tmp_path / "d.jsonl"
    sink = DetectionsJsonlSink(path)
    for k in range(1500):
        sink.write(_result(frame_index=k, boxes=5))
    # then what is on disk so far (the run could be killed now) is whole, parseable lines
    on_disk = path.read_bytes()
    assert len(on_disk) > 0 and on_disk.endswith(b"\n")
    indices = [json.loads(line)["frame_index"] for line in on_disk.splitlines()]
    assert indices == list(range(len(indices)))
    # and close() writes the rest
    sink.close()
    assert len(path.read_text().splitlines()) == 1500 == sink.frames_written


def test_files_written_before_an_exception_mid_run_are_valid(tmp_path: Path) -> None:
    # given a run that fails after three frames
    jsonl, frames_csv = tmp_path / "d.jsonl", tmp_path / "frames.csv"
    with (
        pytest.raises(RuntimeError, match="camera died"),
        DetectionsJsonlSink(jsonl) as det_sink,
        FrameTimingCsvSink(frames_csv) as csv_sink,
    ):
        for k in range(3):
            det_sink.write(_result(frame_index=k))
            csv_sink.write(_result(frame_index=k))
        raise RuntimeError("camera died")
    # then both files hold exactly the three frames, every line complete
    lines = jsonl.read_text().splitlines()
    assert [json.loads(line)["frame_index"] for line in lines] == [0, 1, 2]
    with frames_csv.open(newline="") as f:
        assert [int(row["frame_index"]) for row in csv.DictReader(f)] == [0, 1, 2]


# --- frames.csv ---------------------------------------------------------------------------


def test_frames_csv_has_header_and_values(tmp_path: Path) -> None:
    # given a camera name the csv module has to quote
    results = [
        _result(camera="front", frame_index=0, boxes=4),
        _result(camera="odd,name", camera_index=1, frame_index=0, boxes=0, latency_ns=7_000_001),
    ]
    path = tmp_path / "frames.csv"
    with FrameTimingCsvSink(path) as sink:
        for result in results:
            sink.write(result)
    assert sink.frames_written == 2
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == FRAMES_CSV_COLUMNS
    assert FRAMES_CSV_COLUMNS[6:-2] == tuple(f"{stamp}_ns" for stamp in STAMPS)
    assert len(rows) == 2
    for row, result in zip(rows, results, strict=True):
        timing = result.timing
        assert row["camera"] == result.camera
        assert int(row["camera_index"]) == result.camera_index
        assert int(row["frame_index"]) == result.frame_index
        assert float(row["pts_s"]) == result.pts_s
        assert int(row["batch_index"]) == result.batch_index
        assert int(row["batch_size"]) == result.batch_size
        for stamp in STAMPS:
            assert int(row[f"{stamp}_ns"]) == timing.stamp(stamp)
        expected_ms = (timing.emitted_ns - timing.capture_ns) / 1e6
        assert float(row["end_to_end_ms"]) == pytest.approx(expected_ms, abs=0.0005)
        assert int(row["detections"]) == len(result.detections)
    assert float(rows[1]["end_to_end_ms"]) == 7.0


def test_frames_csv_with_no_frames_is_just_the_header(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "frames.csv"  # missing parent folders are made
    FrameTimingCsvSink(path).close()
    assert path.read_text() == ",".join(FRAMES_CSV_COLUMNS) + "\n"


# --- every sink -----------------------------------------------------------------------------


def test_sinks_in_an_uncreatable_place_raise_a_one_line_output_error(blocked_dir: Path) -> None:
    for make in (
        lambda: DetectionsJsonlSink(blocked_dir / "d.jsonl"),
        lambda: FrameTimingCsvSink(blocked_dir / "frames.csv"),
        lambda: AnnotatedVideoSink(blocked_dir / "videos", fps=15.0),
    ):
        with pytest.raises(OutputError) as info:
            make()
        message = str(info.value)
        assert "\n" not in message
        assert str(blocked_dir) in message


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_an_output_error_and_the_sink_still_closes() -> None:
    sink = DetectionsJsonlSink(Path("/dev/full"))
    sink.write(_result())
    with pytest.raises(OutputError, match="cannot write detections file /dev/full") as info:
        sink.close()
    assert "\n" not in str(info.value)
    sink.close()  # already closed: nothing more to do


def test_closing_twice_is_safe_and_writing_after_close_is_an_error(tmp_path: Path) -> None:
    sinks: list[Sink] = [
        DetectionsJsonlSink(tmp_path / "d.jsonl"),
        FrameTimingCsvSink(tmp_path / "frames.csv"),
        AnnotatedVideoSink(tmp_path / "videos", fps=15.0),
    ]
    for sink in sinks:
        assert isinstance(sink, Sink)  # the runtime check the pipeline may use
        sink.close()
        sink.close()
    with pytest.raises(ValueError, match="closed"):
        sinks[0].write(_result())
    with pytest.raises(ValueError, match="closed"):
        sinks[1].write(_result())
    video = sinks[2]
    assert isinstance(video, AnnotatedVideoSink)
    with pytest.raises(ValueError, match="closed"):
        video.write_with_image(_result(), _image(64, 48))


# --- annotated video ----------------------------------------------------------------------


def test_video_sink_writes_one_decodable_mp4_per_camera(tmp_path: Path) -> None:
    # given two cameras of different sizes and rates, three and two frames
    sizes = {"front": (96, 64), "back": (64, 48)}
    counts = {"front": 3, "back": 2}
    out = tmp_path / "videos"
    with AnnotatedVideoSink(out, fps={"front": 15.0, "back": 10.0}) as sink:
        assert isinstance(sink, ImageSink)
        for k in range(3):
            for index, camera in enumerate(sizes):
                if k < counts[camera]:
                    result = _result(camera=camera, camera_index=index, frame_index=k)
                    sink.write_with_image(result, _image(*sizes[camera], value=40 * k))
    # then each camera's video decodes with its frame count and size
    assert sorted(p.name for p in out.iterdir()) == ["back.mp4", "front.mp4"]
    for camera, (width, height) in sizes.items():
        frames = list(_read_video(out / f"{camera}.mp4"))
        assert len(frames) == counts[camera]
        assert {f.shape for f in frames} == {(height, width, 3)}
    capture = cv2.VideoCapture(str(out / "back.mp4"))
    assert capture.get(cv2.CAP_PROP_FPS) == pytest.approx(10.0)
    capture.release()


def test_video_sink_pads_an_odd_frame_size_to_even(tmp_path: Path) -> None:
    with AnnotatedVideoSink(tmp_path, fps=15.0) as sink:
        sink.write_with_image(_result(), _image(65, 47))
    assert [f.shape for f in _read_video(tmp_path / "front.mp4")] == [(48, 66, 3)]


def test_video_sink_mosaic_writes_one_frame_per_camera0_frame(tmp_path: Path) -> None:
    # given three cameras (a 2x2 grid of 80x46 tiles), camera 0 delivering four frames; camera
    # 2 finds nothing, so its tile shows its picture (labels fill most of a tile this small)
    out = tmp_path / "videos"
    sink = AnnotatedVideoSink(out, fps=15.0, mosaic=True, cameras=3, tile_size=(80, 46))
    for k in range(4):
        for index, camera in enumerate(("front", "left", "right")):
            boxes = 0 if index == 2 else 2
            result = _result(camera=camera, camera_index=index, frame_index=k, boxes=boxes)
            sink.write_with_image(result, _image(128, 72 + 8 * index, value=60 * index))
    sink.close()
    # then one mosaic.mp4 of four frames, 2 tiles wide and 2 high
    assert [p.name for p in out.iterdir()] == [MOSAIC_FILE]
    assert sink.paths == (out / MOSAIC_FILE,)
    frames = list(_read_video(out / MOSAIC_FILE))
    assert len(frames) == 4
    assert {f.shape for f in frames} == {(92, 160, 3)}
    # the empty fourth tile stays black, the others hold their camera's picture
    last = frames[-1].astype(int)
    assert last[46 + 8 :, 80 + 8 :].max() < 20
    assert abs(np.median(last[46 + 20 : 92 - 5, 20:60]) - 120) < 12  # camera 2 (value 120)


def test_a_mosaic_tile_shows_the_track_and_object_ids() -> None:
    # given one frame's boxes with ids, and the same boxes without
    result = _result(boxes=2)
    det = result.detections
    tracked = replace(
        result,
        detections=Detections(
            det.xyxy,
            det.scores,
            det.labels,
            det.class_names,
            track_ids=np.array([4, 5]),
            global_ids=np.array([9, -1]),
        ),
    )
    image = _image(320, 240, value=100)
    # when both are drawn into a tile
    plain = annotated_tile(result, image, (160, 120))
    with_ids = annotated_tile(tracked, image, (160, 120))
    # then the tile shows the ids (annotated_tile used to drop them when it scaled the boxes)
    assert not np.array_equal(plain, with_ids)


def test_video_mosaic_needs_a_camera_count() -> None:
    with pytest.raises(ValueError, match="camera count"):
        AnnotatedVideoSink(Path("unused"), fps=15.0, mosaic=True)


def test_video_sink_names_a_camera_without_fps(tmp_path: Path) -> None:
    with (
        AnnotatedVideoSink(tmp_path, fps={"front": 15.0}) as sink,
        pytest.raises(ValueError, match=r"no fps for camera 'back'; cameras with one: front"),
    ):
        sink.write_with_image(_result(camera="back"), _image(64, 48))


def test_video_sink_write_without_pixels_is_skipped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with AnnotatedVideoSink(tmp_path, fps=15.0) as sink:
        sink.write(_result())
        sink.write(_result(frame_index=1))
    assert list(tmp_path.iterdir()) == []
    assert len([r for r in caplog.records if "write_with_image" in r.getMessage()]) == 1


# --- drawing ------------------------------------------------------------------------------


def test_draw_detections_changes_the_box_and_not_far_outside() -> None:
    # given a grey image and one box well inside it
    image = _image(320, 240)
    box = (100.0, 120.0, 200.0, 180.0)
    det = Detections(
        np.array([box], np.float32),
        np.array([0.87], np.float32),
        np.array([2], np.int64),
        CLASS_NAMES,
    )
    # when it is drawn with a header
    out = draw_detections(image, det, header="front #3 41.2 ms")
    # then the input is untouched and the box outline is drawn on its edge pixels
    assert (image == 128).all()
    assert out.shape == image.shape and out.dtype == np.uint8
    changed = (out != image).any(axis=2)
    assert changed[150, 100] and changed[150, 199]  # left and right edges
    assert changed[179, 150] and changed[120, 150]  # bottom and top edges
    assert not changed[135:165, 110:190].any()  # the inside stays clear
    # the label sits just above the box; nothing changes far from box, label and header
    assert changed[100:120, 100:140].any()
    assert not changed[183:, :].any()
    assert not changed[40:, 203:].any()
    assert not changed[40:, :97].any()
    assert changed[:20, :60].any()  # the header


def test_draw_detections_with_nothing_to_draw_returns_an_equal_copy() -> None:
    image = _image(64, 48)
    out = draw_detections(image, Detections.empty(CLASS_NAMES), header="")
    assert out is not image and np.array_equal(out, image)


def test_draw_detections_rejects_a_grey_image() -> None:
    with pytest.raises(ValueError, match=r"uint8 \(H, W, 3\)"):
        draw_detections(np.zeros((8, 8), np.uint8), Detections.empty())
