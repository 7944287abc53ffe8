"""MJPEG over HTTP (`multipart/x-mixed-replace`), read without decoding.

IP cameras and `drivepercept serve-cameras` stream MJPEG: every part is a whole JPEG, so a
frame can be decoded on its own, later, on any thread. OpenCV's reader decodes every part on
the thread that reads the socket, including the ones a live run drops for newer frames (most
of them when the model is slower than the cameras). `MjpegReader` reads the parts with the
standard library's HTTP client and hands each one over still encoded (`RawFrame.jpeg`): the
batcher decodes only the frames it takes. The first part is decoded at open, for the size.

A response that is not a multipart stream (an MP4 or HLS URL, a snapshot page) raises
`NotMjpegError`, and the caller opens the URL with OpenCV instead.
"""

from __future__ import annotations

import http.client
import re
import socket
import time
from urllib.parse import SplitResult, urlsplit

from drivepercept.config import ReconnectPolicy
from drivepercept.sources.probe import basic_auth, camera_tls, http_phrase
from drivepercept.sources.readers import RawFrame, SourceError, SourceInfo
from drivepercept.types import CameraState, ReaderStatus

MAX_PART_BYTES = 32 << 20  # a JPEG part larger than this is not a camera frame
_BOUNDARY_RE = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)


class NotMjpegError(SourceError):
    """The URL answers, but not with an MJPEG stream (open it with OpenCV instead)."""


class MjpegReader:
    """One connection to an MJPEG-over-HTTP stream; `read()` returns frames still encoded.

    Args:
        url: http:// or https:// (credentials in the URL are sent as Basic authentication).
        policy: `open_timeout_s` bounds the connection and the first frame, `read_timeout_s`
            every later read (a silent stream is then lost, as with OpenCV's reader).

    Raises:
        NotMjpegError: the server answers 200 with something else.
        SourceError: the connection, the HTTP status or the first frame failed (one line,
            naming the URL and the reason).
    """

    def __init__(self, url: str, *, policy: ReconnectPolicy) -> None:
        self.source = url
        parts = urlsplit(url)
        self._conn = _connection(parts, policy.open_timeout_s)
        self._first: RawFrame | None = None
        self._at_headers = False  # the boundary line of the next part was already read
        self._ended = False  # the final boundary was read
        try:
            self._boundary = self._request(parts)
            self._t0 = time.monotonic_ns() / 1e9
            first = self.read()
            if first is None:
                raise SourceError(f"cannot open {url}: the stream ended before its first frame")
            self._first = first
            height, width = first.image_bgr.shape[:2]
        except BaseException:
            self._conn.close()
            raise
        self.info = SourceInfo(width, height, 0.0, -1)
        if self._conn.sock is not None:
            self._conn.sock.settimeout(policy.read_timeout_s)

    def _request(self, parts: SplitResult) -> bytes:
        headers = {"User-Agent": "drivepercept", "Accept": "multipart/x-mixed-replace, */*"}
        if (auth := basic_auth(parts)) is not None:
            headers["Authorization"] = auth
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            self._conn.request("GET", target, headers=headers)
            self._response = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise SourceError(f"cannot open {self.source}: {_why(exc)}") from None
        status = self._response.status
        if status != 200:
            raise SourceError(f"cannot open {self.source}: HTTP {status} {http_phrase(status)}")
        kind = self._response.getheader("Content-Type") or ""
        boundary = _BOUNDARY_RE.search(kind)
        if not kind.lower().startswith("multipart/") or boundary is None:
            raise NotMjpegError(f"{self.source} is not an MJPEG stream ({kind or 'no type'})")
        return boundary.group(1).encode()

    def read(self) -> RawFrame | None:
        """The next frame, encoded; None when the stream ends, breaks or stays silent past
        the read timeout (the reconnect supervisor takes it from there)."""
        if self._first is not None:
            first, self._first = self._first, None
            return first
        try:
            return self._next_part()
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def _next_part(self) -> RawFrame | None:
        body, marker = self._response, b"--" + self._boundary
        if self._ended:
            return None
        if not self._at_headers:  # skip the rest of the last part, up to the boundary line
            while True:
                line = body.readline(65536)
                if not line or line.strip() == marker + b"--":  # closed, or the final boundary
                    return None
                if line.strip() == marker:
                    break
        self._at_headers = False
        headers: dict[bytes, bytes] = {}
        while (line := body.readline(65536)) not in (b"\r\n", b"\n"):
            if not line:
                return None
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"jpeg" not in headers.get(b"content-type", b"image/jpeg").lower():
            raise ValueError("a part that is not a JPEG")
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            if not 0 < length <= MAX_PART_BYTES:
                raise ValueError(f"a part of {length} bytes")
            jpeg = body.read(length)
            if len(jpeg) < length:
                return None
        else:
            jpeg = self._until_boundary(marker)
            self._at_headers = True
        arrived_ns = time.monotonic_ns()
        return RawFrame(None, arrived_ns / 1e9 - self._t0, arrived_ns, jpeg=jpeg)

    def _until_boundary(self, marker: bytes) -> bytes:
        """A part without Content-Length: its bytes up to the next boundary line."""
        data = bytearray()
        while len(data) <= MAX_PART_BYTES:
            line = self._response.readline(65536)
            if not line:
                raise ValueError("the stream ended inside a part")
            if line.strip() in (marker, marker + b"--"):  # the next part, or the last one
                self._ended = line.strip() != marker
                return bytes(data).removesuffix(b"\r\n")
            data += line
        raise ValueError("a part larger than any camera frame")

    def status(self) -> ReaderStatus:
        return ReaderStatus(CameraState.STREAMING, live=True)

    def close(self) -> None:
        self._conn.close()


def _connection(parts: SplitResult, timeout_s: float) -> http.client.HTTPConnection:
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        raise SourceError(f"cannot open {parts.geturl()}: the port is not a number") from None
    if parts.scheme.lower() == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=camera_tls())
    return http.client.HTTPConnection(host, port, timeout=timeout_s)


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return "host not found"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return type(exc).__name__
