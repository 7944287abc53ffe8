"""MJPEG over HTTP (`multipart/x-mixed-replace`), read without decoding.

IP cameras and `drivepercept serve-cameras` stream MJPEG: every part is a whole JPEG, so a
frame can be decoded on its own, later, on any thread. OpenCV's reader decodes every part on
the thread that reads the socket, including the ones a live run drops for newer frames (most
of them when the model is slower than the cameras). `MjpegReader` reads the parts with the
standard library's HTTP client and hands each one over still encoded (`RawFrame.jpeg`): the
batcher decodes only the frames it takes. The first good part is decoded at open, for the
size.

A response that is not a multipart stream (an MP4 or HLS URL, a snapshot page) raises
`NotMjpegError`, and the caller opens the URL with OpenCV instead.

Nothing the camera sends is trusted (`bounded.py`): a part must arrive whole within
`read_timeout_s` (the first within `open_timeout_s`), its header lines are at most
`MAX_HEADER_LINE` bytes and `MAX_HEADERS` lines, its body at most `max_part_mb`, and a stop
ends a read within `bounded.SLICE_S`. A part that breaks one of these bounds breaks the
stream's framing: it ends the connection with the reason (`last_error`), which the reconnect
supervisor reports.

A whole part whose picture cannot be used is one bad frame, not a broken stream: a part that
is not a JPEG (its Content-Type), or whose JPEG header says a size over the one frame limit
or says none (`imagesize.frame_refusal`, before any decoding), is handed over as a refused
frame (`RawFrame.refused`: the reason, not the bytes), counted as undecodable where every
frame is, and the connection stays up. At open, refused parts are skipped until a good one,
which gives the size, and handed over before it; `OPEN_MAX_REFUSED` of them in a row and no
good one fail the open, with the count and the last reason.
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import re
import socket
import threading
import time
from urllib.parse import SplitResult, urlsplit

from drivepercept.config import ReconnectPolicy
from drivepercept.errors import one_line
from drivepercept.sources.bounded import BodyError, BoundedBody
from drivepercept.sources.imagesize import frame_refusal
from drivepercept.sources.probe import basic_auth, camera_tls, http_phrase
from drivepercept.sources.readers import CorruptFrameError, RawFrame, SourceError, SourceInfo
from drivepercept.types import CameraState, ReaderStatus

MAX_PART_BYTES = 8 << 20  # the default bound of a part (`ReconnectPolicy.max_part_mb`)
MAX_HEADER_LINE = 8192  # bytes in one header or boundary line
MAX_HEADERS = 64  # header lines of one part
# parts refused in a row at open, with no good one, before the open gives up: a second of a
# 25 fps camera (each is also bounded by the open timeout)
OPEN_MAX_REFUSED = 25
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
        SourceError: the connection or the HTTP status failed, or no good frame came
            (within the open timeout, or in `OPEN_MAX_REFUSED` parts): one line, naming the
            URL and the reason.
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
        # the frames read at open (refused ones, then the first good one), given first
        self._opened: collections.deque[RawFrame] = collections.deque()
        self._at_headers = False  # the boundary line of the next part was already read
        self._ended = False  # the final boundary was read
        try:
            self._boundary = self._request(parts)
            self._body = BoundedBody(self._response, self._sock, stop)
            self._t0 = time.monotonic_ns() / 1e9
            # the open, the response and the first frame together within the open timeout
            width, height = self._first_frame(opened + policy.open_timeout_s)
        except BaseException:
            self._conn.close()
            raise
        self.info = SourceInfo(width, height, 0.0, -1)

    def _first_frame(self, deadline: float) -> tuple[int, int]:
        """Reads parts until one decodes: its (width, height). The refused parts before it
        are kept (their reasons only) and handed over before it, so that they are counted.

        Raises:
            SourceError: the stream broke or ended, the deadline passed, or
                `OPEN_MAX_REFUSED` parts in a row were refused.
        """
        while True:
            frame = self._part(deadline)
            if frame is None:
                why = self.last_error or "the stream ended before its first frame"
                raise SourceError(f"cannot open {self.source}: {why}")
            if frame.refused is None:
                try:
                    height, width = frame.image_bgr.shape[:2]
                except CorruptFrameError as exc:  # a header that passed, data that did not
                    frame = dataclasses.replace(frame, jpeg=None, refused=str(exc))
                else:
                    self._opened.append(frame)
                    return width, height
            self._opened.append(frame)
            if len(self._opened) >= OPEN_MAX_REFUSED:
                raise SourceError(
                    f"cannot open {self.source}: {len(self._opened)} undecodable frames in a "
                    f"row and no good one (the last: {frame.refused})"
                )

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
        if self._opened:
            return self._opened.popleft()
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
        arrived_ns = time.monotonic_ns()
        pts_s = arrived_ns / 1e9 - self._t0
        kind = headers.get(b"content-type", b"image/jpeg")
        why: str | None
        if b"jpeg" not in kind.lower():
            why = f"a part of {one_line(kind.decode('latin-1'), limit=64)}, not a JPEG"
        else:
            why = frame_refusal(jpeg)  # its size from its header: nothing decoded
        if why is not None:  # one bad frame: counted, the stream goes on
            return RawFrame(None, pts_s, arrived_ns, refused=f"refused before decoding: {why}")
        return RawFrame(None, pts_s, arrived_ns, jpeg=jpeg, checked=True)

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
