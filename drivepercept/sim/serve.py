"""Serve video files as live MJPEG-over-HTTP cameras, so a "live" rig can be tested anywhere.

Each camera is a video file decoded by its own `serve-<name>` thread, paced in real time on the
monotonic clock and looped at the end. Each frame is JPEG-encoded once (and the first pass's
JPEGs are replayed on later passes, within a memory budget) and published to a
`_Feed` that keeps only the newest frame; a client handler sends the newest frame it has not
sent yet, so a slow client skips frames (counted) and never slows its camera or other clients.

`GET /<name>.mjpg` answers `multipart/x-mixed-replace`, which FFmpeg's `mpjpeg` demuxer reads,
so `cv2.VideoCapture(url)` opens it. Each part carries `Content-Type: image/jpeg` (the demuxer
refuses a part without it) and `Content-Length` (without it FFmpeg must wait for the next
boundary, which delays every frame by one frame period).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import re
import socket
import socketserver
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import cv2
import numpy as np
import numpy.typing as npt

from drivepercept.errors import ConfigError, DrivePerceptError, one_line
from drivepercept.geometry import check_fps
from drivepercept.rig import resolve_cameras

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov")
_BOUNDARY = "drivepercept-frame"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_POLL_S = 0.1  # how often a waiting thread looks at the shutdown event
_CLIENT_STALL_S = 10.0  # a client that takes no bytes for this long is dropped
_JOIN_TIMEOUT_S = 3.0  # shared budget for joining every thread on close
_LOOP_BUDGET_BYTES = 256 * 2**20  # JPEGs of one camera's pass kept for replay, at most

_Image = npt.NDArray[np.uint8]


class ServeError(DrivePerceptError):
    """The camera server cannot serve: bad video, bad fps, bad or busy port."""


@dataclass(frozen=True)
class ServedCamera:
    """One served camera: its stream name, its video file and the pace it is served at."""

    name: str
    path: Path
    fps: float


class _Feed:
    """The newest JPEG of one camera and its client counters.

    Thread-safety: every field is guarded by `_cond`. The camera thread only replaces the frame
    and wakes the handlers; it never waits for a client.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jpeg = b""
        self._seq = 0  # frames published; each client remembers the last seq it sent
        self._ended = False
        self._sent = self._skipped = self._clients = 0
        self.stalled = False  # a fault: frames are made but not published, connections stay
        self.size: tuple[int, int] | None = None  # a fault: frames resized to (w, h)

    def publish(self, jpeg: bytes) -> None:
        with self._cond:
            if self.stalled:
                return
            self._jpeg, self._seq = jpeg, self._seq + 1
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def newest_after(self, seq: int, *, timeout: float) -> tuple[int, bytes] | None:
        """The newest frame if newer than `seq`, waiting at most `timeout` s for one."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq > seq or self._ended, timeout=timeout)
            return (self._seq, self._jpeg) if self._seq > seq else None

    def count(self, *, clients: int = 0, sent: int = 0, skipped: int = 0) -> None:
        with self._cond:
            self._clients += clients
            self._sent += sent
            self._skipped += skipped

    def stats(self) -> tuple[int, int, int, int, bool]:
        """(published, sent, skipped, clients, ended)."""
        with self._cond:
            return self._seq, self._sent, self._skipped, self._clients, self._ended


class _StreamHandler(BaseHTTPRequestHandler):
    """Answers one request; a stream runs until the client leaves, stalls, or shutdown."""

    timeout = _CLIENT_STALL_S  # socket timeout, so a stalled client cannot block its thread
    server_version = "drivepercept-serve"

    def __init__(self, *args: Any, feeds: Mapping[str, _Feed], stop: threading.Event) -> None:
        self._feeds, self._stop = feeds, stop
        super().__init__(*args)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        name = path[1:-5] if path.endswith(".mjpg") else ""
        if path == "/":  # the index: one URL a line, as the client addressed this server
            host = self.headers.get("Host") or "{}:{}".format(*self.connection.getsockname())
            body = "".join(f"http://{host}/{n}.mjpg\n" for n in self._feeds).encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif name in self._feeds:
            self._stream(name, self._feeds[name])
        else:
            self.send_error(HTTPStatus.NOT_FOUND, f"no stream {path}; GET / lists them")

    def _stream(self, name: str, feed: _Feed) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={_BOUNDARY}")
        self.send_header("Cache-Control", "no-cache, no-store")
        self.end_headers()
        feed.count(clients=1)
        seen = 0
        try:
            while not self._stop.is_set():
                newest = feed.newest_after(seen, timeout=_POLL_S)
                if newest is None:
                    if feed.stats()[4]:
                        return  # the camera thread ended; it logged why
                    continue
                seq, jpeg = newest
                if seen:
                    feed.count(skipped=seq - seen - 1)  # the newest frame wins
                seen = seq
                head = f"--{_BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                head += f"Content-Length: {len(jpeg)}\r\n\r\n"
                self.wfile.write(b"".join((head.encode(), jpeg, b"\r\n")))  # one sendall
                feed.count(sent=1)
        except OSError as exc:  # broken pipe, reset, stall timeout, socket shut by close()
            log.debug("client %s of %s left: %s", self.client_address, name, exc)
        finally:
            feed.count(clients=-1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer whose handler threads are named, tracked and joined on close."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], feeds: Mapping[str, _Feed], stop: threading.Event
    ) -> None:
        self._lock = threading.Lock()
        self._handlers: dict[threading.Thread, socket.socket] = {}
        self._accepted = 0
        super().__init__(address, functools.partial(_StreamHandler, feeds=feeds, stop=stop))
        self.timeout = _POLL_S  # handle_request() returns this often to look at the stop event

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, which can stall without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        self._accepted += 1
        thread = threading.Thread(
            target=self._handle,
            args=(request, client_address),
            daemon=True,
            name=f"serve-client-{self._accepted}",
        )
        with self._lock:
            self._handlers[thread] = request
        thread.start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._handlers.pop(threading.current_thread(), None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("request from %s failed", client_address, exc_info=True)

    def disconnect_all(self) -> list[threading.Thread]:
        """Shut every client socket (this wakes a blocked write); return their threads."""
        with self._lock:
            handlers = list(self._handlers.items())
        for _, sock in handlers:
            with contextlib.suppress(OSError):  # already closed by its handler
                sock.shutdown(socket.SHUT_RDWR)
        return [thread for thread, _ in handlers]


class CameraServer:
    """Serves video files as live MJPEG cameras over HTTP; a context manager.

    One `serve-<name>` thread per camera decodes its video, loops at the end, paces frames at
    `fps` (the file's own rate when `fps` is None) on the monotonic clock without drift, and
    encodes each frame once (later passes replay the first pass's JPEGs: `_JpegLoop`). The
    `serve-http` thread accepts clients; each client gets its own `serve-client-<n>` handler
    thread, which sends the newest frame it has not sent yet.

    Args:
        cameras: (name, video) pairs; a camera is streamed at `/<name>.mjpg`.
        host: the address to listen on.
        port: the port to listen on; 0 picks a free one (read it from `port`).
        fps: the pace every camera is served at; None serves each at its file's frame rate.
        jpeg_quality: JPEG quality of the streamed frames, 1 to 100.
    """

    def __init__(
        self,
        cameras: Sequence[tuple[str, Path]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        fps: float | None = None,
        jpeg_quality: int = 80,
    ) -> None:
        names = [name for name, _ in cameras]
        bad = [name for name in names if not _NAME_RE.match(name)]
        if not names or bad:
            raise ServeError(
                "expected 1 or more cameras named with 1-64 letters, digits, '_' or '-', "
                f"got {bad[0] if bad else 'no cameras'!r}"
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ServeError(f"camera names must be unique, repeated: {', '.join(repeated)}")
        if fps is not None:
            _check_fps(fps)
        if not 0 <= port <= 65535 or not 1 <= jpeg_quality <= 100:
            raise ServeError(
                f"expected port in 0..65535 and jpeg_quality in 1..100, got {port}, {jpeg_quality}"
            )
        self._sources = [(name, Path(path)) for name, path in cameras]
        self._address = (host, port)
        self._fps, self._jpeg_quality = fps, jpeg_quality
        self._stop = threading.Event()  # the one shutdown signal for every thread
        self._feeds = {name: _Feed() for name in names}
        self._cameras: tuple[ServedCamera, ...] = ()
        self._httpd: _HTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._closed = False

    def __enter__(self) -> CameraServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Open every video (ServeError if one cannot be read), bind the port, start threads."""
        if self._httpd is not None or self._closed:
            raise RuntimeError("a CameraServer can be started only once")
        opened: list[tuple[ServedCamera, cv2.VideoCapture, _Image]] = []
        try:
            for name, path in self._sources:
                capture, first, file_fps = _open_video(path)
                opened.append(
                    (ServedCamera(name, path, float(self._fps or file_fps)), capture, first)
                )
                if self._fps is None:
                    _check_fps(file_fps, source=path)
            httpd = _bind(self._address, self._feeds, self._stop)
        except BaseException:
            for _, capture, _ in opened:
                capture.release()
            raise
        self._httpd = httpd
        self._cameras = tuple(camera for camera, _, _ in opened)
        for camera, capture, first in opened:
            self._threads.append(
                threading.Thread(
                    target=self._run_camera,
                    args=(camera, capture, first),
                    daemon=True,
                    name=f"serve-{camera.name}",
                )
            )
        self._threads.append(
            threading.Thread(target=self._run_http, name="serve-http", daemon=True)
        )
        for thread in self._threads:
            thread.start()
        log.info("serving %d cameras on %s", len(self._cameras), self.url(self._cameras[0].name))

    def close(self) -> None:
        """Stop every thread, disconnect every client, close the socket; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._httpd is None:
            return
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        self._threads[-1].join(timeout=_JOIN_TIMEOUT_S)  # serve-http: no new client after this
        threads = self._threads + self._httpd.disconnect_all()
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._httpd.server_close()
        not_stopped = [t.name for t in threads if t.is_alive()]
        if not_stopped:
            log.error("threads did not stop within %.1f s: %s", _JOIN_TIMEOUT_S, not_stopped)

    @property
    def port(self) -> int:
        """The bound port (the free one picked when port=0)."""
        if self._httpd is None:
            raise RuntimeError("the camera server is not started")
        return int(self._httpd.server_address[1])

    @property
    def cameras(self) -> tuple[ServedCamera, ...]:
        """The served cameras, with the pace each is served at (known once started)."""
        if self._httpd is None:
            raise RuntimeError("the camera server is not started")
        return self._cameras

    def url(self, name: str) -> str:
        """The stream URL of camera `name`, e.g. http://127.0.0.1:8554/front.mjpg."""
        self._feed(name)
        host = self._address[0] if self._address[0] not in ("", "0.0.0.0") else "127.0.0.1"
        return f"http://{host}:{self.port}/{name}.mjpg"

    def frames_published(self, name: str) -> int:
        """Frames camera `name` has produced so far."""
        return self._feed(name).stats()[0]

    def frames_sent(self, name: str) -> int:
        """Frames written to the clients of camera `name`, all clients summed."""
        return self._feed(name).stats()[1]

    def frames_skipped(self, name: str) -> int:
        """Frames clients of camera `name` skipped because a newer one came first, summed."""
        return self._feed(name).stats()[2]

    def clients(self, name: str) -> int:
        """Clients of camera `name` connected now."""
        return self._feed(name).stats()[3]

    def stall(self, name: str, stalled: bool = True) -> None:
        """A fault for tests: camera `name` goes on running but sends nothing, and keeps its
        clients connected (a camera hung without closing), until `stall(name, False)`."""
        self._feed(name).stalled = stalled

    def resize(self, name: str, size: tuple[int, int] | None) -> None:
        """A fault for tests: camera `name` changes its resolution to `size` (w, h) mid-stream
        (None: back to its video's own)."""
        self._feed(name).size = size

    def _feed(self, name: str) -> _Feed:
        if name not in self._feeds:
            raise ServeError(f"expected a camera in {', '.join(self._feeds)}, got {name!r}")
        return self._feeds[name]

    def _run_http(self) -> None:
        assert self._httpd is not None
        while not self._stop.is_set():
            self._httpd.handle_request()  # returns within _POLL_S when no client comes

    def _run_camera(self, camera: ServedCamera, capture: cv2.VideoCapture, frame: _Image) -> None:
        feed = self._feeds[camera.name]
        frames = _JpegLoop(camera.path, capture, frame, quality=self._jpeg_quality)
        period_s = 1.0 / camera.fps
        due = time.monotonic()  # absolute deadlines: decode and wake-up time cause no drift
        try:
            while True:
                jpeg = frames.next(feed.size)
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                feed.publish(jpeg)
                due += period_s
                if time.monotonic() - due > period_s:
                    due = time.monotonic()  # fell behind (slow decode): resync, do not burst
        except Exception:
            log.exception("camera %s stopped; its clients are disconnected", camera.name)
        finally:
            frames.close()
            feed.end()


class _JpegLoop:
    """One camera's video as JPEG frames, looped at the end.

    The first pass decodes and encodes every frame; its JPEGs are kept while they fit in
    `budget_bytes`, and every later pass sends those bytes again instead of decoding and
    encoding anew. A served camera stands for a camera on other hardware: the machine under
    test should not pay for making its frames (six 960x540 cameras at 25 fps cost the server
    about 0.4 of a core to decode and encode, on the 2-core machine the pipeline runs on).
    A pass in which a frame was resized (the `resize` fault) is not kept; a resized frame
    from the kept pass is decoded, resized and encoded again.

    Not thread-safe: only its camera's `serve-<name>` thread uses it.
    """

    def __init__(
        self,
        path: Path,
        capture: cv2.VideoCapture,
        first: _Image,
        *,
        quality: int,
        budget_bytes: int = _LOOP_BUDGET_BYTES,
    ) -> None:
        self._path = path
        self._capture: cv2.VideoCapture | None = capture
        self._frame = first
        self._params = [cv2.IMWRITE_JPEG_QUALITY, quality]
        self._budget_bytes = budget_bytes
        self._kept: list[bytes] | None = []  # this pass's JPEGs; None once not kept
        self._kept_bytes = 0
        self._replay: int | None = None  # the next kept frame, once the first pass is kept

    @property
    def replaying(self) -> bool:
        """True once frames come from the kept pass (no decoding, no encoding)."""
        return self._replay is not None

    def next(self, size: tuple[int, int] | None) -> bytes:
        """The next frame as JPEG, resized to `size` (w, h) when it is not None."""
        if self._replay is not None:
            assert self._kept  # replaying only starts from a kept, non-empty pass
            jpeg = self._kept[self._replay]
            self._replay = (self._replay + 1) % len(self._kept)
            if size is None:
                return jpeg
            decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
            if decoded is None:
                raise ServeError(f"cannot decode a kept frame of {self._path}")
            return self._encode(np.asarray(cv2.resize(decoded, size), np.uint8))
        shown = self._frame if size is None else cv2.resize(self._frame, size)
        jpeg = self._encode(np.asarray(shown, np.uint8))
        self._keep(jpeg if size is None else None)
        assert self._capture is not None
        ok, read = self._capture.read()
        if ok:
            self._frame = np.asarray(read, np.uint8)
        elif self._kept:  # the end of a kept pass: replay it from now on
            self._capture.release()
            self._capture, self._replay = None, 0
        else:  # the end of a pass not kept: decode the file again
            self._capture.release()
            self._capture, self._frame, _ = _open_video(self._path)
            self._kept, self._kept_bytes = [], 0
        return jpeg

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None

    def _encode(self, image: _Image) -> bytes:
        ok, jpeg = cv2.imencode(".jpg", image, self._params)
        if not ok:
            raise ServeError(f"cannot JPEG-encode a frame of {self._path}")
        return jpeg.tobytes()

    def _keep(self, jpeg: bytes | None) -> None:
        """Keep `jpeg` for later passes; None (a resized frame) gives up keeping this pass."""
        if self._kept is None:
            return
        if jpeg is None:
            self._kept, self._kept_bytes = None, 0
            return
        if self._kept_bytes + len(jpeg) > self._budget_bytes:
            self._kept, self._kept_bytes = None, 0
            self._budget_bytes = 0  # the video does not fit: later passes do not try
            return
        self._kept.append(jpeg)
        self._kept_bytes += len(jpeg)


def _check_fps(fps: float, *, source: Path | None = None) -> None:
    try:
        check_fps(fps)
    except ConfigError as exc:
        where = f"the frame rate of {source} (pass fps to set one): " if source else ""
        raise ServeError(f"{where}{exc}") from exc


def _bind(
    address: tuple[str, int], feeds: Mapping[str, _Feed], stop: threading.Event
) -> _HTTPServer:
    try:
        return _HTTPServer(address, feeds, stop)
    except OSError as exc:
        host, port = address
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(
                f"port {port} on {host} is already in use (expected a free port, or 0 for any)"
            ) from exc
        raise ServeError(f"cannot listen on {host}:{port}: {one_line(str(exc))}") from exc


def _open_video(path: Path) -> tuple[cv2.VideoCapture, _Image, float]:
    """Open `path` and read its first frame: (capture, first frame, the file's fps)."""
    if not path.is_file():
        raise ServeError(
            f"expected a video file, got {'a folder' if path.is_dir() else 'no file'} at {path}"
        )
    capture = cv2.VideoCapture(str(path))
    ok, frame = capture.read() if capture.isOpened() else (False, None)
    if not ok or frame is None:
        capture.release()
        raise ServeError(f"expected a video OpenCV can decode, got no frame from {path}")
    return capture, np.asarray(frame, np.uint8), float(capture.get(cv2.CAP_PROP_FPS) or 0.0)


def cameras_from_sources(sources: Sequence[str]) -> list[tuple[str, Path]]:
    """Rig files, video files and folders of videos -> (name, video) pairs, by the rules every
    mode shares (`drivepercept.rig.resolve_cameras`, with each video of a folder a camera).

    Raises:
        ServeError: a source or a rig's video is missing, a folder has no videos, a rig is bad.
    """
    try:
        cams = resolve_cameras(sources, folders_of_videos=True)
    except ConfigError as exc:
        raise ServeError(one_line(str(exc))) from exc
    pairs = []
    for cam in cams:
        if cam.video is None or not cam.video.is_file():
            raise ServeError(
                f"camera {cam.name!r}: expected a rig .toml, a video or a folder of videos, "
                f"got no file at {cam.video or cam.source}"
            )
        pairs.append((cam.name, cam.video))
    return pairs


def serve_forever(server: CameraServer, *, stop: threading.Event) -> None:
    """Block until `stop` is set (the CLI sets it on SIGINT/SIGTERM), then close `server`."""
    try:
        while not stop.wait(timeout=0.5):
            pass
    finally:
        server.close()
