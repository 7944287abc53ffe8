"""The `--mcap` sink: what it writes reads back with the `mcap` reader, and equals the run's
detections.jsonl."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

pytest.importorskip("mcap")
pytest.importorskip("mcap_ros2")
pytest.importorskip("rosbags")

from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory

from drivepercept.errors import OutputError
from drivepercept.geometry import Intrinsics
from drivepercept.recording import messages
from drivepercept.recording.mcapfile import McapOut
from drivepercept.rig import CameraConfig
from drivepercept.sinks.base import ImageSink, LoadSink
from drivepercept.sinks.mcap import LATENCY_SPANS, LOAD_TOPIC, McapSink
from drivepercept.telemetry.timeline import STAGE_SPANS
from drivepercept.types import (
    Detections,
    FrameMeta,
    FrameResult,
    FrameTiming,
    GpuSample,
    Letterbox,
    LoadSample,
)

pytestmark = pytest.mark.timeout(120)

SAMPLE_RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
CLASS_NAMES = ("person", "bicycle", "car")
CAPTURE_NS = 5_000_000_000
DRIVE_STAMP_NS = 1_700_000_000_000_000_000  # a ROS header stamp
FRONT_TOPIC = "/cam/front/image/compressed"
CAMERAS = (
    CameraConfig(
        name="front",
        video=Path("drive.mcap"),
        topic=FRONT_TOPIC,
        width=64,
        height=48,
        intrinsics=Intrinsics(fx=50.0, fy=50.0, cx=32.0, cy=24.0),
    ),
    CameraConfig(name="back", video=Path("back.mp4")),
)
TOPICS = {"front": f"{FRONT_TOPIC}/detections", "back": "/back/detections"}


def _detections(n: int, *, seed: int) -> Detections:
    rng = np.random.default_rng(seed)
    x1y1 = rng.uniform(0, 30, size=(n, 2))
    wh = rng.uniform(5, 30, size=(n, 2))
    return Detections(
        xyxy=np.hstack([x1y1, x1y1 + wh]).astype(np.float32),
        scores=rng.uniform(0.3, 1.0, size=n).astype(np.float32),
        labels=rng.integers(0, len(CLASS_NAMES), size=n).astype(np.int64),
        class_names=CLASS_NAMES,
    )


def _result(camera: str, frame_index: int, *, boxes: int = 2) -> FrameResult:
    """Frame `frame_index` of `camera`: "front" carries a ROS stamp, "back" only its pts."""
    capture = CAPTURE_NS + frame_index * 66_666_667
    stamps = [capture + 30_000_000 * k // 10 for k in range(11)]
    meta = FrameMeta(
        camera=camera,
        camera_index=0 if camera == "front" else 1,
        frame_index=frame_index,
        pts_s=frame_index / 15.0,
        capture_ns=stamps[0],
        decoded_ns=stamps[1],
        preprocessed_ns=stamps[2],
        letterbox=Letterbox((64, 48), (64, 48), 1.0, 1.0, 0.0, 0.0),
        queued_ns=stamps[3],
        stamp_ns=DRIVE_STAMP_NS + frame_index * 66_666_667 if camera == "front" else None,
    )
    return FrameResult(
        meta=meta,
        batch_index=frame_index,
        batch_size=2,
        detections=_detections(boxes, seed=frame_index * 10 + meta.camera_index),
        timing=FrameTiming(*stamps),
    )


def _results() -> list[FrameResult]:
    # the last frame of each camera has no box: its (empty) annotation still goes out
    return [
        _result(c, i, boxes=0 if i == 2 else 1 + i) for i in range(3) for c in ("front", "back")
    ]


def _image(seed: int) -> np.ndarray:
    """A smooth 64x48 BGR picture (JPEG keeps it close), different for each `seed`."""
    y, x = np.mgrid[0:48, 0:64]
    channels = [x * 3 + seed * 10, y * 4, (x + y) * 2]
    return np.stack(channels, axis=-1).clip(0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Message:
    topic: str
    schema: str
    log_time: int
    body: Any  # JSON as dicts; ROS 2 as decoded objects


@dataclass(frozen=True)
class Read:
    profile: str
    metadata: dict[str, dict[str, str]]
    messages: list[Message]

    def on(self, topic: str) -> list[Message]:
        return [m for m in self.messages if m.topic == topic]

    @property
    def topics(self) -> set[str]:
        return {m.topic for m in self.messages}


def _read(path: Path) -> Read:
    """Every message of the MCAP at `path`, in log-time order, decoded."""
    decoders = DecoderFactory()
    out = []
    with path.open("rb") as fh:
        reader = make_reader(fh, validate_crcs=True)
        profile = reader.get_header().profile
        metadata = {m.name: dict(m.metadata) for m in reader.iter_metadata()}
        for schema, channel, message in reader.iter_messages(log_time_order=True):
            assert schema is not None
            if channel.message_encoding == "json":
                body = json.loads(message.data)
            else:
                decode = decoders.decoder_for(channel.message_encoding, schema)
                assert decode is not None
                body = decode(message.data)
            out.append(Message(channel.topic, schema.name, message.log_time, body))
    return Read(profile, metadata, out)


def _boxes(annotation: dict[str, Any]) -> list[list[float]]:
    """xyxy of each outline of a `foxglove.ImageAnnotations`."""
    out = []
    for outline in annotation["points"]:
        xs = [p["x"] for p in outline["points"]]
        ys = [p["y"] for p in outline["points"]]
        assert outline["type"] == messages.LINE_LOOP and len(xs) == 4
        out.append([min(xs), min(ys), max(xs), max(ys)])
    return out


def _ns(t: dict[str, int]) -> int:
    return t["sec"] * 1_000_000_000 + t["nsec"]


def _labels(det: Detections) -> list[str]:
    return [f"{n} {s:.2f}" for n, s in zip(det.names, det.scores.tolist(), strict=True)]


def _write(path: Path, **kwargs: Any) -> list[FrameResult]:
    results = _results()
    with McapSink(path, cameras=CAMERAS, **kwargs) as sink:
        assert isinstance(sink, ImageSink) and isinstance(sink.load_sink, LoadSink)
        for k, r in enumerate(results):
            sink.write_with_image(r, _image(k))
    return results


# ------------------------------------------------------------------ unit


def test_annotations_read_back_with_the_frames_boxes_labels_and_stamps(tmp_path: Path) -> None:
    # given two cameras, one from a ROS drive (header stamps), one a video (pts)
    path = tmp_path / "out" / "run.mcap"  # a missing folder is made
    results = _write(path)

    read = _read(path)
    assert read.profile == ""
    assert read.metadata["drivepercept"]["cameras"] == "front,back"
    for camera, topic in TOPICS.items():
        got = read.on(topic)
        mine = [r for r in results if r.camera == camera]
        assert len(got) == len(mine) == 3
        for message, result in zip(got, mine, strict=True):
            # then each is logged at the frame's stamp on its source's clock
            assert message.schema == "foxglove.ImageAnnotations"
            assert message.log_time == result.stamp_ns
            det = result.detections
            assert _boxes(message.body) == det.xyxy.astype(np.float64).tolist()
            assert [t["text"] for t in message.body["texts"]] == _labels(det)
            stamps = [_ns(a["timestamp"]) for a in message.body["points"] + message.body["texts"]]
            assert set(stamps) <= {result.stamp_ns}
    assert read.on(TOPICS["front"])[0].log_time == DRIVE_STAMP_NS
    # a class keeps its colour
    colours: dict[str, set[str]] = {}
    for m in read.on(TOPICS["front"]) + read.on(TOPICS["back"]):
        for text, outline in zip(m.body["texts"], m.body["points"], strict=True):
            colours.setdefault(text["text"].split()[0], set()).add(str(outline["outline_color"]))
    assert all(len(c) == 1 for c in colours.values())
    # no ROS form, no image (not asked for)
    assert not any(t.endswith(("detections_ros", "/image", "camera_info")) for t in read.topics)


def test_latency_topic_per_camera_holds_the_stage_spans(tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    results = _write(path)
    got = _read(path).on("/drivepercept/latency/back")
    assert [m.body["frame_index"] for m in got] == [0, 1, 2]
    first = got[0].body
    assert first["end_to_end_ms"] == pytest.approx(results[1].timing.end_to_end_ms)
    spans = [first[name] for name, _, _ in LATENCY_SPANS]
    assert sum(spans) == pytest.approx(first["end_to_end_ms"])
    assert first["detections"] == 1 and first["batch_size"] == 2


def test_a_predicted_frame_is_marked_thinner_and_labelled(tmp_path: Path) -> None:
    # given the back camera's frame 1 answered by the tracker (the model did not see it)
    results = _results()
    k = next(i for i, r in enumerate(results) if r.camera == "back" and r.frame_index == 1)
    det = results[k].detections
    guessed = Detections(det.xyxy, det.scores, det.labels, det.class_names, predicted=True)
    results[k] = dataclasses.replace(results[k], detections=guessed)
    path = tmp_path / "run.mcap"
    with McapSink(path, cameras=CAMERAS) as sink:
        for r in results:
            sink.write(r)
    read = _read(path)
    # then its boxes say so, drawn thinner; the model's are not marked
    for message in read.on(TOPICS["back"]):
        texts = [t["text"] for t in message.body["texts"]]
        widths = {p["thickness"] for p in message.body["points"]}
        if message.log_time == results[k].stamp_ns:
            assert texts == [f"{t} predicted" for t in _labels(det)] and widths == {1.0}
        else:
            assert not any("predicted" in t for t in texts) and widths <= {2.0}
    flags = [m.body["predicted"] for m in read.on("/drivepercept/latency/back")]
    assert flags == [0, 1, 0]


def test_latency_spans_are_the_reports_stage_spans() -> None:
    assert [(f"{s.name}_ms", s.start, s.end) for s in STAGE_SPANS] == list(LATENCY_SPANS)


def test_ros2_file_also_holds_detection_arrays(tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    results = _write(path, ros2=True)

    read = _read(path)
    assert read.profile == "ros2"
    got = read.on(f"{FRONT_TOPIC}/detections_ros")
    front = [r for r in results if r.camera == "front"]
    assert len(got) == 3 and len(read.on("/back/detections_ros")) == 3
    for message, result in zip(got, front, strict=True):
        array, det = message.body, result.detections
        assert message.schema == "vision_msgs/msg/Detection2DArray"
        assert message.log_time == result.stamp_ns
        assert array.header.frame_id == "front"
        assert array.header.stamp.sec * 1_000_000_000 + array.header.stamp.nanosec == (
            result.stamp_ns
        )
        assert len(array.detections) == len(det)
        for d, xyxy, name, score in zip(
            array.detections, det.xyxy.tolist(), det.names, det.scores.tolist(), strict=True
        ):
            (hypothesis,) = d.results
            assert hypothesis.hypothesis.class_id == name
            assert hypothesis.hypothesis.score == pytest.approx(score)
            centre = d.bbox.center.position
            box = [
                centre.x - d.bbox.size_x / 2,
                centre.y - d.bbox.size_y / 2,
                centre.x + d.bbox.size_x / 2,
                centre.y + d.bbox.size_y / 2,
            ]
            assert box == pytest.approx(xyxy)


def test_images_and_calibration_only_when_asked(tmp_path: Path) -> None:
    # given images handed in (another sink wanted them) to a sink not asked for them
    plain = tmp_path / "plain.mcap"
    _write(plain, ros2=True)
    assert not any("image" in t.split("/")[-1] for t in _read(plain).topics - {FRONT_TOPIC})

    # when asked, in a ROS 2 file: sensor_msgs, the drive's camera under /drivepercept
    ros = tmp_path / "ros.mcap"
    results = _write(ros, ros2=True, images=True)
    read = _read(ros)
    images = read.on("/drivepercept/front/image")
    assert [m.log_time for m in images] == [r.stamp_ns for r in results if r.camera == "front"]
    assert images[0].schema == "sensor_msgs/msg/CompressedImage"
    assert images[0].body.format == "jpeg"
    decoded = cv2.imdecode(np.frombuffer(images[0].body.data, np.uint8), cv2.IMREAD_COLOR)
    assert decoded is not None
    assert decoded.shape == (48, 64, 3)
    assert np.abs(decoded.astype(int) - _image(0).astype(int)).mean() < 3
    assert len(read.on("/back/image")) == 3
    # one CameraInfo, where the rig gives intrinsics
    (info,) = read.on("/drivepercept/front/camera_info")
    assert (info.body.width, info.body.height) == (64, 48)
    assert list(info.body.k) == [50.0, 0.0, 32.0, 0.0, 50.0, 24.0, 0.0, 0.0, 1.0]
    assert read.on("/back/camera_info") == []

    # and in a plain file: foxglove.CompressedImage (JSON)
    json_file = tmp_path / "json.mcap"
    _write(json_file, images=True)
    (first, *_) = _read(json_file).on("/back/image")
    assert first.schema == "foxglove.CompressedImage" and first.body["format"] == "jpeg"
    assert _ns(first.body["timestamp"]) == first.log_time == 0


def _sample(t_ns: int) -> LoadSample:
    gpu = GpuSample(
        index=0,
        util_pct=55.0,
        mem_util_pct=math.nan,
        mem_used_bytes=float(1 << 30),
        mem_total_bytes=float(8 << 30),
        power_w=120.5,
        power_limit_w=300.0,
        temperature_c=60.0,
        sm_clock_mhz=1500.0,
        mem_clock_mhz=5000.0,
        pcie_tx_bytes_s=0.0,
        pcie_rx_bytes_s=0.0,
        throttle_reasons=0,
    )
    return LoadSample(
        t_ns=t_ns,
        process_cpu_pct=150.0,
        system_cpu_pct=40.0,
        per_core_cpu_pct=(40.0, 40.0),
        process_rss_bytes=512 << 20,
        system_mem_used_bytes=2 << 30,
        system_mem_total_bytes=8 << 30,
        gpus=(gpu,),
    )


def test_load_samples_from_another_thread_on_the_frames_clock(tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    sink = McapSink(path, cameras=CAMERAS)
    first = _result("front", 0)
    # a sample before the first frame waits for it; one before its source's time 0 cannot be
    sink.load_sink.write(_sample(first.timing.capture_ns + 10_000_000))
    sink.write(first)

    def sampler() -> None:
        for k in range(1, 6):
            sink.load_sink.write(_sample(first.timing.capture_ns + k * 100_000_000))

    thread = threading.Thread(target=sampler, name="gpu-monitor")
    thread.start()
    for r in _results()[1:]:
        sink.write(r)
    thread.join(timeout=10)
    assert not thread.is_alive()
    sink.load_sink.close()
    sink.load_sink.close()
    sink.load_sink.write(_sample(first.timing.capture_ns + 10**9))  # after its close: dropped
    sink.write(_result("back", 3))  # the file is still open
    sink.close()
    sink.close()  # a second close does nothing
    sink.write(_result("back", 4))  # nor does a write after it
    assert sink.frames_written == 7

    read = _read(path)
    load = read.on(LOAD_TOPIC)
    assert len(load) == 6 == sink.load_samples_written
    assert load[0].log_time == DRIVE_STAMP_NS + 10_000_000
    assert all(a.log_time <= b.log_time for a, b in itertools.pairwise(load))
    body = load[0].body
    assert _ns(body["timestamp"]) == load[0].log_time
    assert body["process_cpu_pct"] == 150.0 and body["process_rss_mb"] == 512.0
    assert body["gpu0_util_pct"] == 55.0 and body["gpu0_power_w"] == 120.5
    assert body["gpu0_mem_util_pct"] is None and body["gpu0_mem_used_mb"] == 1024.0
    assert len(read.on("/back/detections")) == 4


def test_samples_before_the_source_begins_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "run.mcap"
    with McapSink(path, cameras=CAMERAS) as sink:
        back = _result("back", 0)  # pts 0
        sink.load_sink.write(_sample(back.timing.capture_ns - 1))
        sink.write(back)
        sink.load_sink.write(_sample(back.timing.capture_ns + 5))
    assert [m.log_time for m in _read(path).on(LOAD_TOPIC)] == [5]


def test_unwritable_path_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OutputError) as err:
        McapSink(blocker / "run.mcap", cameras=CAMERAS)
    assert str(err.value) == f"cannot create {blocker / 'run.mcap'}: {blocker} is not a folder"
    with pytest.raises(OutputError):
        McapSink(tmp_path, cameras=CAMERAS)  # a folder


# ------------------------------------------------------------------ through the CLI


@pytest.fixture
def no_threads_left() -> Iterator[None]:
    """An in-process run must stop and join every pipeline thread."""
    yield
    names = ("decode-", "batcher", "engine", "gpu-monitor", "sink-")
    assert [t.name for t in threading.enumerate() if t.name.startswith(names)] == []


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


@pytest.mark.integration
@pytest.mark.usefixtures("no_threads_left")
def test_replay_mcap_annotations_equal_detections_jsonl(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    mcap = tmp_path / "run.mcap"
    code, err = in_process(
        [
            "replay",
            str(SAMPLE_RIG),
            "--model",
            "drivepercept-tiny",
            "--max-frames",
            "5",
            "--mcap",
            str(mcap),
            "--out",
            str(tmp_path / "runs"),
            "--no-progress",
        ]
    )
    assert code == 0, err
    read = _read(mcap)
    annotations = {(m.topic, m.log_time): m.body for m in read.messages}
    lines = (_run_dir(tmp_path / "runs") / "detections.jsonl").read_text().splitlines()
    assert len(lines) == 30
    boxes = 0
    for line in map(json.loads, lines):
        stamp = round(line["pts_s"] * 1e9)  # a video's frames are stamped with their pts
        got = annotations[(f"/{line['camera']}/detections", stamp)]
        assert np.round(np.array(_boxes(got)), 2).tolist() == line["boxes"]
        texts = [t["text"].split() for t in got["texts"]]
        assert [name for name, _ in texts] == line["class_names"]
        # (the label's score is the model's, the line's is rounded to 4 decimals)
        assert [float(s) for _, s in texts] == pytest.approx(line["scores"], abs=0.0051)
        boxes += len(line["boxes"])
    assert boxes > 0
    assert sum(m.topic.endswith("/detections") for m in read.messages) == 30
    assert {f"/drivepercept/latency/{c}" for c in ("front", "back")} <= read.topics
    assert read.profile == ""


def _drive(path: Path, frames: int) -> list[int]:
    """A ROS 2 drive of `frames` of the sample's front camera; their header stamps."""
    cap = cv2.VideoCapture(str(SAMPLE_RIG.parent / "front.mp4"))
    stamps = []
    with McapOut(path, profile="ros2") as out:
        for k in range(frames):
            ok, image = cap.read()
            assert ok
            jpeg = cv2.imencode(".jpg", image)[1].tobytes()
            stamp = DRIVE_STAMP_NS + k * 66_666_667
            message = messages.compressed_image(stamp, "front_optical", "jpeg", jpeg)
            # logged a little after the stamp, as a recorder does
            out.ros2(FRONT_TOPIC, messages.COMPRESSED_IMAGE, message, log_time_ns=stamp + 5_000)
            stamps.append(stamp)
    cap.release()
    return stamps


@pytest.mark.integration
@pytest.mark.usefixtures("no_threads_left")
def test_replay_of_a_ros2_drive_writes_its_topics_at_its_stamps(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    stamps = _drive(tmp_path / "drive.mcap", 3)
    mcap = tmp_path / "run.mcap"
    code, err = in_process(
        [
            "replay",
            str(tmp_path / "drive.mcap"),
            "--model",
            "drivepercept-tiny",
            "--mcap",
            str(mcap),
            "--mcap-images",
            "--out",
            str(tmp_path / "runs"),
            "--no-progress",
        ]
    )
    assert code == 0, err
    read = _read(mcap)
    assert read.profile == "ros2"
    annotations = read.on(f"{FRONT_TOPIC}/detections")
    arrays = read.on(f"{FRONT_TOPIC}/detections_ros")
    assert [m.log_time for m in annotations] == [m.log_time for m in arrays] == stamps
    assert len([m for m in read.messages if m.body.__class__.__name__ == "CompressedImage"]) == 3
    lines = (_run_dir(tmp_path / "runs") / "detections.jsonl").read_text().splitlines()
    for message, array, line in zip(annotations, arrays, map(json.loads, lines), strict=True):
        assert np.round(np.array(_boxes(message.body)), 2).tolist() == line["boxes"]
        classes = [d.results[0].hypothesis.class_id for d in array.body.detections]
        assert classes == line["class_names"]


@pytest.mark.integration
def test_mcap_images_without_mcap_is_one_line(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, err = in_process(
        ["replay", str(SAMPLE_RIG), "--mcap-images", "--out", str(tmp_path), "--no-progress"]
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "--mcap" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_unwritable_mcap_path_is_one_line(
    tmp_path: Path, in_process: Callable[[list[str]], tuple[int, str]]
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, err = in_process(
        [
            "replay",
            str(SAMPLE_RIG),
            "--model",
            "drivepercept-tiny",
            "--max-frames",
            "1",
            "--mcap",
            str(blocker / "run.mcap"),
            "--out",
            str(tmp_path / "runs"),
            "--no-progress",
        ]
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "run.mcap" in err
