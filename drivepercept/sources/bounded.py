"""An HTTP response body read under a deadline, in bounded pieces: what a camera sends is
never trusted to end, to arrive, or to be small.

`BoundedBody` reads the body of an `http.client` response whose headers have been read, from
the connection's socket switched to non-blocking: every wait is a `select` of at most
`SLICE_S`, so a read gives up at its deadline (a camera that drips one byte every half second
never gets a blocked `recv` to hide in) and looks at the stop event between slices (a stop
ends it within `SLICE_S`, whatever the camera does). Lines and byte counts are capped by the
caller: a line that does not end within its limit is an error, not a growing buffer. A
chunked body (`Transfer-Encoding: chunked`) is decoded here, under the same bounds.

Every failure is a `BodyError` whose message says what the camera did ("a line over 8192
bytes", "no data for 2 s", ...): the reconnect supervisor logs it as the reason.
"""

from __future__ import annotations

import select
import ssl
import threading
import time
from typing import Any

SLICE_S = 0.1  # the longest one wait blocks before the deadline and the stop are looked at
_RECV = 65536
MAX_CHUNK_LINE = 1024  # a chunk-size line longer than this is not HTTP


class BodyError(Exception):
    """The body broke a bound, stalled past its deadline, or the read was stopped."""


class BoundedBody:
    """The body of `response` (headers read), read without ever blocking past a deadline.

    Args:
        response: the `http.client.HTTPResponse`.
        sock: its connection's socket (switched to non-blocking here).
        stop: ends any read within `SLICE_S` once set (None: only deadlines end reads).
    """

    def __init__(self, response: Any, sock: Any, stop: threading.Event | None = None) -> None:
        self._fp = response.fp  # the buffered socket file the headers were read from
        self._sock = sock
        self._chunked = bool(getattr(response, "chunked", False))
        self._chunk_left = 0  # data bytes of the current chunk still to come (chunked bodies)
        self._chunk_done = False  # a chunk's data was read: its CRLF comes next
        self._raw = bytearray()  # chunked: bytes read but not yet decoded
        self._buf = bytearray()  # decoded body bytes not yet handed out
        self._eof = False
        self.stop = stop
        sock.setblocking(False)

    # ------------------------------------------------------------------ what callers use

    def readline(self, limit: int, deadline: float) -> bytes:
        """The next line, its end included; what is left at the end of the body (b"" once
        it has ended).

        Raises:
            BodyError: no line end within `limit` bytes, the deadline passed, or stopped.
        """
        start = 0
        while True:
            end = self._buf.find(b"\n", start, limit + 1)
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            if len(self._buf) > limit:
                raise BodyError(f"a line over {limit} bytes")
            start = len(self._buf)
            if not self._fill(deadline):
                line = bytes(self._buf)
                self._buf.clear()
                return line

    def read_exact(self, count: int, deadline: float) -> bytes:
        """`count` bytes, or fewer if the body ends first.

        Raises:
            BodyError: the deadline passed, or stopped.
        """
        while len(self._buf) < count:
            if not self._fill(deadline):
                break
        data = bytes(self._buf[:count])
        del self._buf[:count]
        return data

    # ------------------------------------------------------------------ filling the buffer

    def _fill(self, deadline: float) -> bool:
        """More body bytes into the buffer; False at the end of the body."""
        if not self._chunked:
            data = self._more(deadline)
            self._buf += data
            return bool(data)
        while not self._eof:
            if self._chunk_left == 0 and not self._next_chunk(deadline):
                return False
            if not self._raw and not self._raw_more(deadline):
                return False
            take = min(self._chunk_left, len(self._raw))
            self._buf += self._raw[:take]
            del self._raw[:take]
            self._chunk_left -= take
            self._chunk_done = self._chunk_left == 0
            if take:
                return True
        return False

    def _next_chunk(self, deadline: float) -> bool:
        """Reads the next chunk's size line (after the CRLF that ends the last chunk); False
        at the end of the body (the last, empty chunk, or the connection closed)."""
        if self._chunk_done:  # the CRLF after a chunk's data
            if self._raw_line(deadline) is None:
                return False
            self._chunk_done = False
        line = self._raw_line(deadline)
        if line is None:
            return False
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BodyError("a chunk size that is not a number") from None
        if size <= 0:
            self._eof = True
            return False
        self._chunk_left = size
        return True

    def _raw_line(self, deadline: float) -> bytes | None:
        """A CRLF-ended line of the raw (chunked) stream, without its CRLF; None at its end."""
        while (end := self._raw.find(b"\r\n")) < 0:
            if len(self._raw) > MAX_CHUNK_LINE:
                raise BodyError(f"a chunk-size line over {MAX_CHUNK_LINE} bytes")
            if not self._raw_more(deadline):
                return None
        line = bytes(self._raw[:end])
        del self._raw[: end + 2]
        return line

    def _raw_more(self, deadline: float) -> bool:
        data = self._more(deadline)
        self._raw += data
        return bool(data)

    def _more(self, deadline: float) -> bytes:
        """Some bytes of the connection; b"" (and the end noted) once it is closed."""
        data = self._recv(deadline)
        if not data:
            self._eof = True
        return data

    def _recv(self, deadline: float) -> bytes:
        """Some bytes (b"" at the end of the body), waiting in slices until `deadline`."""
        while True:
            data = self._read_now()
            if data:
                return data
            if self.stop is not None and self.stop.is_set():
                raise BodyError("stopped")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BodyError("the read timeout passed before the part was whole")
            readable, _, _ = select.select([self._sock], [], [], min(SLICE_S, left))
            if readable:
                data = self._read_now()
                # readable with nothing to read: the peer closed (a TLS socket may be
                # readable for a record that holds no data: it waits again)
                if data or not isinstance(self._sock, ssl.SSLSocket):
                    return data

    def _read_now(self) -> bytes:
        """What is there without waiting (b"": nothing yet, or the end of the body)."""
        try:
            data = self._fp.read1(_RECV)
        except (ssl.SSLWantReadError, BlockingIOError):
            return b""
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise BodyError(f"the connection broke ({why})") from None
        return bytes(data or b"")
