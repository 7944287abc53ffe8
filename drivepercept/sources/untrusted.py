"""What a recording may hold, and the means to read one that holds more: the size limits of
its messages and chunks (from the one frame limit, `imagesize.MAX_FRAME_BYTES`), bounded
inflation, the room every reader of the process reads its chunks in (`Room`, `Share`),
decoders of messages that build no more than their bytes (`decoder_for`), files opened only
when they are regular files, and a parse shared by the cameras that read one file.

A recording's sizes are claims, not facts: a 409 KB MCAP may declare a 2 GiB image, whose
zstd frame inflates to it. Every decompressor here is asked for at most the declared size
plus one byte, after the declared size was checked against the limit, so that neither a
declared size over the limit nor a stream longer than it declares costs more than the limit.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterable
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
# a container's report of a chunk it skipped: (why, the topic's messages in it, None when
# nothing says)
OnDamage = Callable[[str, "int | None"], None]
Message = tuple[int, str, Callable[[], Any]]  # (log time ns, type name, decode)

log = logging.getLogger(__name__)


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
_cache_lock = threading.Lock()  # the cache's own state, held for a moment
_parsing: dict[Hashable, threading.Lock] = {}  # one lock per key being parsed
_CACHED = 16


def parsed_once(key: Hashable, parse: Callable[[], T]) -> T:
    """`parse()`, once per `key` (`version_key`: a file's device, inode, size and change
    times, so an edited file is parsed again): the cameras of one recording, each opening it,
    share one parse of its index or metadata. The last few keys are kept. Cameras opening
    one file at once wait for its one parse; a slow file (NFS) delays no other file's."""
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]  # type: ignore[no-any-return]
        lock = _parsing.setdefault(key, threading.Lock())
    with lock:
        with _cache_lock:
            if key in _cache:  # parsed by the camera this one waited for
                return _cache[key]  # type: ignore[no-any-return]
        try:
            value = parse()
        finally:
            with _cache_lock:
                _parsing.pop(key, None)
        with _cache_lock:
            _cache[key] = value
            while len(_cache) > _CACHED:
                _cache.popitem(last=False)
        return value


def version_key(st: os.stat_result, what: str) -> Hashable:
    """The key of one version of a file, for `parsed_once`."""
    return (what, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Room:
    """The bytes that the recording readers of this process hold at once: chunks being read
    and inflated, and the messages taken out of them until each has been given and decoded.
    Each camera reads on its own thread; without a room shared by all, six cameras reading
    chunks at the limit would each hold a chunk and its messages at once (measured: 1.35 GB
    with four). Small chunks share it; one at the limit has it alone (a chunk over the limit
    is refused before it asks). Each reader holds its part through a `Share`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held = 0
        self.cond = threading.Condition()
        self.shares: set[Share] = set()  # those holding bytes

    def others_moving(self, share: Share) -> bool:
        """Whether a share other than `share` holds bytes and may give them back while
        `share`'s thread waits: one last used on this same thread (a camera opened before
        this one, its reader paused) or on a thread that ended never will."""
        me = threading.current_thread()
        return any(
            s is not share and s.thread is not me and s.thread.is_alive() for s in self.shares
        )


class Share:
    """One reader's part of a `Room` (one generator of messages): grown before a chunk is
    read, shrunk as the chunk is dropped and as each message is given; `hold(0)` in the
    generator's `finally:`.

    A share that holds bytes never waits for more (two readers each holding some and waiting
    for the other would wait forever): it takes what it may at once (`try_hold`), else it
    first gives what it holds. A share that holds nothing waits while readers on other
    threads hold what would not fit; after `PATIENCE_S` it warns and goes on (a reader whose
    frames are paced far apart, or stuck).
    """

    def __init__(self, room: Room | None = None) -> None:
        self.room = ROOM if room is None else room
        self.bytes = 0
        self.thread = threading.current_thread()

    def hold(self, size: int) -> None:
        """Hold `size` bytes (at most the room's size), waiting for room as above."""
        self._hold(size, wait=True)

    def try_hold(self, size: int) -> bool:
        """Hold `size` bytes if they fit now; False (nothing changed) if not."""
        return self._hold(size, wait=False)

    def _hold(self, size: int, *, wait: bool) -> bool:
        room = self.room
        size = min(max(size, 0), room.size)
        with room.cond:
            self.thread = threading.current_thread()
            started = time.monotonic()
            while size > self.bytes and room.held + size - self.bytes > room.size:
                if not wait:
                    return False
                if self.bytes or not room.others_moving(self):
                    break  # (see the class docstring)
                if time.monotonic() - started >= PATIENCE_S:
                    log.warning(
                        "a recording reader waited %.0f s for room to read a chunk; it reads "
                        "on over the %d bytes the readers may hold at once",
                        PATIENCE_S,
                        room.size,
                    )
                    break
                room.cond.wait(1.0)
            room.held += size - self.bytes
            if size < self.bytes:
                room.cond.notify_all()
            self.bytes = size
            (room.shares.add if size else room.shares.discard)(self)
        return True


PATIENCE_S = 30.0
ROOM = Room(MAX_CHUNK_BYTES)


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


def merged_topics(
    topics: Iterable[Topic], room_bytes: int | None = None, smallest_bytes: int = 1
) -> list[Topic]:
    """Topics of one name (several channels, connections or files) as one, with its first
    type and the sum of its counts (unknown when any is); counts that the `room_bytes` of the
    files cannot hold, alone or all summed, are unknown (`plausible`; None: not checked)."""
    out: dict[str, Topic] = {}
    for t in topics:
        if (seen := out.get(t.name)) is not None:
            count = -1 if t.count < 0 or seen.count < 0 else t.count + seen.count
            t = Topic(t.name, seen.msgtype, count)
        out[t.name] = t
    if room_bytes is None:
        return list(out.values())
    total = sum(max(t.count, 0) for t in out.values())
    if plausible(total, room_bytes, smallest_bytes) < 0:  # together they cannot be there
        return [Topic(t.name, t.msgtype, -1) for t in out.values()]
    return [
        Topic(t.name, t.msgtype, plausible(t.count, room_bytes, smallest_bytes))
        for t in out.values()
    ]


# ------------------------------------------------------------------ decoding


@functools.cache
def _standard_store(ros1: bool) -> Any:
    """rosbags' type store of the standard message definitions (ROS 1 Noetic, ROS 2 Humble)."""
    if not ros1:
        from drivepercept.recording.messages import typestore

        return typestore()
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS1_NOETIC)


def decoder_for(msgtype: str, *, ros1: bool, own: Callable[[], Any]) -> Callable[[Buffer], Any]:
    """How a message of `msgtype` is decoded by rosbags (CDR, or ROS 1 with `ros1`).

    A type the standard store defines (`sensor_msgs/msg/CompressedImage`, `Image`,
    `CameraInfo`) is decoded by the standard definition, not the recording's own: a schema
    that adds a field such as `Nothing[] junk` (an empty message: one byte each, one Python
    object each) would build 100 times its bytes; a message that does not fit the standard
    definition fails its decode (one skipped frame). Any other type is decoded by the
    recording's definition (`own()`, a store holding it) only when that holds no sequence of
    strings or messages (primitive arrays come back as numpy views); else its decode fails.
    Bytes are read in place (a view: `uint8[]` data is not copied).
    """
    standard = _standard_store(ros1)
    store = standard if msgtype in standard.fielddefs else own()
    why = None if store is standard else _unbounded(store, msgtype, set())
    if why is not None:
        return functools.partial(refused, f"its type {msgtype} holds {why}")
    deserialize = store.deserialize_ros1 if ros1 else store.deserialize_cdr

    def decode(data: Buffer) -> Any:
        return deserialize(memoryview(data), msgtype)

    return decode


def refused(why: str, data: Buffer) -> Any:
    """A decode that fails: `functools.partial(refused, why)`."""
    raise RefusedError(why)


def _unbounded(store: Any, msgtype: str, seen: set[str]) -> str | None:
    """A field of `msgtype` (or of a type it holds) whose decode may build far more than its
    bytes (a sequence or array of strings or messages); None when it has none."""
    from rosbags.interfaces import Nodetype

    if msgtype in seen:
        return None
    seen.add(msgtype)
    if msgtype not in store.fielddefs:
        return f"an unknown type {msgtype[:80]}"
    for name, (kind, desc) in store.fielddefs[msgtype][1]:
        if kind in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            (inner, what), _ = desc
            if inner != Nodetype.BASE or what[0] in ("string", "wstring"):
                return f"a sequence {name} of {what if inner != Nodetype.BASE else what[0]}"
        elif kind == Nodetype.NAME and (why := _unbounded(store, desc, seen)) is not None:
            return why
    return None
