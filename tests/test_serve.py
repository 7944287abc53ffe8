"""The simulated camera server: OpenCV reads its streams, pacing, clients, shutdown, errors."""

from __future__ import annotations

import http.client
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from drivepercept.sim.serve import (
    CameraServer,
    ServeError,
    _JpegLoop,
    _open_video,
    cameras_from_sources,
    serve_forever,
)

SAMPLE_RIG = Path(__file__).resolve().parents[1] / "sample_videos" / "rig.toml"
RIG_NAMES = ["front", "front_left", "front_right", "back", "back_left", "back_right"]
SIZE = (160, 96)  # (width, height): even, as mp4v needs
LEVEL_STEP = 25  # frame i is a flat grey of i * LEVEL_STEP, so a client can tell frames apart
PART = b"Content-Type: image/jpeg"  # one per multipart part
# Noise frames of this size are ~280 KB as JPEG q95: at 20 fps a client that reads nothing fills
# the socket buffers (Linux default: at most 4 MB to send, plus the receive window) in under 1 s.
NOISE_SIZE = (640, 384)


pytestmark = pytest.mark.integration


def make_video(
    path: Path,
    *,
    frames: int = 10,
    fps: float = 20.0,
    size: tuple[int, int] = SIZE,
    noise: bool = False,
) -> Path:
    """Write a small MP4: flat grey frames numbered by their level, or incompressible noise."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, size)
    assert writer.isOpened()
    rng = np.random.default_rng(0)
    for i in range(frames):
        shape = (size[1], size[0], 3)
        frame = (
            rng.integers(0, 256, shape, np.uint8)
            if noise
            else np.full(shape, i * LEVEL_STEP, np.uint8)
        )
        writer.write(frame)
    writer.release()
    return path


def level(frame: np.ndarray) -> int:
    """The frame index a flat grey frame encodes."""
    return round(float(frame.mean()) / LEVEL_STEP)


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def raw_client(port: int, path: str, *, rcvbuf: int | None = None) -> socket.socket:
    """A bare TCP client that sent GET `path` and has read nothing yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # a small window makes the server's writes block soon
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5.0)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


def read_for(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sends within `seconds` (or until it closes)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def reset(sock: socket.socket) -> None:
    """Close abruptly: SO_LINGER 0 sends RST instead of FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def http_get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def serve_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("serve-")]


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    """Every test's server must stop and join all its threads."""
    yield
    assert serve_threads() == []


@pytest.fixture
def video(tmp_path: Path) -> Path:
    return make_video(tmp_path / "grey.mp4")


@pytest.mark.timeout(20)
def test_opencv_reads_a_live_looping_stream(video: Path) -> None:
    # given a 10-frame video served at 20 fps
    with CameraServer([("cam", video)], fps=20.0) as server:
        # when OpenCV opens the stream URL and reads 25 frames
        capture = cv2.VideoCapture(server.url("cam"))
        try:
            assert capture.isOpened()
            frames = [capture.read() for _ in range(25)]
        finally:
            capture.release()
    # then every read succeeds at the video's size, and the frames move on and loop past the end
    assert all(ok for ok, _ in frames)
    assert {frame.shape for _, frame in frames} == {(SIZE[1], SIZE[0], 3)}
    levels = [level(frame) for _, frame in frames]
    assert len(set(levels)) >= 5, levels
    assert any(b < a for a, b in itertools.pairwise(levels)), f"never looped: {levels}"


def jpeg_loop(path: Path, **budget: int) -> _JpegLoop:
    capture, first, _ = _open_video(path)
    return _JpegLoop(path, capture, first, quality=90, **budget)


def decode(jpeg: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return np.asarray(image)


def decoded_level(jpeg: bytes) -> int:
    return level(decode(jpeg))


def test_later_passes_replay_the_first_passs_jpegs(video: Path) -> None:
    # given the 10-frame video as a JPEG loop with room for all of it
    frames = jpeg_loop(video)
    # when three passes are taken
    passes = [[frames.next(None) for _ in range(10)] for _ in range(3)]
    frames.close()
    # then the first pass holds every frame in order, and later passes are its very bytes,
    # sent without decoding the file again
    assert [decoded_level(j) for j in passes[0]] == list(range(10))
    assert passes[1] == passes[0] and passes[2] == passes[0]
    assert frames.replaying


def test_a_video_over_the_budget_is_decoded_on_every_pass(video: Path) -> None:
    # given a budget smaller than the video's JPEGs
    frames = jpeg_loop(video, budget_bytes=2_000)
    # when it is looped twice
    levels = [decoded_level(frames.next(None)) for _ in range(20)]
    frames.close()
    # then it still loops frame by frame, and never replays from memory
    assert levels == list(range(10)) * 2
    assert not frames.replaying


def test_a_resized_frame_from_the_kept_pass_is_encoded_at_its_new_size(video: Path) -> None:
    # given a loop replaying its kept pass
    frames = jpeg_loop(video)
    for _ in range(10):
        frames.next(None)
    assert frames.replaying
    # when the next frame is asked for at another size, then one at the video's own
    resized, own = decode(frames.next((80, 48))), decode(frames.next(None))
    frames.close()
    # then each has its size, and the frames go on in order
    assert resized.shape == (48, 80, 3) and level(resized) == 0
    assert own.shape == (SIZE[1], SIZE[0], 3) and level(own) == 1


@pytest.mark.timeout(20)
def test_paces_at_fps_without_drift_and_loops(video: Path) -> None:
    # given a 10-frame video served at 20 fps
    with CameraServer([("cam", video)], fps=20.0) as server:
        assert server.cameras[0].fps == 20.0
        time.sleep(0.2)
        # when ~1.5 s pass
        start_s, start_frames = time.monotonic(), server.frames_published("cam")
        time.sleep(1.5)
        elapsed_s, frames = (
            time.monotonic() - start_s,
            server.frames_published("cam") - start_frames,
        )
        # then about 20 frames a second were published
        assert abs(frames - 20.0 * elapsed_s) <= 0.15 * 20.0 * elapsed_s, (frames, elapsed_s)
        # and the video keeps being served past its 10 frames
        assert server.frames_published("cam") > 25
        client = raw_client(server.port, "/cam.mjpg")
        try:
            assert read_for(client, 0.4).count(PART) >= 4
        finally:
            client.close()


@pytest.mark.timeout(20)
def test_serves_at_the_files_own_fps_by_default(tmp_path: Path) -> None:
    # given a video written at 25 fps and one served at an explicit pace
    video = make_video(tmp_path / "v25.mp4", fps=25.0)
    # when the server starts without and with fps
    with CameraServer([("a", video)]) as own, CameraServer([("a", video)], fps=7.5) as paced:
        # then each camera reports the pace it is served at
        assert own.cameras[0].fps == pytest.approx(25.0)
        assert paced.cameras[0].fps == 7.5
        assert own.cameras[0].path == video


@pytest.mark.timeout(20)
def test_several_clients_and_abrupt_disconnects(video: Path) -> None:
    with CameraServer([("cam", video)], fps=20.0) as server:
        # given two clients on one camera
        first, second = raw_client(server.port, "/cam.mjpg"), raw_client(server.port, "/cam.mjpg")
        # when both read for a while
        got = [read_for(sock, 0.5) for sock in (first, second)]
        # then both receive frames, and the server counts them
        assert all(data.count(PART) >= 5 for data in got)
        assert server.clients("cam") == 2
        assert server.frames_sent("cam") >= 10
        # when one more client reads a little and resets, and another closes without reading
        rude = raw_client(server.port, "/cam.mjpg")
        assert read_for(rude, 0.2).count(PART) >= 1
        quiet = raw_client(server.port, "/cam.mjpg")
        assert wait_until(lambda: server.clients("cam") == 4)
        reset(rude)
        quiet.close()
        # then only their handlers end; the others keep reading
        assert wait_until(lambda: server.clients("cam") == 2), server.clients("cam")
        assert read_for(first, 0.3).count(PART) >= 3
        first.close()
        second.close()
        assert wait_until(lambda: server.clients("cam") == 0)
        assert wait_until(lambda: not any(n.startswith("serve-client") for n in serve_threads()))
        # and a new client still reads frames with OpenCV
        capture = cv2.VideoCapture(server.url("cam"))
        try:
            assert capture.read()[0]
        finally:
            capture.release()


@pytest.mark.timeout(20)
def test_a_slow_client_slows_neither_the_camera_nor_other_clients(tmp_path: Path) -> None:
    # given large noisy frames and a client with a tiny window that reads nothing
    video = make_video(tmp_path / "noise.mp4", size=NOISE_SIZE, noise=True)
    with CameraServer([("cam", video)], fps=20.0, jpeg_quality=95) as server:
        slow = raw_client(server.port, "/cam.mjpg", rcvbuf=4096)
        fast = raw_client(server.port, "/cam.mjpg")
        try:
            assert wait_until(lambda: server.clients("cam") == 2)
            # when another client reads for 1.5 s
            start_s, start_frames = time.monotonic(), server.frames_published("cam")
            parts = read_for(fast, 1.5).count(PART)
            elapsed_s, frames = (
                time.monotonic() - start_s,
                server.frames_published("cam") - start_frames,
            )
            # then the camera kept its pace and the reading client got (nearly) every frame
            expected = 20.0 * elapsed_s
            assert abs(frames - expected) <= 0.15 * expected, (frames, elapsed_s)
            assert parts >= 0.8 * expected, (parts, expected)
            # and the slow client, once it reads, gets the newest frames: older ones were skipped
            assert read_for(slow, 0.5).count(PART) >= 1
            assert server.frames_skipped("cam") > 0
        finally:
            slow.close()
            fast.close()


@pytest.mark.timeout(20)
def test_index_lists_streams_and_unknown_paths_are_404(video: Path) -> None:
    with CameraServer([("left", video), ("right", video)], fps=10.0) as server:
        # when a client asks for the index, and for paths that are not streams
        status, body = http_get(server.port, "/")
        missing = [http_get(server.port, path)[0] for path in ("/nope.mjpg", "/left", "/x")]
    # then the index names every stream URL, and the rest are not found
    assert status == 200
    assert body.splitlines() == [server.url("left"), server.url("right")]
    assert server.url("left") == f"http://127.0.0.1:{server.port}/left.mjpg"
    assert missing == [404, 404, 404]


@pytest.mark.timeout(20)
def test_close_with_clients_connected_joins_everything(tmp_path: Path) -> None:
    # given a server of large frames with a reading client and a stalled one (blocked in a write)
    video = make_video(tmp_path / "noise.mp4", size=NOISE_SIZE, noise=True)
    server = CameraServer([("cam", video)], fps=20.0, jpeg_quality=95)
    server.start()
    assert set(serve_threads()) == {"serve-cam", "serve-http"}
    reading, stalled = (
        raw_client(server.port, "/cam.mjpg"),
        raw_client(server.port, "/cam.mjpg", rcvbuf=4096),
    )
    try:
        assert read_for(reading, 0.5).count(PART) >= 5
        assert server.clients("cam") == 2
        port = server.port
        # when it closes, twice
        start_s = time.monotonic()
        server.close()
        server.close()
        # then it stops quickly, every serve- thread is joined, and clients see the end
        assert time.monotonic() - start_s < 2.0
        assert serve_threads() == []
        assert wait_until(lambda: read_for(reading, 0.2) == b"")
    finally:
        reading.close()
        stalled.close()
    # and the port is free again
    with CameraServer([("cam", video)], port=port) as again:
        assert again.port == port


@pytest.mark.timeout(20)
def test_serve_forever_closes_when_stop_is_set(video: Path) -> None:
    # given a started server and a stop event set from another thread
    server = CameraServer([("cam", video)], fps=20.0)
    server.start()
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    # when serve_forever blocks on it
    start_s = time.monotonic()
    serve_forever(server, stop=stop)
    timer.join(timeout=5.0)
    # then it returns soon after the event, with the server closed
    assert 0.25 <= time.monotonic() - start_s < 2.5
    assert serve_threads() == []


def assert_one_line(error: pytest.ExceptionInfo[ServeError], *words: str) -> None:
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.timeout(20)
def test_unreadable_videos_are_refused_before_serving(tmp_path: Path, video: Path) -> None:
    # given a missing file and a text file named .mp4, each beside a good video
    fake = tmp_path / "fake.mp4"
    fake.write_text("not a video\n")
    for bad, words in (
        (tmp_path / "none.mp4", ("no file", "none.mp4")),
        (fake, ("decode", "fake.mp4")),
    ):
        server = CameraServer([("good", video), ("bad", bad)])
        # when the server starts, then it refuses with a one-line error naming the file
        with pytest.raises(ServeError) as error:
            server.start()
        assert_one_line(error, *words)
        server.close()
        assert serve_threads() == []


@pytest.mark.timeout(20)
@pytest.mark.parametrize("fps", [0.0, -5.0, float("nan")])
def test_bad_fps_is_refused(video: Path, fps: float) -> None:
    with pytest.raises(ServeError) as error:
        CameraServer([("cam", video)], fps=fps)
    assert_one_line(error, "fps", "got")


@pytest.mark.timeout(20)
def test_a_port_in_use_is_refused(video: Path) -> None:
    # given a port another socket listens on
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = CameraServer([("cam", video)], port=port)
        # when the server starts on it, then it says the port is in use
        with pytest.raises(ServeError) as error:
            server.start()
        assert_one_line(error, "already in use", str(port))
        server.close()


@pytest.mark.timeout(20)
def test_bad_names_and_unknown_cameras_are_refused(video: Path) -> None:
    with pytest.raises(ServeError, match="unique"):
        CameraServer([("a", video), ("a", video)])
    with pytest.raises(ServeError, match="letters"):
        CameraServer([("a b", video)])
    with pytest.raises(ServeError, match="no cameras"):
        CameraServer([])
    with CameraServer([("a", video)], fps=5.0) as server, pytest.raises(ServeError, match="'b'"):
        server.url("b")


@pytest.mark.timeout(20)
def test_cameras_from_the_sample_rig() -> None:
    # when the sample rig is the source
    cameras = cameras_from_sources([str(SAMPLE_RIG)])
    # then every camera comes with its video, in rig order
    assert [name for name, _ in cameras] == RIG_NAMES
    assert [path.resolve() for _, path in cameras] == [
        (SAMPLE_RIG.parent / f"{name}.mp4").resolve() for name in RIG_NAMES
    ]


@pytest.mark.timeout(20)
def test_cameras_from_a_folder_and_repeated_files(tmp_path: Path) -> None:
    # given a folder with two videos (and a file that is not a video)
    folder = tmp_path / "clips"
    folder.mkdir()
    b, a = make_video(folder / "b.mp4", frames=2), make_video(folder / "a cam.avi", frames=2)
    (folder / "notes.txt").write_text("x")
    # when the folder, then one of its files twice more, are the sources
    cameras = cameras_from_sources([str(folder), str(b), str(b)])
    # then videos are sorted, names come from stems made URL-safe, repeats are numbered
    assert cameras == [("a_cam", a), ("b", b), ("b_2", b), ("b_3", b)]


@pytest.mark.timeout(20)
def test_cameras_from_missing_or_empty_sources_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ServeError) as error:
        cameras_from_sources([str(tmp_path / "nowhere")])
    assert_one_line(error, "nowhere")
    with pytest.raises(ServeError) as error:
        cameras_from_sources([str(tmp_path)])
    assert_one_line(error, "expected videos", str(tmp_path))


@pytest.mark.timeout(30)
def test_serves_the_sample_rig_live() -> None:
    # given the sample rig, served at its own 15 fps
    with CameraServer(cameras_from_sources([str(SAMPLE_RIG)])) as server:
        assert [c.fps for c in server.cameras] == [pytest.approx(15.0)] * 6
        # when OpenCV reads two of its cameras
        for name in ("front", "back_right"):
            capture = cv2.VideoCapture(server.url(name))
            try:
                ok, frame = capture.read()
            finally:
                capture.release()
            # then it gets 640x360 frames
            assert ok
            assert frame.shape == (360, 640, 3)
