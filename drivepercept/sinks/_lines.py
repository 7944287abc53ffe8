"""An append-only text file that only ever holds whole lines, for the line-based sinks.

Why not a plain buffered `open()`: its buffer is flushed in fixed-size chunks, so a run killed
between two flushes leaves a file that ends in half a line. Here complete lines are collected in
memory and handed to the OS in one unbuffered write of whole lines (when `flush_bytes` are
pending, when `flush_interval_s` has passed since the last write, and at `close()`), so the file
on disk ends at a line boundary however the run stops (barring a kill inside that one write
call). No frame pays for a system call, let alone an fsync.

Not thread-safe: the pipeline calls sinks from its one emit thread.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from pathlib import Path

from drivepercept.errors import OutputError

log = logging.getLogger(__name__)

FLUSH_BYTES = 1 << 16
FLUSH_INTERVAL_S = 1.0


def reason(exc: OSError) -> str:
    """The one-line reason of an OSError ("No such file or directory", not the errno tuple)."""
    return (exc.strerror or str(exc) or type(exc).__name__).replace("\n", " ")


def open_for_writing(path: Path, *, what: str) -> io.FileIO:
    """Create `path` (and its missing parent folders) for writing, unbuffered, truncating it.

    Raises:
        OutputError: the folder or the file cannot be created (one-line message).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return io.FileIO(path, "w")
    except OSError as exc:
        raise OutputError(f"cannot create {what} {path}: {reason(exc)}") from None


class LineFile:
    """Whole lines, buffered in memory, written to `path` in whole-line chunks.

    Args:
        path: the file to create (truncated if it exists; missing parent folders are made).
        what: what the file is, for error messages ("detections file").
        flush_bytes: write once this many characters are pending.
        flush_interval_s: write at the next line once this long has passed since the last write,
            so a live run's file can be followed while it grows.

    Raises:
        OutputError: the file cannot be created.
    """

    def __init__(
        self,
        path: Path,
        *,
        what: str,
        flush_bytes: int = FLUSH_BYTES,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        self.path = path
        self._what = what
        self._flush_bytes = flush_bytes
        self._flush_interval_s = flush_interval_s
        self._file: io.FileIO | None = open_for_writing(path, what=what)
        self._pending: list[str] = []
        self._pending_chars = 0
        self._last_write_s = time.monotonic()
        self.lines = 0

    @property
    def closed(self) -> bool:
        return self._file is None

    def append(self, line: str) -> None:
        """Queue one complete line (it must end with a newline); may write pending lines.

        Raises:
            OutputError: the file cannot be written (disk full, ...).
            ValueError: the file is closed.
        """
        if self._file is None:
            raise ValueError(f"{self._what} {self.path} is closed")
        self._pending.append(line)
        self._pending_chars += len(line)
        self.lines += 1
        if (
            self._pending_chars >= self._flush_bytes
            or time.monotonic() - self._last_write_s >= self._flush_interval_s
        ):
            self.flush()

    def flush(self) -> None:
        """Write every pending line now, as one chunk of whole lines.

        Raises:
            OutputError: the file cannot be written.
        """
        if self._file is None or not self._pending:
            return
        # Take the lines before writing: an interrupt during the write loses them rather than
        # writing them twice at close().
        pending, self._pending, self._pending_chars = self._pending, [], 0
        data = memoryview("".join(pending).encode("utf-8"))
        start = self._file.tell()
        try:
            while data:
                written = self._file.write(data)
                if not written:  # a regular file either takes bytes or raises
                    raise OSError(f"the file took no bytes ({written!r})")
                data = data[written:]
        except OSError as exc:
            # a full disk takes part of a chunk, then refuses: cut the file back to its last
            # whole line, so that what was written stays a valid file
            with contextlib.suppress(OSError):
                self._file.truncate(start)
                self._file.seek(start)
            raise OutputError(f"cannot write {self._what} {self.path}: {reason(exc)}") from None
        self._last_write_s = time.monotonic()

    def close(self) -> None:
        """Write what is pending and close the file; closing twice is a no-op.

        Raises:
            OutputError: the pending lines cannot be written (the file is closed all the same).
        """
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            file, self._file = self._file, None
            file.close()
            log.debug("closed %s %s (%d lines)", self._what, self.path, self.lines)
