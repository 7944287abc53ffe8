"""The Rerun sink: recordings read back with Rerun's own reader, load from the sampler's
thread, the errors a user can cause, and the web viewer in Debian's headless Chromium."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

rr = pytest.importorskip("rerun")
from rerun.chunk import RrdReader  # noqa: E402

from drivepercept.errors import ConfigError, OutputError  # noqa: E402
from drivepercept.sinks import ImageSink, LoadSink  # noqa: E402
from drivepercept.sinks import rerun as rerun_sink  # noqa: E402
from drivepercept.sinks.fanout import SinkPolicy, SinkSet  # noqa: E402
from drivepercept.sinks.rerun import RerunSink, RerunTarget, camera_path  # noqa: E402
from drivepercept.types import (  # noqa: E402
    Detections,
    DropPolicy,
    FrameMeta,
    FrameResult,
    FrameTiming,
    GpuSample,
    ImageU8,
    Letterbox,
    LoadSample,
)

pytestmark = pytest.mark.timeout(120)

CLASS_NAMES = ("person", "bicycle", "car")
CAMERAS = ("front", "rear/left", "side right")  # a "/" and a space: escaped entity paths
# BGR colour of each camera's frames, told apart after JPEG
COLOURS = {"front": (255, 0, 0), "rear/left": (0, 255, 0), "side right": (0, 0, 255)}
W, H = 160, 90
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parents[1]


def _boxes(camera_index: int, frame_index: int, n: int) -> Detections:
    """`n` known boxes; each value depends on camera, frame and box."""
    k = np.arange(n, dtype=np.float32)
    x1 = 10.0 + 7.0 * k + frame_index + 0.25 * camera_index
    y1 = 5.0 + 3.0 * k + 0.5 * frame_index
    xyxy = np.stack([x1, y1, x1 + 20.5, y1 + 11.75], axis=1).astype(np.float32)
    return Detections(
        xyxy=xyxy.reshape(n, 4),
        scores=np.linspace(0.9, 0.5, n, dtype=np.float32),
        labels=(np.arange(n) % len(CLASS_NAMES)).astype(np.int64),
        class_names=CLASS_NAMES,
    )


def _result(
    camera: str, frame_index: int, *, boxes: int = 2, latency_ms: float = 40.0
) -> FrameResult:
    camera_index = CAMERAS.index(camera)
    capture = 1_000_000_000 + frame_index * 50_000_000 + camera_index * 1_000
    step = int(latency_ms * 1e6) // 10
    stamps = [capture + k * step for k in range(10)] + [capture + int(latency_ms * 1e6)]
    meta = FrameMeta(
        camera=camera,
        camera_index=camera_index,
        frame_index=frame_index,
        pts_s=frame_index / 20.0,
        capture_ns=stamps[0],
        decoded_ns=stamps[1],
        preprocessed_ns=stamps[2],
        letterbox=Letterbox((W, H), (W, H), 1.0, 1.0, 0.0, 0.0),
        queued_ns=stamps[3],
    )
    return FrameResult(
        meta=meta,
        batch_index=frame_index,
        batch_size=len(CAMERAS),
        detections=_boxes(camera_index, frame_index, boxes),
        timing=FrameTiming(*stamps),
    )


def _image(camera: str) -> ImageU8:
    image = np.zeros((H, W, 3), np.uint8)
    image[:] = COLOURS[camera]
    return image


def _gpu(index: int, *, util: float, power: float = float("nan")) -> GpuSample:
    nan = float("nan")
    return GpuSample(
        index=index,
        util_pct=util,
        mem_util_pct=nan,
        mem_used_bytes=512.0 * (1 << 20),
        mem_total_bytes=nan,
        power_w=power,
        power_limit_w=nan,
        temperature_c=nan,
        sm_clock_mhz=nan,
        mem_clock_mhz=nan,
        pcie_tx_bytes_s=nan,
        pcie_rx_bytes_s=nan,
        throttle_reasons=-1,
    )


def _load(t_ns: int, cpu: float) -> LoadSample:
    return LoadSample(
        t_ns=t_ns,
        process_cpu_pct=cpu,
        system_cpu_pct=cpu / 2,
        per_core_cpu_pct=(cpu, 0.0),
        process_rss_bytes=1 << 30,
        system_mem_used_bytes=2 << 30,
        system_mem_total_bytes=8 << 30,
        gpus=(_gpu(0, util=cpu / 3, power=55.0), _gpu(1, util=1.0)),
    )


class Recording:
    """An `.rrd` as Rerun's own reader gives it: the rows of each entity, in frame order."""

    def __init__(self, path: Path) -> None:
        reader = RrdReader(path)
        self.ids = [(s.application_id, s.recording_id) for s in reader.recordings()]
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for chunk in reader.stream():
            batch = chunk.to_record_batch()
            names = batch.schema.names
            columns = {n: batch.column(n) for n in names}
            for i in range(batch.num_rows):
                row: dict[str, Any] = {}
                for n, col in columns.items():
                    value = col[i]
                    # time columns: raw int64 nanoseconds / sequence numbers
                    row[n] = value.value if hasattr(value, "value") else value.as_py()
                self.rows[chunk.entity_path].append(row)
        for rows in self.rows.values():
            if rows and "frame_index" in rows[0]:
                rows.sort(key=lambda r: r["frame_index"])
            elif rows and "host_time" in rows[0]:
                rows.sort(key=lambda r: r["host_time"])

    def entity(self, path: str) -> list[dict[str, Any]]:
        return self.rows.get("/" + path, [])


def _xyxy(row: dict[str, Any]) -> np.ndarray:
    centers = np.asarray(row["Boxes2D:centers"], np.float64).reshape(-1, 2)
    half = np.asarray(row["Boxes2D:half_sizes"], np.float64).reshape(-1, 2)
    return np.hstack([centers - half, centers + half])


@pytest.fixture
def saved(tmp_path: Path) -> Iterator[Callable[..., RerunSink]]:
    made: list[RerunSink] = []

    def make(path: Path | None = None, cameras: Sequence[str] = CAMERAS) -> RerunSink:
        target = RerunTarget("save", path=path or tmp_path / "run.rrd")
        sink = RerunSink(target, cameras=cameras, recording_name="test run")
        made.append(sink)
        return sink

    yield make
    for sink in made:
        sink.close()


# --- the acceptance: a saved recording holds every camera's images and boxes -----------------


def test_a_saved_recording_holds_every_cameras_images_and_boxes(
    tmp_path: Path, saved: Callable[..., RerunSink]
) -> None:
    # given a sink saving to a .rrd, fed as a replay feeds it: 3 cameras x 5 frames with
    # images, frame 2 without boxes, frame 4 without its image (images not kept)
    path = tmp_path / "runs" / "r1" / "run.rrd"  # missing folders are made
    sink = saved(path)
    assert isinstance(sink, ImageSink)
    written: dict[tuple[str, int], FrameResult] = {}
    for frame in range(5):
        for camera in CAMERAS:
            result = _result(camera, frame, boxes=0 if frame == 2 else 1 + frame % 3)
            written[camera, frame] = result
            if frame == 4:
                sink.write(result)
            else:
                sink.write_with_image(result, _image(camera))
    sink.close()

    # when Rerun's own reader loads it
    recording = Recording(path)

    # then it is one recording of our application, with every camera's images and boxes
    assert [app for app, _ in recording.ids] == ["drivepercept"]
    assert sink.frames_written == 15 and sink.images_written == 12
    for camera in CAMERAS:
        base = camera_path(camera)
        images = recording.entity(f"{base}/image")
        boxes = recording.entity(f"{base}/image/boxes")
        latency = recording.entity(f"{base}/latency_ms")
        assert [r["frame_index"] for r in images] == [0, 1, 2, 3]
        assert [r["frame_index"] for r in boxes] == [0, 1, 2, 3, 4]
        assert [r["frame_index"] for r in latency] == [0, 1, 2, 3, 4]
        for row in images:
            # a JPEG of the camera's own colour
            assert row["EncodedImage:media_type"] == ["image/jpeg"]
            jpeg = np.frombuffer(bytes(row["EncodedImage:blob"][0]), np.uint8)
            decoded = cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
            assert decoded is not None and decoded.shape == (H, W, 3)
            mean = decoded.reshape(-1, 3).mean(axis=0)
            assert np.abs(mean - np.array(COLOURS[camera])).max() < 8
        for row in boxes:
            result = written[camera, row["frame_index"]]
            det = result.detections
            # the boxes written, xyxy in original pixels, labels and class ids
            np.testing.assert_allclose(_xyxy(row), det.xyxy, atol=1e-4)
            assert row["Boxes2D:class_ids"] == det.labels.tolist()
            assert row["Boxes2D:labels"] == [
                f"{n} {s:.2f}" for n, s in zip(det.names, det.scores.tolist(), strict=True)
            ]
            # on the timelines: pts and host time (ns), frame index
            assert row["pts"] == round(result.pts_s * 1e9)
        assert len(_xyxy(boxes[2])) == 0  # frame 2 cleared its boxes
        for row in latency:
            result = written[camera, row["frame_index"]]
            assert row["Scalars:scalars"] == pytest.approx([result.timing.end_to_end_ms])
    # host time: the capture times' differences, on one clock for every camera
    front = recording.entity(f"{camera_path('front')}/image/boxes")
    steps = np.diff([r["host_time"] for r in front])
    assert steps.tolist() == [50_000_000] * 4
    # the class names once, for every camera below "cameras"
    (context,) = recording.entity("cameras")
    assert "AnnotationContext:context" in context


def test_a_predicted_frame_is_labelled_so_and_drawn_thinner(
    tmp_path: Path, saved: Callable[..., RerunSink]
) -> None:
    # given a detected frame, then one the model did not see (the tracker's boxes)
    path = tmp_path / "run.rrd"
    sink = saved(path)
    detected = _result("front", 0)
    guess = _result("front", 1)
    guess = dataclasses.replace(
        guess, detections=dataclasses.replace(guess.detections, predicted=True)
    )
    sink.write(detected)
    sink.write(guess)
    sink.close()
    # then the predicted frame's labels say so and its boxes are thinner; the other's not
    rows = Recording(path).entity(f"{camera_path('front')}/image/boxes")
    assert [r["frame_index"] for r in rows] == [0, 1]
    names = guess.detections.names
    assert rows[1]["Boxes2D:labels"] == [
        f"{n} {s:.2f} predicted"
        for n, s in zip(names, guess.detections.scores.tolist(), strict=True)
    ]
    assert rows[1]["Boxes2D:radii"] == pytest.approx([0.5])
    assert not any("predicted" in label for label in rows[0]["Boxes2D:labels"])
    assert rows[0].get("Boxes2D:radii") in (None, [])


def test_the_recording_name_and_layout_reach_the_file(
    tmp_path: Path, saved: Callable[..., RerunSink]
) -> None:
    sink = saved()
    sink.write(_result("front", 0))
    sink.close()
    reader = RrdReader(tmp_path / "run.rrd")
    # the default layout travels as a blueprint store beside the recording
    assert len(reader.blueprints()) == 1
    properties = Recording(tmp_path / "run.rrd").rows["/__properties"]
    assert any("test run" in json.dumps(row, default=str) for row in properties)


# --- load samples, from the sampler's thread --------------------------------------------------


def test_load_samples_from_another_thread_land_on_the_host_timeline(
    tmp_path: Path, saved: Callable[..., RerunSink]
) -> None:
    # given a sink whose frames come from this thread and load samples from a `gpu-monitor`
    sink = saved()
    load = sink.load_sink
    assert isinstance(load, LoadSink)
    origin = time.monotonic_ns()
    samples = [_load(origin + k * 100_000_000, 10.0 * k) for k in range(20)]

    def sampler() -> None:
        for s in samples:
            load.write(s)

    thread = threading.Thread(target=sampler, name="gpu-monitor")
    thread.start()
    for frame in range(10):
        for camera in CAMERAS:
            sink.write_with_image(_result(camera, frame), _image(camera))
    thread.join(timeout=30)
    assert not thread.is_alive()
    load.close()
    load.write(_load(origin + 10**10, 99.0))  # after the load face's close: ignored
    load.close()
    sink.close()

    recording = Recording(tmp_path / "run.rrd")
    assert sink.load_samples_written == 20
    cpu = recording.entity("load/cpu/process_pct")
    assert [r["Scalars:scalars"][0] for r in cpu] == [10.0 * k for k in range(20)]
    # on the host timeline only: no frame's index or pts leaked from the other thread
    assert all("frame_index" not in r and "pts" not in r for r in cpu)
    start = cpu[0]["host_time"]
    assert [r["host_time"] - start for r in cpu] == [k * 100_000_000 for k in range(20)]
    assert len(recording.entity("load/cpu/system_pct")) == 20
    gpu0 = recording.entity("load/gpu0/util_pct")
    assert [r["Scalars:scalars"][0] for r in gpu0] == pytest.approx(
        [10.0 * k / 3 for k in range(20)]
    )
    assert [r["Scalars:scalars"][0] for r in recording.entity("load/gpu0/memory_used_mb")] == (
        [512.0] * 20
    )
    assert len(recording.entity("load/gpu0/power_w")) == 20
    # what a GPU does not report (NaN) is left out, not plotted as a value
    assert recording.entity("load/gpu1/power_w") == []
    assert len(recording.entity("load/gpu1/util_pct")) == 20
    # and the frames all arrived beside them
    for camera in CAMERAS:
        assert len(recording.entity(f"{camera_path(camera)}/image")) == 10


def test_through_a_slow_sink_set_every_frame_reaches_the_file(tmp_path: Path) -> None:
    # given the sink as the run wires it: slow, on its own thread (replay: block when full)
    sink = RerunSink(RerunTarget("save", path=tmp_path / "run.rrd"), cameras=CAMERAS)
    sinks = SinkSet()
    sinks.add(
        sink, SinkPolicy(slow=True, queue_batches=2, when_full=DropPolicy.BLOCK), name="rerun"
    )
    sinks.start()
    try:
        for frame in range(30):
            batch = [_result(c, frame) for c in CAMERAS]
            assert sinks.dispatch(batch)
    finally:
        sinks.close()
    assert [t.name for t in threading.enumerate() if t.name == "sink-rerun"] == []
    report = sinks.report()["rerun"]
    assert report.frames_written == 90 and report.frames_dropped == 0 and report.failed is None
    sink.close()  # closed by the set already: a second close does nothing
    recording = Recording(tmp_path / "run.rrd")
    for camera in CAMERAS:
        assert len(recording.entity(f"{camera_path(camera)}/image/boxes")) == 30


# --- closing ----------------------------------------------------------------------------------


def test_close_twice_is_fine_and_later_writes_are_dropped(
    tmp_path: Path, saved: Callable[..., RerunSink]
) -> None:
    sink = saved()
    sink.write_with_image(_result("front", 0), _image("front"))
    with sink:
        pass  # the context manager closes it
    sink.close()
    sink.write_with_image(_result("front", 1), _image("front"))
    sink.write(_result("front", 2))
    sink.load_sink.write(_load(time.monotonic_ns(), 5.0))
    sink.load_sink.close()
    assert sink.frames_written == 1 and sink.load_samples_written == 0
    recording = Recording(tmp_path / "run.rrd")
    assert len(recording.entity(f"{camera_path('front')}/image")) == 1


@pytest.mark.slow  # 6-17 s
def test_close_while_the_sampler_writes_finishes(
    tmp_path: Path, saved: Callable[..., RerunSink]
) -> None:
    sink = saved()
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            sink.load_sink.write(_load(time.monotonic_ns(), 1.0))

    thread = threading.Thread(target=sampler, name="gpu-monitor", daemon=True)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    sink.close()
    took = time.monotonic() - started
    # then close returned within its own bound (6 s alone, 17 s in a busy suite: the flush of
    # what the writer queued), nothing is written after it, and nothing before it was lost
    print(f"close while the sampler writes: {took:.1f} s")
    assert took < rerun_sink.CLOSE_TIMEOUT_S + 5.0
    written = sink.load_samples_written
    time.sleep(0.1)
    assert sink.load_samples_written == written  # nothing after close
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(Recording(tmp_path / "run.rrd").entity("load/cpu/process_pct")) == written


# --- what a user can get wrong ----------------------------------------------------------------


def test_without_the_rerun_sdk_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "rerun", None)  # `import rerun` raises ImportError
    with pytest.raises(ConfigError) as caught:
        RerunSink(RerunTarget("save", path=tmp_path / "run.rrd"), cameras=CAMERAS)
    message = str(caught.value)
    assert "pip install 'drivepercept[viz]'" in message and "\n" not in message
    assert not (tmp_path / "run.rrd").exists()


@pytest.mark.parametrize("blocker", ["file", "unwritable"])
def test_a_save_path_that_cannot_be_created_is_an_output_error(
    tmp_path: Path, blocker: str
) -> None:
    if blocker == "file":
        # the folder is a file: no one can create it, root included
        (tmp_path / "taken").write_text("x")
        path = tmp_path / "taken" / "run.rrd"
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        if os.access(folder, os.W_OK):  # root writes anywhere
            folder.chmod(0o700)
            pytest.skip("running as root: a read-only folder is still writable")
        path = folder / "run.rrd"
    with pytest.raises(OutputError) as caught:
        RerunSink(RerunTarget("save", path=path), cameras=CAMERAS)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"kind": "save"}, "needs a path"),
        ({"kind": "spawn", "path": Path("x.rrd")}, "needs a path, and only it"),
        ({"kind": "connect", "address": "http://127.0.0.1:9876"}, "gRPC URL"),
        ({"kind": "save", "path": Path("x.rrd"), "address": "rerun+http://h:1/proxy"}, "address"),
        ({"kind": "serve", "web_port": 70000}, "1..65535"),
        ({"kind": "show"}, "spawn, connect, save or serve"),
    ],
)
def test_a_bad_target_is_a_config_error(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        RerunTarget(**kwargs)


def test_connect_without_a_viewer_is_an_output_error_at_once() -> None:
    # given nothing listening: said now (Rerun would buffer, then block the sink)
    address = f"rerun+http://127.0.0.1:{_free_port()}/proxy"
    started = time.monotonic()
    with pytest.raises(OutputError, match="no Rerun viewer or server answers at") as caught:
        RerunSink(RerunTarget("connect", address=address), cameras=CAMERAS)
    assert time.monotonic() - started < 5
    assert address in str(caught.value) and "\n" not in str(caught.value)


def test_connect_streams_to_a_running_server() -> None:
    # given a Rerun gRPC server on this machine (what `rerun --serve-grpc` runs)
    port = _free_port()
    server = rr.RecordingStream("server")
    server.set_sinks(rr.GrpcServerSink(bind_ip="127.0.0.1", port=port))
    try:
        sink = RerunSink(
            RerunTarget("connect", address=f"rerun+http://127.0.0.1:{port}/proxy"),
            cameras=CAMERAS,
        )
        for frame in range(5):
            for camera in CAMERAS:
                sink.write_with_image(_result(camera, frame), _image(camera))
        started = time.monotonic()
        sink.close()
        # then everything was taken at once: close waited for no missing viewer
        assert time.monotonic() - started < 3
        assert sink.frames_written == 15
    finally:
        server.disconnect()


def test_serve_on_a_taken_port_is_an_output_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        target = RerunTarget("serve", grpc_port=port, web_port=_free_port())
        with pytest.raises(OutputError, match=f"cannot serve Rerun on ports {port}"):
            RerunSink(target, cameras=CAMERAS)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_close_gives_up_on_a_viewer_that_stopped_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a "viewer" that accepted the connection and never reads (hung): Rerun buffers
    # ~300 MB, then blocks the writing thread, and its own flush and disconnect never return
    import drivepercept.sinks.rerun as module

    monkeypatch.setattr(module, "CLOSE_TIMEOUT_S", 3.0)
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        address = f"rerun+http://127.0.0.1:{hole.getsockname()[1]}/proxy"
        sink = RerunSink(RerunTarget("connect", address=address), cameras=["front"])
        noise = np.random.default_rng(0).integers(0, 255, (720, 1280, 3)).astype(np.uint8)
        done = [0]

        def writer() -> None:  # the sink's own thread, as the slow-output policy runs it
            for frame in range(2000):
                sink.write_with_image(_result("front", frame % 5), noise)
                done[0] = frame + 1

        thread = threading.Thread(target=writer, name="sink-rerun", daemon=True)
        thread.start()
        before = -1
        while done[0] != before:  # until the writes stop moving
            before = done[0]
            time.sleep(2.0)
        assert done[0] < 2000, "Rerun took everything: no back-pressure to test"
        # when the pipeline closes the sink
        started = time.monotonic()
        sink.close()
        # then close returns at its deadline, and nothing more is counted as written
        assert time.monotonic() - started < 3.0 + 2.0
        written = sink.frames_written
        time.sleep(0.5)
        assert sink.frames_written == written
    # and once the connection ends, the blocked write returns and the writer finishes
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert sink.frames_written == written


@pytest.mark.slow  # waits out the viewer that cannot start (16 s)
@pytest.mark.skipif(
    bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")),
    reason="a display is there: the viewer would open a window",
)
def test_spawn_without_a_display_is_an_output_error() -> None:
    # the wheel's viewer starts and dies at once with no display; Rerun's spawn returns anyway
    with pytest.raises(OutputError, match="did not start"):
        RerunSink(RerunTarget("spawn", grpc_port=_free_port()), cameras=CAMERAS)


# --- the web viewer, in Debian's headless Chromium --------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# a process serving a recording (the web viewer lives as long as its process): magenta
# frames with a box, then it waits for its stdin to close
_SERVE = """
import sys, numpy as np
from drivepercept.sinks.rerun import RerunSink, RerunTarget
sys.path.insert(0, sys.argv[3])
from test_rerun_sink import _result
sink = RerunSink(
    RerunTarget("serve", grpc_port=int(sys.argv[1]), web_port=int(sys.argv[2])),
    cameras=["front"],
)
image = np.zeros((360, 640, 3), np.uint8)
image[:] = (255, 0, 255)
for frame in range(5):
    sink.write_with_image(_result("front", frame), image)
sink.recording.flush(timeout_sec=10)
print(sink.viewer_url, flush=True)
sys.stdin.read()
sink.close()
"""


class Chromium:
    """Debian's headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4,
    `--remote-debugging-pipe`): no websocket client needed, no port opened."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        commands_r, commands_w = os.pipe()
        replies_r, replies_w = os.pipe()

        def wire() -> None:  # in the child: its fd 3 reads our commands, fd 4 writes replies
            a, b = os.dup(commands_r), os.dup(replies_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--window-size=1280,800",
                "--remote-debugging-pipe",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            preexec_fn=wire,  # the test thread is the only one forking here
        )
        os.close(commands_r)
        os.close(replies_w)
        self._out = commands_w
        self._in = replies_r
        self._pending = b""
        self._id = 0
        self.session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._pending:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed its DevTools pipe")
                self._pending += chunk
            raw, self._pending = self._pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", {"url": url})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]

    def evaluate(self, expression: str) -> Any:
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return reply["result"].get("value")

    def screenshot(self) -> ImageU8:
        data = base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"])
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert image is not None
        return np.asarray(image, np.uint8)

    def close(self) -> None:
        for fd in (self._out, self._in):
            os.close(fd)
        self.proc.kill()
        self.proc.wait(timeout=10)


def _magenta_share(image: ImageU8) -> float:
    b, g, r = (image[..., k].astype(int) for k in range(3))
    return float(((b > 200) & (r > 200) & (g < 60)).mean())


@pytest.mark.desktop
@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_the_served_web_viewer_shows_the_stream_in_headless_chromium(tmp_path: Path) -> None:
    # given a process streaming magenta frames to a gRPC server and serving Rerun's web
    # viewer from the wheel (no network: everything is on 127.0.0.1)
    grpc_port, web_port = _free_port(), _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(grpc_port), str(web_port), str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    browser: Chromium | None = None
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith(f"http://127.0.0.1:{web_port}/?url=rerun%2Bhttp"), url
        # when headless Chromium opens the viewer's page
        browser = Chromium(tmp_path / "profile")
        browser.open(url)
        state = ""
        share = 0.0
        shot = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = str(
                browser.evaluate(
                    "(document.getElementById('the_canvas_id') || {className: 'gone'}).className"
                    " + '|' + document.getElementById('center_text')?.innerText"
                )
            )
            assert "crashed" not in state, state
            if state.startswith("visible"):
                shot = browser.screenshot()
                share = _magenta_share(shot)
                if share > 0.05:
                    break
            time.sleep(1.0)
        # then the viewer's wasm app started (its canvas shown) and drew the camera's frames
        assert state.startswith("visible"), f"the viewer did not start: {state!r}"
        assert shot is not None
        keep = os.environ.get("DRIVEPERCEPT_KEEP_SCREENSHOT")
        if keep:
            cv2.imwrite(keep, shot)
        assert share > 0.05, f"no frame drawn: {share:.3f} of the page is the frames' magenta"
    finally:
        if browser is not None:
            browser.close()
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
