"""MJPEG over HTTP read without decoding, and the live path that decodes and prepares only
the frames it uses: counts, equality with eager preparation, a corrupt frame, fallback."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from fakereaders import FakeReader
from fakesinks import Collect
from hostile import jpeg

from drivepercept.config import PipelineConfig, ReconnectPolicy
from drivepercept.models.oracle import make_oracle
from drivepercept.pipeline import Pipeline
from drivepercept.sim.serve import CameraServer
from drivepercept.sources.capture import CaptureReader, open_live_reader
from drivepercept.sources.mjpeg import MjpegReader, NotMjpegError
from drivepercept.sources.prepare import prepare, prepare_into
from drivepercept.sources.readers import RawFrame, SourceError
from drivepercept.types import FrameResult, InputSpec

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_videos"
POLICY = ReconnectPolicy(open_timeout_s=5.0, read_timeout_s=2.0)

pytestmark = pytest.mark.timeout(60)


class _Parts(BaseHTTPRequestHandler):
    """/plain: three JPEG parts without Content-Length, then the final boundary; /page: HTML;
    /secret: 401 unless Basic admin:pw."""

    def do_GET(self) -> None:
        if self.path == "/page":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html></html>")
            return
        if self.path == "/secret" and self.headers.get("Authorization") != "Basic YWRtaW46cHc=":
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=xyz")
        self.end_headers()
        for value in (10, 120, 240):
            self.wfile.write(
                b"--xyz\r\nContent-Type: image/jpeg\r\n\r\n" + jpeg(value=value) + b"\r\n"
            )
        self.wfile.write(b"--xyz--\r\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def parts_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Parts)
    threading.Thread(target=server.serve_forever, name="test-mjpeg", daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_frames_come_encoded_and_decode_on_first_use() -> None:
    with CameraServer([("front", SAMPLE / "front.mp4")], fps=30.0) as srv:
        reader = MjpegReader(srv.url("front"), policy=POLICY)
        try:
            assert (reader.info.width, reader.info.height) == (640, 360)
            frames = [reader.read() for _ in range(10)]
        finally:
            reader.close()
    got = [f for f in frames if f is not None]
    assert len(got) == 10
    later = got[-1]
    assert not later.decoded and later.jpeg and later.jpeg.startswith(b"\xff\xd8")
    assert later.checked  # held to the frame limit as it was read: not again when decoded
    assert later.image_bgr.shape == (360, 640, 3) and later.decoded
    arrivals = [f.arrived_ns for f in got]
    assert arrivals == sorted(arrivals)  # stamped as they arrive


def test_parts_without_content_length_and_the_final_boundary(parts_url: str) -> None:
    reader = MjpegReader(f"{parts_url}/plain", policy=POLICY)
    values = []
    while (frame := reader.read()) is not None:
        values.append(int(frame.image_bgr[0, 0, 0]))
    reader.close()
    assert [round(v, -1) for v in values] == [10, 120, 240]  # JPEG is lossy by a little


def test_basic_credentials_from_the_url_and_http_errors(parts_url: str) -> None:
    host = parts_url.removeprefix("http://")
    reader = MjpegReader(f"http://admin:pw@{host}/secret", policy=POLICY)
    assert reader.info.width == 64
    reader.close()
    with pytest.raises(SourceError, match="HTTP 401 Unauthorized"):
        MjpegReader(f"http://admin:wrong@{host}/secret", policy=POLICY)


def test_anything_else_falls_back_to_opencv(parts_url: str) -> None:
    with pytest.raises(NotMjpegError, match="not an MJPEG stream"):
        MjpegReader(f"{parts_url}/page", policy=POLICY)
    # open_live_reader then lets OpenCV try, and OpenCV's failure is the answer
    with pytest.raises(SourceError, match="cannot open"):
        open_live_reader(f"{parts_url}/page", POLICY)


def test_a_served_camera_is_read_as_mjpeg() -> None:
    with CameraServer([("front", SAMPLE / "front.mp4")], fps=30.0) as srv:
        reader = open_live_reader(srv.url("front"), POLICY)
        reader.close()
    assert isinstance(reader, MjpegReader) and not isinstance(reader, CaptureReader)


@pytest.mark.parametrize(
    "spec",
    [
        InputSpec((416, 256)),
        InputSpec((320, 320), letterbox=False),
        InputSpec((160, 96), letterbox=True),
    ],
    ids=["default", "stretch", "small"],
)
def test_prepare_into_a_row_equals_prepare(spec: InputSpec) -> None:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (360, 640, 3), dtype=np.uint8)
    want, box = prepare(image, spec)
    row = np.full((spec.size[1], spec.size[0], 3), 7, np.uint8)  # stale bytes of a used slot
    assert prepare_into(image, spec, row) == box
    assert np.array_equal(row, want)


class _Encoded(FakeReader):
    """FakeReader frames handed over as JPEG bytes (as MjpegReader does); frame `corrupt`
    is not a JPEG at all."""

    def __init__(self, corrupt: int | None = None, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.corrupt = corrupt

    def read(self) -> RawFrame | None:
        got = super().read()
        if got is None:
            return None
        index = self.index - 1
        data = b"not a jpeg" if index == self.corrupt else jpeg(value=index % 256)
        return RawFrame(None, got.pts_s, got.arrived_ns, jpeg=data)


def _live(cameras: list[tuple[str, FakeReader]], sink: Collect) -> Pipeline:
    config = PipelineConfig(
        device="cpu", drop_policy="drop_oldest", queue_capacity=1, sample_hz=0.0
    )
    return Pipeline(
        cameras=cameras,
        detector=make_oracle(size=(64, 64), boxes=[[0.0, 0.0, 64.0, 64.0]]),
        config=config,
        sinks=[sink],
    )


def test_live_decodes_and_prepares_only_the_frames_it_uses() -> None:
    # given two cameras faster than a slow consumer, their frames handed over encoded
    class Slow(Collect):
        def write(self, result: FrameResult) -> None:
            time.sleep(0.01)
            super().write(result)

    sink = Slow()
    cams: list[tuple[str, FakeReader]] = [(f"c{k}", _Encoded(frames=200)) for k in range(2)]
    with _live(cams, sink) as pipeline:
        stats = pipeline.run()
        snaps = pipeline.cameras()
    for cam, snap in zip(stats.cameras, snaps, strict=True):
        # then every frame was read, many dropped, and only the used ones decoded and prepared
        assert cam.read == 200 and cam.dropped > 50, cam
        assert cam.decoded == cam.prepared == cam.frames == snap.prepared, cam
        assert cam.frames + cam.dropped + cam.discarded == cam.read
    # and what was used is each frame's own content, boxes in its own pixels
    for result in sink.results:
        assert result.meta.letterbox.src_size == (64, 48)
        assert result.detections.xyxy.max() == pytest.approx(64.0)


def test_a_corrupt_frame_is_left_out_and_the_camera_goes_on() -> None:
    sink = Collect()
    with _live([("c", _Encoded(corrupt=3, frames=8, pace_s=0.02))], sink) as pipeline:
        stats = pipeline.run()
    assert pipeline.batcher.prep.failed_frames == 1
    assert 3 not in [r.frame_index for r in sink.results]
    assert stats.frames == len(sink.results) >= 6
    # and the batcher's count is the camera's undecodable frame (run.json, the verdict)
    assert stats.cameras[0].undecodable == 1


def _sleepy_live_run(*, frames: int, in_flight: int) -> list[FrameResult]:
    """One 100 fps camera (frames encoded) in live's settings, through a model that takes
    0.2 s a batch (warmed up, the default): its results."""
    import torch

    from drivepercept.models.base import Detector

    class Sleepy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
            time.sleep(0.2)
            empty = {"boxes": torch.zeros((0, 4)), "scores": torch.zeros(0)}
            return [{**empty, "labels": torch.zeros(0, dtype=torch.long)} for _ in x]

    config = PipelineConfig(
        device="cpu",
        drop_policy="drop_oldest",
        queue_capacity=1,
        max_in_flight=in_flight,
        ring_slots=in_flight + 1,  # live's: the slots in flight, one for the next batch
        sample_hz=0.0,
    )
    sink = Collect()
    with Pipeline(
        cameras=[("c", _Encoded(frames=frames, pace_s=0.01))],
        detector=Detector("sleepy", Sleepy(), InputSpec((64, 64)), ("a",)),
        config=config,
        sinks=[sink],
    ) as pipeline:
        pipeline.run()
    return sink.results


def test_live_batches_are_made_just_in_time_for_the_engine() -> None:
    # given a 100 fps camera and a model that takes 0.2 s a batch, one batch in flight
    results = _sleepy_live_run(frames=250, in_flight=1)
    later = results[5:]  # once the compute and preparation times are learnt
    age_ms = sorted((r.timing.compute_start_ns - r.timing.capture_ns) / 1e6 for r in later)
    gap_ms = sorted(
        (b.timing.compute_start_ns - a.timing.inference_done_ns) / 1e6
        for a, b in itertools.pairwise(later)
    )
    # then a frame is taken just before the engine is free: it is young when its compute
    # starts, not a whole inference (200 ms) old; and the engine does not wait for it
    assert age_ms[len(age_ms) // 2] < 80.0, age_ms
    assert gap_ms[len(gap_ms) // 2] < 30.0, gap_ms


def test_the_first_live_batches_are_made_just_in_time_too() -> None:
    # given the same with live's own two batches in flight (a batch made at once could wait
    # behind two)
    results = _sleepy_live_run(frames=80, in_flight=2)
    # then the batches that follow the first are not made while it computes, to wait behind
    # it: the warm-up's compute is the engine's first estimate of when it will be free
    first = results[1:4]
    waited_ms = [(r.timing.compute_start_ns - r.timing.batched_ns) / 1e6 for r in first]
    assert len(first) == 3 and max(waited_ms) < 100.0, waited_ms
