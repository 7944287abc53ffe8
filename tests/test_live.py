"""Live sources: reconnect with backoff, states and downtime, real-time pacing; a live rig
in which one camera dies while the others carry on."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from fakereaders import FakeReader

from drivepercept.config import PipelineConfig, ReconnectPolicy
from drivepercept.errors import ConfigError
from drivepercept.models.oracle import make_oracle
from drivepercept.pipeline import JOIN_TIMEOUT_S, Pipeline
from drivepercept.rig import is_device, is_stream
from drivepercept.sources.live import LiveSource, totals
from drivepercept.sources.readers import FrameReader, SourceError, StateChange
from drivepercept.types import CameraState

pytestmark = pytest.mark.timeout(60)

FAST = ReconnectPolicy(initial_s=0.01, max_s=0.04, max_attempts=4)


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_backoff_doubles_up_to_the_cap() -> None:
    policy = ReconnectPolicy(initial_s=0.25, max_s=4.0)
    assert [policy.delay_s(k) for k in range(1, 8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    with pytest.raises(ConfigError, match="max_s"):
        ReconnectPolicy(initial_s=2.0, max_s=1.0)
    with pytest.raises(ConfigError, match="max_attempts"):
        ReconnectPolicy(max_attempts=-1)


def test_source_kinds() -> None:
    assert is_stream("rtsp://cam/1") and is_stream("HTTP://x/y.mjpg") and is_stream("udp://@:5000")
    assert is_device("0") and is_device("/dev/video2")
    assert not is_stream("front.mp4") and not is_device("front.mp4")


class Script:
    """An opener that plays a script: each entry is a number of frames to deliver before the
    stream drops, or an exception for a failed connection attempt."""

    def __init__(self, *steps: int | Exception) -> None:
        self.steps = list(steps)
        self.attempts = 0

    def __call__(self, source: str, policy: ReconnectPolicy) -> FrameReader:
        self.attempts += 1
        step = self.steps.pop(0) if self.steps else SourceError("connection refused")
        if isinstance(step, Exception):
            raise step
        return FakeReader(frames=step)


def _states(source: LiveSource) -> list[str]:
    return [c.state.value for c in source.changes()]


def test_a_stream_that_drops_reconnects_and_then_fails_for_good(stop: threading.Event) -> None:
    # given a stream that refuses once, streams 3 frames, drops, comes back for 2, then is gone
    script = Script(SourceError("refused"), 3, 2)
    source = LiveSource(camera="cam", source="rtsp://cam/1", policy=FAST, stop=stop, opener=script)
    # when it is read to the end
    frames = 0
    while source.read() is not None:
        frames += 1
    # then every frame came through, the camera reconnected, and gave up after 4 attempts
    assert frames == 5
    assert source.connects == 2
    assert source.state == CameraState.FAILED
    states = _states(source)
    assert states[:4] == ["connecting", "reconnecting", "streaming", "reconnecting"]
    assert states.count("streaming") == 2
    assert states[-1] == "failed"
    assert "gave up after 4 failed attempts: connection refused" in source.changes()[-1].detail
    assert script.attempts == 1 + 1 + 1 + 4
    assert source.failed_attempts == 5
    now = time.monotonic_ns()
    down, outage, streaming = source.totals_s(now)
    assert down > outage > 0 and streaming > 0
    # the running totals agree with the pure fold over the kept changes
    assert (down, outage, streaming) == totals(source.changes(), now).seconds


def test_a_stream_that_connects_but_never_delivers_backs_off_and_fails(
    stop: threading.Event,
) -> None:
    # given a server that accepts every connection and sends nothing
    script = Script(*([0] * 100))
    policy = ReconnectPolicy(initial_s=0.02, max_s=0.08, max_attempts=4)
    source = LiveSource(camera="cam", source="rtsp://mute", policy=policy, stop=stop, opener=script)
    t0 = time.monotonic()
    # when it is read
    assert source.read() is None
    # then it backed off between attempts (0.02 + 0.04 + 0.08 s) and gave up after 4
    assert time.monotonic() - t0 >= 0.14
    assert script.attempts == 4
    assert source.state == CameraState.FAILED
    assert "no frame arrived" in source.changes()[-1].detail
    assert len(source.changes()) < 20


def test_stop_interrupts_a_reconnect_wait(stop: threading.Event) -> None:
    slow = ReconnectPolicy(initial_s=30.0, max_s=30.0, max_attempts=0)
    source = LiveSource(
        camera="cam", source="rtsp://x", policy=slow, stop=stop, opener=Script(SourceError("no"))
    )
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    assert source.read() is None
    assert time.monotonic() - t0 < 2.0
    source.close()
    assert source.state == CameraState.ENDED


def test_stop_abandons_a_connection_attempt_in_progress(stop: threading.Event) -> None:
    # given an open that takes 3 s (FFmpeg waiting out its open timeout on a dead server)
    late = FakeReader(frames=5)

    def slow_open(source: str, policy: ReconnectPolicy) -> FrameReader:
        time.sleep(3.0)
        return late

    source = LiveSource(camera="cam", source="rtsp://x", policy=FAST, stop=stop, opener=slow_open)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    # then a stop during the attempt returns at once: the attempt is abandoned, not waited for
    assert source.read() is None
    assert time.monotonic() - t0 < 0.6
    source.close()
    assert source.state == CameraState.ENDED
    # and the connection it made after all is given back, not leaked
    assert late.closed.wait(5.0)


def test_stop_during_a_real_ffmpeg_open_of_a_silent_server(stop: threading.Event) -> None:
    # given a server that accepts the connection and never answers (open timeout 20 s)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    policy = ReconnectPolicy(open_timeout_s=20.0, read_timeout_s=20.0)
    source = LiveSource(
        camera="mute", source=f"http://127.0.0.1:{port}/cam.mjpg", policy=policy, stop=stop
    )
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    try:
        # then the camera stops within the pipeline's join budget, not after 20 s
        assert source.read() is None
        assert time.monotonic() - t0 < 0.5 + JOIN_TIMEOUT_S
    finally:
        server.close()
    source.close()


def test_totals_of_down_outage_and_streaming_time() -> None:
    s = 1_000_000_000
    changes = [
        StateChange(0, CameraState.CONNECTING),
        StateChange(1 * s, CameraState.STREAMING),
        StateChange(5 * s, CameraState.RECONNECTING),
        StateChange(7 * s, CameraState.STREAMING),
        StateChange(9 * s, CameraState.ENDED),
    ]
    # down 0-1 and 5-7 (ended is not down); outage 5-7 (the initial connect is none);
    # streaming 1-5 and 7-9
    assert totals(changes, now_ns=20 * s).seconds == (3.0, 2.0, 6.0)
    assert totals(changes[:3], now_ns=8 * s).seconds == (4.0, 3.0, 4.0)  # reconnecting at 8 s
    assert totals(changes[:1], now_ns=20 * s).seconds == (20.0, 0.0, 0.0)  # never streamed
    assert totals([], now_ns=5).seconds == (0.0, 0.0, 0.0)


def _video(path: Path, frames: int, fps: float) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, (64, 48))
    for i in range(frames):
        writer.write(np.full((48, 64, 3), i * 10 % 255, np.uint8))
    writer.release()
    return path


def test_realtime_file_is_paced_at_its_frame_rate(tmp_path: Path, stop: threading.Event) -> None:
    clip = _video(tmp_path / "c.mp4", frames=10, fps=20.0)
    source = LiveSource(camera="c", source=str(clip), policy=FAST, stop=stop, realtime=True)
    t0 = time.monotonic()
    arrivals, due = [], []
    while (got := source.read()) is not None:
        arrivals.append(time.monotonic() - t0)
        due.append(got.arrived_ns)
    # 10 frames at 20 fps: the last falls due 0.45 s after the first
    assert len(arrivals) == 10
    assert 0.4 <= arrivals[-1] - arrivals[0] <= 0.6
    assert source.state == CameraState.ENDED
    # each frame's capture time is when it fell due: 50 ms apart
    assert all(45e6 <= b - a <= 55e6 for a, b in itertools.pairwise(due))


def test_a_missing_file_is_an_error_at_once(tmp_path: Path, stop: threading.Event) -> None:
    with pytest.raises(SourceError, match="not found"):
        LiveSource(camera="c", source=str(tmp_path / "nope.mp4"), policy=FAST, stop=stop)


def test_live_rig_carries_on_when_one_camera_fails_for_good() -> None:
    # given three live cameras of which one never connects
    capture_stop = threading.Event()
    good = [
        LiveSource(
            camera=f"ok{i}",
            source=f"rtsp://ok/{i}",
            policy=FAST,
            stop=capture_stop,
            opener=Script(20),
        )
        for i in range(2)
    ]
    bad = LiveSource(
        camera="bad", source="rtsp://bad", policy=FAST, stop=capture_stop, opener=Script()
    )
    cameras = [("ok0", good[0]), ("bad", bad), ("ok1", good[1])]
    config = PipelineConfig(
        device="cpu", drop_policy="block", batch_timeout_ms=5.0, max_in_flight=1, ring_slots=1
    )
    with Pipeline(
        cameras=cameras,
        detector=make_oracle(size=(64, 64), boxes=[]),
        config=config,
        capture_stop=capture_stop,
    ) as pipeline:
        stats = pipeline.run()
    # then the good cameras delivered every frame and the bad one is failed
    assert [c.frames for c in stats.cameras] == [20, 0, 20]
    assert bad.state == CameraState.FAILED
    # (the good ones' streams ended after 20 frames and they went on trying: failed too)
    assert all(g.connects == 1 for g in good)


def test_the_pace_clock_keeps_one_origin_per_recording() -> None:
    from drivepercept.sources.pacing import PaceClock

    # given a recording's two topics (stamps near 1.77e18 ns) and a video file (pts from 0)
    clock = PaceClock()
    stamp = 1_770_000_000_000_000_000
    # when the recording's first frame is read at t=1 s, the video's at t=5 s
    assert clock.due_ns("drive.mcap", stamp, 1_000_000_000) == 1_000_000_000
    assert clock.due_ns("front.mp4", 0, 5_000_000_000) == 5_000_000_000
    # then the recording's other topic plays in step with the first, by its stamps
    assert clock.due_ns("drive.mcap", stamp + 50_000_000, 9_000_000_000) == 1_050_000_000
    # and the video keeps its own origin, not the recording's (nor the reverse)
    assert clock.due_ns("front.mp4", 40_000_000, 9_000_000_000) == 5_040_000_000
