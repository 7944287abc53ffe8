"""What a recording may hold, and the means to read one that holds more: the size limits of
its messages and chunks (from the one frame limit, `imagesize.MAX_FRAME_BYTES`), bounded
inflation, files opened only when they are regular files, and a parse shared by the cameras
that read one file.

A recording's sizes are claims, not facts: a 409 KB MCAP may declare a 2 GiB image, whose
zstd frame inflates to it. Every decompressor here is asked for at most the declared size
plus one byte, after the declared size was checked against the limit, so that neither a
declared size over the limit nor a stream longer than it declares costs more than the limit.
"""

from __future__ import annotations

import collections
import contextlib
import os
import stat
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from drivepercept.sources.imagesize import MAX_FRAME_BYTES
from drivepercept.sources.readers import SourceError

MiB = 1 << 20
# one message: the largest frame and its header (CDR fields, format, frame id)
MAX_MESSAGE_BYTES = MAX_FRAME_BYTES + MiB
# one chunk: a message of the largest frame and a writer's usual chunk of smaller ones
MAX_CHUNK_BYTES = MAX_FRAME_BYTES + 16 * MiB
MAX_METADATA_BYTES = MiB  # a ROS 2 bag's metadata.yaml: a few KB in a real bag

T = TypeVar("T")
Buffer = bytes | memoryview


class RefusedError(Exception):
    """A chunk, record or message not read: over a limit, lying about its size, or damaged."""


@dataclass(frozen=True)
class Topic:
    """A topic of a recording: its name, message type and message count (-1: unknown)."""

    name: str
    msgtype: str
    count: int


def open_regular(path: Path) -> IO[bytes]:
    """`path` opened for reading if it is a regular file; a FIFO, device or folder is refused
    without blocking (opened non-blocking, checked, then made blocking).

    Raises:
        SourceError: not a regular file, or it cannot be opened.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SourceError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SourceError(f"{path} is {file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_kind(mode: int) -> str:
    """What a file is, in words ("a FIFO", "a folder", ...)."""
    kinds: list[tuple[Callable[[int], bool], str]] = [
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ]
    return next((name for test, name in kinds if test(mode)), "a special file")


_cache: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
_cache_lock = threading.Lock()
_CACHED = 16


def parsed_once(key: Hashable, parse: Callable[[], T]) -> T:
    """`parse()`, once per `key` (`version_key`: a file's device, inode, size and change
    times, so an edited file is parsed again): the cameras of one recording, each opening it,
    share one parse of its index or metadata. The last few keys are kept."""
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]  # type: ignore[no-any-return]
        value = parse()  # under the lock: cameras opening one file at once parse it once
        _cache[key] = value
        while len(_cache) > _CACHED:
            _cache.popitem(last=False)
        return value


def version_key(st: os.stat_result, what: str) -> Hashable:
    """The key of one version of a file, for `parsed_once`."""
    return (what, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_budget = threading.Condition()
_inflating = [0]  # bytes being inflated now, by every reader of this process


@contextlib.contextmanager
def inflating(size: int) -> Iterator[None]:
    """Room for `size` bytes inflated (and their messages taken out) in this process: while
    `MAX_CHUNK_BYTES` are being inflated, another reader waits. Each camera reads on its own
    thread; without this, six cameras reading chunks at the limit would inflate six at once
    (two copies of 272 MiB each). Small chunks share the room; one at the limit has it alone
    (a chunk over the limit is refused before it asks)."""
    size = min(max(size, 0), MAX_CHUNK_BYTES)
    with _budget:
        while _inflating[0] and _inflating[0] + size > MAX_CHUNK_BYTES:
            _budget.wait(1.0)  # the holder inflates one chunk: seconds at most
        _inflating[0] += size
    try:
        yield
    finally:
        with _budget:
            _inflating[0] -= size
            _budget.notify_all()


def inflate(
    data: Buffer, compression: str, size: int | None, *, cap: int = MAX_CHUNK_BYTES
) -> Buffer:
    """`data` inflated (`compression`: "" or "none", "zstd", "lz4", "bz2") to the `size`
    bytes it declares, checked against `cap` first, never taking more than `size + 1` bytes
    from the decompressor; `size` None: whatever it inflates to, up to `cap`. Uncompressed
    data comes back as it was given (a view stays a view: no copy of a 256 MiB chunk).

    Raises:
        RefusedError: `size` over `cap`, data that inflates to more or less than `size` (or
            past `cap`), an unknown compression, or data that does not decompress.
    """
    if size is not None and size > cap:
        raise RefusedError(f"declares {size} bytes inflated, over the {cap} it may hold")
    most = (cap if size is None else size) + 1
    try:
        out = _inflate(data, compression, most)
    except RefusedError:
        raise
    except Exception as exc:  # zstd, lz4 and bz2 errors of damaged data
        raise RefusedError(f"does not decompress ({type(exc).__name__}: {exc})") from None
    if size is None and len(out) > cap:
        raise RefusedError(f"inflates to more than the {cap} bytes it may hold")
    if size is not None and len(out) != size:
        more = "more" if len(out) > size else "less"
        raise RefusedError(f"inflates to {more} than the {size} bytes it declares")
    return out


def _inflate(data: Buffer, compression: str, most: int) -> Buffer:
    """At most `most` bytes of `data` inflated (`zstandard.decompress` and `lz4.frame.
    decompress` would trust the frame header's content size, or inflate all of it)."""
    if compression in ("", "none"):
        return data[:most]
    if compression == "zstd":
        import zstandard

        # (read from the buffer itself: io.BytesIO would copy a view)
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        pieces, got = [], 0
        while got < most and (piece := reader.read(most - got)):
            pieces.append(piece)
            got += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)
    if compression == "lz4":
        import lz4.frame  # type: ignore[import-untyped]  # (no stubs)

        return bytes(lz4.frame.LZ4FrameDecompressor().decompress(data, max_length=most))
    if compression == "bz2":  # one stream after another, as bz2.decompress reads them
        import bz2

        pieces, got, rest = [], 0, data
        while rest and got < most:
            stream = bz2.BZ2Decompressor()
            pieces.append(stream.decompress(rest, max_length=most - got))
            got += len(pieces[-1])
            if not stream.eof:
                break  # `most` reached, or the data ends inside a stream
            rest = stream.unused_data
        return b"".join(pieces)
    raise RefusedError(f"an unknown compression {compression[:40]!r}")


def plausible(count: int, room_bytes: int, smallest_bytes: int) -> int:
    """A message count a container claims, or -1 (unknown) when `room_bytes` cannot hold
    that many messages of at least `smallest_bytes` each: counts are hints, and one of 10^12
    messages in a small file would report 999999999980 frames missing."""
    return count if count >= 0 and count * smallest_bytes <= room_bytes else -1
