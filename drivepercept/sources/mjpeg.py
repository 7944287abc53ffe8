"""MJPEG over HTTP (`multipart/x-mixed-replace`), read without decoding.

IP cameras and `drivepercept serve-cameras` stream MJPEG: every part is a whole JPEG, so a
frame can be decoded on its own, later, on any thread. OpenCV's reader decodes every part on
the thread that reads the socket, including the ones a live run drops for newer frames (most
of them when the model is slower than the cameras). `MjpegReader` reads the parts with the
standard library's HTTP client and hands each one over still encoded (`RawFrame.jpeg`): the
batcher decodes only the frames it takes. The first part is decoded at open, for the size.

A response that is not a multipart stream (an MP4 or HLS URL, a snapshot page) raises
`NotMjpegError`, and the caller opens the URL with OpenCV instead.

Nothing the camera sends is trusted (`bounded.py`): a part must arrive whole within
`read_timeout_s` (the first within `open_timeout_s`), its header lines are at most
`MAX_HEADER_LINE` bytes and `MAX_HEADERS` lines, its body at most `max_part_mb`, its
picture at most `MAX_SIZE_PX` a side (read from the JPEG header, before any decoding), and a
stop ends a read within `bounded.SLICE_S`. A part that breaks a bound ends the connection with
the reason (`last_error`), which the reconnect supervisor reports.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from urllib.parse import SplitResult, urlsplit

from drivepercept.config import ReconnectPolicy
from drivepercept.geometry import MAX_SIZE_PX
from drivepercept.sources.bounded import BodyError, BoundedBody
from drivepercept.sources.imagesize import jpeg_size
from drivepercept.sources.probe import basic_auth, camera_tls, http_phrase
from drivepercept.sources.readers import RawFrame, SourceError, SourceInfo
from drivepercept.types import CameraState, ReaderStatus

MAX_PART_BYTES = 8 << 20  # the default bound of a part (`ReconnectPolicy.max_part_mb`)
MAX_HEADER_LINE = 8192  # bytes in one header or boundary line
MAX_HEADERS = 64  # header lines of one part
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

    def __init__(
        self, url: str, *, policy: ReconnectPolicy, stop: threading.Event | None = None
    ) -> None:
        self.source = url
        self.last_error = ""  # why the last read gave None (the supervisor's reason)
        self._read_timeout_s = policy.read_timeout_s
        self._max_part = int(policy.max_part_mb * 2**20)
        parts = urlsplit(url)
        opened = time.monotonic()
        self._conn = _connection(parts, policy.open_timeout_s)
        self._first: RawFrame | None = None
        self._at_headers = False  # the boundary line of the next part was already read
        self._ended = False  # the final boundary was read
        try:
            self._boundary = self._request(parts)
            self._body = BoundedBody(self._response, self._sock, stop)
            self._t0 = time.monotonic_ns() / 1e9
            # the open, the response and the first frame together within the open timeout
            first = self._part(opened + policy.open_timeout_s)
            if first is None:
                why = self.last_error or "the stream ended before its first frame"
                raise SourceError(f"cannot open {url}: {why}")
            self._first = first
            try:
                height, width = first.image_bgr.shape[:2]
            except SourceError as exc:
                raise SourceError(f"cannot open {url}: its first frame is {exc}") from None
        except BaseException:
            self._conn.close()
            raise
        self.info = SourceInfo(width, height, 0.0, -1)

    def watch(self, stop: threading.Event) -> None:
        """Ends any read within `bounded.SLICE_S` once `stop` is set."""
        self._body.stop = stop

    def _request(self, parts: SplitResult) -> bytes:
        headers = {"User-Agent": "drivepercept", "Accept": "multipart/x-mixed-replace, */*"}
        if (auth := basic_auth(parts)) is not None:
            headers["Authorization"] = auth
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            self._conn.request("GET", target, headers=headers)
            # the connection lets go of its socket once a closing response owns it
            self._sock = self._conn.sock
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
        """The next frame, encoded; None when the stream ends, breaks a bound or does not
        deliver a whole part within the read timeout (`last_error` says which; the
        reconnect supervisor takes it from there)."""
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return self._part(time.monotonic() + self._read_timeout_s)

    def _part(self, deadline: float) -> RawFrame | None:
        try:
            return self._next_part(deadline)
        except BodyError as exc:
            self.last_error = str(exc)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.last_error = str(exc) or type(exc).__name__
        return None

    def _next_part(self, deadline: float) -> RawFrame | None:
        body, marker = self._body, b"--" + self._boundary
        if self._ended:
            self.last_error = "the stream ended"
            return None
        if not self._at_headers:  # skip the rest of the last part, up to the boundary line
            skipped = 0
            while True:
                line = body.readline(MAX_HEADER_LINE, deadline)
                if not line or line.strip() == marker + b"--":  # closed, or the final boundary
                    self.last_error = "the stream ended"
                    return None
                if line.strip() == marker:
                    break
                skipped += len(line)
                if skipped > self._max_part:
                    raise ValueError(f"no part boundary within {self._max_part} bytes")
        self._at_headers = False
        headers: dict[bytes, bytes] = {}
        while (line := body.readline(MAX_HEADER_LINE, deadline)) not in (b"\r\n", b"\n"):
            if not line:
                self.last_error = "the stream ended inside a part's headers"
                return None
            if len(headers) >= MAX_HEADERS:
                raise ValueError(f"a part with more than {MAX_HEADERS} header lines")
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        if b"jpeg" not in headers.get(b"content-type", b"image/jpeg").lower():
            raise ValueError("a part that is not a JPEG")
        if b"content-length" in headers:
            length = int(headers[b"content-length"])
            if not 0 < length <= self._max_part:
                raise ValueError(f"a part of {length} bytes (the limit is {self._max_part})")
            jpeg = body.read_exact(length, deadline)
            if len(jpeg) < length:
                self.last_error = "the stream ended inside a part"
                return None
        else:
            jpeg = self._until_boundary(marker, deadline)
            self._at_headers = True
        size = jpeg_size(jpeg)
        if size is not None and max(size) > MAX_SIZE_PX:
            raise ValueError(
                f"a {size[0]}x{size[1]} frame, over the {MAX_SIZE_PX} px limit of a side"
            )
        arrived_ns = time.monotonic_ns()
        return RawFrame(None, arrived_ns / 1e9 - self._t0, arrived_ns, jpeg=jpeg)

    def _until_boundary(self, marker: bytes, deadline: float) -> bytes:
        """A part without Content-Length: its bytes up to the next boundary line."""
        data = bytearray()
        while len(data) <= self._max_part:
            line = self._body.readline(self._max_part, deadline)
            if not line:
                raise ValueError("the stream ended inside a part")
            if line.strip() in (marker, marker + b"--"):  # the next part, or the last one
                self._ended = line.strip() != marker
                return bytes(data).removesuffix(b"\r\n")
            data += line
        raise ValueError(f"a part over {self._max_part} bytes")

    def status(self) -> ReaderStatus:
        return ReaderStatus(CameraState.STREAMING, live=True)

    def close(self) -> None:
        self._conn.close()
        response = getattr(self, "_response", None)
        if response is not None:
            response.close()


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
