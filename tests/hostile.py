"""A hostile MJPEG camera for tests: a loopback HTTP server that answers every connection
with one scripted misbehaviour (issue 26). Each mode first sends the multipart response
header and, unless it says otherwise, one valid JPEG part, then misbehaves:

- `endless_headers`: a part whose header lines never end (`X-1: 1`, `X-2: 2`, ...);
- `drip`: the next part one byte every half second;
- `random`: random bytes right after the response header (no valid part);
- `negative_length`: parts announcing `Content-Length: -5`;
- `huge_part`: a part announcing 50 MB;
- `huge_dims`: parts whose JPEG header says 9000x9000;
- `not_jpeg`: parts of `text/html`;
- `only_not_jpeg`: no good part first: only parts of `text/html`, as fast as the socket
  takes them (an open gives up on their count, never waiting on its timeout);
- `huge_among_good` (issue 43): 20 parts a second, in turn three that declare more pixels
  than any frame may have (30000x30000, 30000x30000 with a junk byte after its APP0 segment,
  which libjpeg decodes all the same, and 60000x60000, over OpenCV's own limit) and a good
  one;
- `chunked` (not hostile: awkward): good parts, 25 a second, sent with `Transfer-Encoding:
  chunked` in chunks of 7 bytes (chunk ends fall inside boundaries and line ends);
- `garbage_jpegs`: then parts of `image/jpeg` that hold no JPEG, 25 a second, and a good one
  every tenth;
- `undecodable_jpegs`: likewise, but the bad parts are JPEGs whose headers pass (a size
  within the limit) and whose data does not decode (no quantization tables): refused only
  when decoded, by the batcher.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import cv2
import numpy as np

MODES = (
    "endless_headers", "drip", "random", "negative_length", "huge_part", "huge_dims", "not_jpeg",
    "garbage_jpegs", "chunked", "only_not_jpeg", "huge_among_good", "undecodable_jpegs",
)  # fmt: skip
BOUNDARY = b"frame"


def jpeg(width: int = 64, height: int = 48, *, value: int = 90) -> bytes:
    """A small JPEG of one grey `value` (the tests' good frame)."""
    ok, data = cv2.imencode(".jpg", np.full((height, width, 3), value, np.uint8))
    assert ok
    return data.tobytes()


def with_size(data: bytes, width: int, height: int) -> bytes:
    """`data` (a JPEG) with its frame header claiming width x height."""
    out = bytearray(data)
    i = 2
    while i < len(out):
        marker = out[i + 1]
        if 0xC0 <= marker <= 0xC3:
            out[i + 5 : i + 7] = height.to_bytes(2, "big")
            out[i + 7 : i + 9] = width.to_bytes(2, "big")
            return bytes(out)
        i += 2 + int.from_bytes(out[i + 2 : i + 4], "big")
    raise AssertionError("no frame header")


def with_junk(data: bytes, junk: bytes = b"\x00") -> bytes:
    """`data` (a JPEG) with `junk` between its APP0 segment and the next marker: libjpeg
    skips it with a warning and decodes the picture (a strict header reader gives up)."""
    assert data[2:4] == b"\xff\xe0", "no APP0 segment"
    end = 4 + int.from_bytes(data[4:6], "big")
    return data[:end] + junk + data[end:]


def without_quantization(data: bytes) -> bytes:
    """`data` (a JPEG) without its DQT segments: its header says its size, libjpeg refuses
    to decode it ("quantization table was not defined")."""
    out, i = bytearray(data[:2]), 2
    while data[i + 1] != 0xDA:  # up to the scan
        end = i + 2 + int.from_bytes(data[i + 2 : i + 4], "big")
        out += b"" if data[i + 1] == 0xDB else data[i:end]
        i = end
    return bytes(out + data[i:])


def huge_jpegs() -> dict[str, bytes]:
    """A few hundred bytes each, declaring more pixels than a frame may have: decoded, the
    first two would take 2.7 GB; OpenCV refuses the third itself (its 2^30 pixel limit)."""
    small = jpeg()
    return {
        "30000x30000": with_size(small, 30000, 30000),
        "30000x30000 junk": with_junk(with_size(small, 30000, 30000)),
        "60000x60000": with_size(small, 60000, 60000),
    }


def _part(body: bytes, kind: bytes = b"image/jpeg", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    head = b"--" + BOUNDARY + b"\r\nContent-Type: " + kind + b"\r\n"
    return head + b"Content-Length: " + str(size).encode() + b"\r\n\r\n" + body + b"\r\n"


class HostileCamera:
    """Serves `mode` to every connection on 127.0.0.1 until closed.

    Attributes:
        url: the camera's URL.
        connections: connections accepted so far.
    """

    def __init__(self, mode: str) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/cam.mjpg"
        self._thread = threading.Thread(target=self._serve, name="hostile-camera", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)  # the request
            if self.mode == "chunked":
                self._chunked(conn)
                return
            conn.sendall(
                b"HTTP/1.0 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary="
                + BOUNDARY + b"\r\n\r\n"
            )  # fmt: skip
            if self.mode == "random":
                while not self._stop.is_set():
                    conn.sendall(os.urandom(65536))
                    time.sleep(0.01)
                return
            if self.mode != "only_not_jpeg":
                conn.sendall(_part(jpeg()))
            getattr(self, "_" + self.mode)(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def _endless_headers(self, conn: socket.socket) -> None:
        conn.sendall(b"--" + BOUNDARY + b"\r\nContent-Type: image/jpeg\r\n")
        n = 0
        while not self._stop.is_set():
            lines = b"".join(b"X-%d: %d\r\n" % (n + k, n + k) for k in range(1000))
            conn.sendall(lines)
            n += 1000

    def _drip(self, conn: socket.socket) -> None:
        for byte in _part(jpeg()):
            if self._stop.wait(0.5):
                return
            conn.sendall(bytes([byte]))

    def _negative_length(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            conn.sendall(_part(jpeg(), length=-5))
            time.sleep(0.05)

    def _huge_part(self, conn: socket.socket) -> None:
        conn.sendall(_part(b"", length=50 << 20)[:-2])
        self._stop.wait(10)

    def _huge_dims(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            conn.sendall(_part(with_size(jpeg(), 9000, 9000)))
            time.sleep(0.05)

    def _not_jpeg(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            conn.sendall(_part(b"<html></html>", kind=b"text/html"))
            time.sleep(0.05)

    def _only_not_jpeg(self, conn: socket.socket) -> None:
        # unpaced: the reader's count of refused parts ends its open at once, however busy
        # the host (at 20 a second, 25 parts took 1.25 s or more of a 2 s open timeout);
        # `sendall` waits while the socket's buffer is full, and fails once the reader closes
        while not self._stop.is_set():
            conn.sendall(_part(b"<html></html>", kind=b"text/html") * 32)

    def _huge_among_good(self, conn: socket.socket) -> None:
        parts = [*huge_jpegs().values(), jpeg()]  # after the good one all modes send
        n = 0
        while not self._stop.is_set():
            conn.sendall(_part(parts[n % len(parts)]))
            n += 1
            time.sleep(0.05)

    def _garbage_jpegs(self, conn: socket.socket, bad: bytes | None = None) -> None:
        good, n = jpeg(), 0
        while not self._stop.is_set():
            n += 1
            conn.sendall(_part(good if n % 10 == 0 else bad or os.urandom(2000)))
            time.sleep(0.04)

    def _undecodable_jpegs(self, conn: socket.socket) -> None:
        self._garbage_jpegs(conn, without_quantization(jpeg()))

    def _chunked(self, conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: "
            b"multipart/x-mixed-replace; boundary=" + BOUNDARY + b"\r\n\r\n"
        )
        while not self._stop.is_set():
            data = _part(jpeg(64, 48)) + _part(jpeg(32, 24))
            for i in range(0, len(data), 7):
                piece = data[i : i + 7]
                conn.sendall(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
            time.sleep(0.04)


@contextmanager
def hostile_camera(mode: str) -> Iterator[HostileCamera]:
    camera = HostileCamera(mode)
    try:
        yield camera
    finally:
        camera.close()
