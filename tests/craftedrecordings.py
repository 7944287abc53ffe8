"""Recordings crafted to lie, for tests/test_hostile_recordings.py: MCAP files written record
by record (so that a chunk may declare any size, hold any bytes, or be listed in the summary
any number of times), ROS 1 bags whose chunks inflate past what they declare, and ROS 2 bag
folders around them.

Bombs are built cheaply: the zeros they inflate to are compressed piece by piece (a bz2
stream of 64 MiB repeated), never held in memory, and the files stay a few hundred KB.
"""

from __future__ import annotations

import bz2
import collections
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from drivepercept.recording import messages as msgs

MAGIC = b"\x89MCAP0\r\n"
MiB = 1 << 20
GiB = 1 << 30
_PIECE = bytes(16 * MiB)
T0_NS = 1_767_225_600 * 1_000_000_000  # 2026-01-01T00:00:00Z
PERIOD_NS = 50_000_000  # 20 frames/s
FRONT = "/front/image_raw/compressed"


def stamp(k: int) -> int:
    return T0_NS + k * PERIOD_NS


def jpeg(k: int, width: int = 64, height: int = 48) -> bytes:
    """A small JPEG, different for each `k`."""
    image = np.full((height, width, 3), (k * 37) % 256, np.uint8)
    cv2.rectangle(image, (8, 8), (8 + k % 40, 30), (255, 255, 255), -1)
    return cv2.imencode(".jpg", image)[1].tobytes()


def image_message(k: int, frame_id: str) -> bytes:
    """A CompressedImage (CDR) of frame `k`, stamped `stamp(k)`."""
    m = msgs.compressed_image(stamp(k), frame_id, "jpeg", jpeg(k))
    return msgs.serialize(m, msgs.COMPRESSED_IMAGE)


@dataclass(frozen=True)
class Zeros:
    """`size` zero bytes, written and compressed piece by piece, never held."""

    size: int


Piece = bytes | Zeros


def big_image(k: int, frame_id: str, size: int) -> list[Piece]:
    """A CompressedImage whose data is `size` zero bytes (its CDR, never held whole)."""
    empty = msgs.serialize(
        msgs.compressed_image(stamp(k), frame_id, "jpeg", b""), msgs.COMPRESSED_IMAGE
    )
    return [empty[:-4] + struct.pack("<I", size), Zeros(size)]


def _length(pieces: Sequence[Piece]) -> int:
    return sum(p.size if isinstance(p, Zeros) else len(p) for p in pieces)


def _chunks_of(pieces: Iterable[Piece]) -> Iterator[bytes]:
    for p in pieces:
        if isinstance(p, Zeros):
            left = p.size
            while left:
                yield _PIECE[: min(left, len(_PIECE))]
                left -= min(left, len(_PIECE))
        elif p:
            yield p


def compress(pieces: Sequence[Piece], compression: str) -> bytes:
    """`pieces` compressed as one stream ("", "zstd", "lz4"), piece by piece."""
    if compression == "":
        return b"".join(_chunks_of(pieces))
    if compression == "zstd":
        import zstandard

        z = zstandard.ZstdCompressor().compressobj()
        return b"".join([*(z.compress(p) for p in _chunks_of(pieces)), z.flush()])
    import lz4.frame  # type: ignore[import-untyped]

    c = lz4.frame.LZ4FrameCompressor()
    return b"".join([c.begin(), *(c.compress(p) for p in _chunks_of(pieces)), c.flush()])


def bz2_zeros(size: int) -> bytes:
    """`size` zero bytes as bz2 streams one after another (64 MiB each: built in 0.7 s,
    ~50 bytes each), which `bz2.decompress` reads as one."""
    unit = 64 * MiB
    assert size % unit == 0
    c = bz2.BZ2Compressor(9)
    stream = b"".join([*(c.compress(_PIECE) for _ in range(unit // len(_PIECE))), c.flush()])
    return stream * (size // unit)


# ------------------------------------------------------------------ MCAP, record by record


def _record(opcode: int, body: bytes) -> bytes:
    return struct.pack("<BQ", opcode, len(body)) + body


def _string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<I", len(data)) + data


def _message_record(channel: int, log_time: int, data: Sequence[Piece]) -> list[Piece]:
    head = struct.pack("<BQHIQQ", 0x05, 22 + _length(data), channel, 0, log_time, log_time)
    return [head, *data]


@dataclass
class _ChunkIndex:
    start_time: int
    end_time: int
    offset: int
    length: int
    index_offsets: dict[int, int]
    index_length: int
    compression: str
    compressed: int
    uncompressed: int

    def record(self) -> bytes:
        offsets = b"".join(struct.pack("<HQ", c, o) for c, o in self.index_offsets.items())
        body = struct.pack("<QQQQ", self.start_time, self.end_time, self.offset, self.length)
        body += _string(offsets) + struct.pack("<Q", self.index_length)
        body += _string(self.compression) + struct.pack("<QQ", self.compressed, self.uncompressed)
        return _record(0x08, body)


class McapCraft:
    """An MCAP file written record by record: `schema`, `channel`, `chunk` (whatever it
    declares), then `finish` (the summary, which may list a chunk many times, claim any
    counts, or be cut short)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.out = path.open("wb")
        self.out.write(MAGIC + _record(0x01, _string("ros2") + _string("crafted")))
        self.schemas: list[bytes] = []
        self.channels: list[bytes] = []
        self.indexes: list[_ChunkIndex] = []
        self.counts: collections.Counter[int] = collections.Counter()
        self._ids = 0

    def schema(
        self,
        name: str = msgs.COMPRESSED_IMAGE,
        text: bytes | None = None,
        encoding: str = "ros2msg",
    ) -> int:
        """A schema: `name`'s standard definition, or `text` (any definition, any encoding)."""
        self._ids += 1
        text = msgs.msgdef(name).encode() if text is None else text
        body = struct.pack("<H", self._ids) + _string(name) + _string(encoding) + _string(text)
        self.schemas.append(_record(0x03, body))
        self.out.write(self.schemas[-1])  # in the data, as writers do, and in the summary
        return self._ids

    def channel(self, topic: str, schema: int, encoding: str = "cdr") -> int:
        self._ids += 1
        body = struct.pack("<HH", self._ids, schema) + _string(topic) + _string(encoding)
        self.channels.append(_record(0x04, body + struct.pack("<I", 0)))
        self.out.write(self.channels[-1])
        return self._ids

    def chunk(
        self,
        messages: Sequence[tuple[int, int, Sequence[Piece]]],
        *,
        compression: str = "zstd",
        declare: int | None = None,
        data: bytes | None = None,
        padding: Sequence[Piece] = (),
        hole: int = 0,
        data_length: int | None = None,
    ) -> None:
        """One chunk of `messages` (channel, log time, data pieces), then its message
        indexes. `declare`: the size it claims inflated (else its real one); `data`: its
        compressed bytes (else `messages` and `padding` compressed); `padding`: records after
        the messages (e.g. millions of empty ones); `hole`: bytes of nothing after its data,
        inside the record (a sparse file: nothing written); `data_length`: the length of
        its data that it and its index claim (else the real one)."""
        pieces: list[Piece] = []
        entries: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
        for channel, log_time, message in messages:
            entries[channel].append((log_time, _length(pieces)))
            pieces += _message_record(channel, log_time, message)
            self.counts[channel] += 1
        pieces += padding
        size = _length(pieces)
        packed = compress(pieces, compression) if data is None else data
        times = [t for _, t, _ in messages] or [0]
        declared = size if declare is None else declare
        claimed = len(packed) + hole if data_length is None else data_length
        body = struct.pack("<QQQI", min(times), max(times), declared, 0)
        body += _string(compression) + struct.pack("<Q", claimed) + packed
        offset = self.out.tell()
        self.out.write(struct.pack("<BQ", 0x06, len(body) + hole) + body)
        if hole:
            self.out.seek(hole, 1)
        first_index = self.out.tell()
        offsets = {}
        for channel, items in entries.items():
            offsets[channel] = self.out.tell()
            flat = b"".join(struct.pack("<QQ", t, o) for t, o in items)
            self.out.write(_record(0x07, struct.pack("<H", channel) + _string(flat)))
        self.indexes.append(
            _ChunkIndex(
                min(times),
                max(times),
                offset,
                9 + len(body) + hole,
                offsets,
                self.out.tell() - first_index,
                compression,
                claimed,
                declared,
            )
        )

    def finish(
        self,
        *,
        repeat: dict[int, int] | None = None,
        counts: dict[int, int] | None = None,
        cut_summary: bool = False,
    ) -> Path:
        """The data's end and the summary. `repeat`: chunk number -> times its index is
        listed; `counts`: channel -> the message count the statistics claim; `cut_summary`:
        the file cut in the middle of its summary (every chunk whole)."""
        self.out.write(_record(0x0F, struct.pack("<I", 0)))
        summary_start = self.out.tell()
        for record in self.schemas + self.channels:
            self.out.write(record)
        for k, index in enumerate(self.indexes):
            self.out.write(index.record() * (repeat or {}).get(k, 1))
        claimed = dict(self.counts) | (counts or {})
        times = [i.start_time for i in self.indexes] + [i.end_time for i in self.indexes]
        stats = struct.pack(
            "<QHIIIIQQ",
            sum(claimed.values()),
            len(self.schemas),
            len(self.channels),
            0,
            0,
            len(self.indexes),
            min(times),
            max(times),
        )
        per = b"".join(struct.pack("<HQ", c, n) for c, n in claimed.items())
        self.out.write(_record(0x0B, stats + _string(per)))
        end = self.out.tell()
        self.out.write(_record(0x02, struct.pack("<QQI", summary_start, 0, 0)) + MAGIC)
        if cut_summary:
            self.out.truncate(summary_start + (end - summary_start) // 2)
        self.out.close()
        return self.path


def drive(
    path: Path,
    cameras: Sequence[str] = ("front", "back"),
    frames: int = 20,
    *,
    middle: Any = None,
) -> tuple[McapCraft, dict[str, int]]:
    """A drive of `frames` frames a camera (topics /CAM/image_raw/compressed), one chunk a
    frame time (all cameras); `middle(craft, ids)` writes crafted chunks halfway. Returns the
    craft (`finish` it) and camera -> channel id."""
    craft = McapCraft(path)
    schema = craft.schema()
    ids = {cam: craft.channel(f"/{cam}/image_raw/compressed", schema) for cam in cameras}
    for k in range(frames):
        if k == frames // 2 and middle is not None:
            middle(craft, ids)
        craft.chunk([(ids[cam], stamp(k), [image_message(k, cam)]) for cam in cameras])
    return craft, ids


# ------------------------------------------------------------------ bags


def ros1_bag(
    path: Path,
    frames: int = 20,
    *,
    bomb_at: int | None = None,
    bomb: bytes = b"",
    junk_at: int | None = None,
    junk: int = 0,
    repeat_first_chunk: int = 1,
) -> Path:
    """A ROS 1 bag (bz2) of one camera (/front/image_raw/compressed), a chunk a frame; the
    chunk of frame `bomb_at` holds its frame followed, in its compressed data only, by
    `bomb` (bz2 streams): its header declares the frame's size, its data inflates past it.
    Frame `junk_at` is of a second connection whose CompressedImage definition adds
    `junk_msgs/Nothing[] junk`, with `junk` of them; the first chunk's info is listed
    `repeat_first_chunk` times in the bag's index."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    t = store.types
    name = "sensor_msgs/msg/CompressedImage"
    armed = {"now": False}

    def compressor(data: bytes) -> bytes:
        return bz2.compress(data, 9) + (bomb if armed["now"] else b"")

    w = Writer(path)
    w.set_compression(Writer.CompressionFormat.BZ2)
    with w:
        w.compressor = compressor
        w.chunk_threshold = 1  # a chunk a message
        conn = w.add_connection(FRONT, name, typestore=store)
        junk_conn = conn
        if junk_at is not None:
            text, _ = store.generate_msgdef(name)
            junk_store = get_typestore(Stores.EMPTY)
            main, sep, rest = text.partition("=" * 80)
            section = "=" * 80 + "\nMSG: junk_msgs/Nothing\n"
            junk_text = main.rstrip("\n") + "\njunk_msgs/Nothing[] junk\n" + sep + rest + section
            junk_store.register(get_types_from_msg(junk_text, name))
            msgdef, md5 = junk_store.generate_msgdef(name)
            junk_conn = w.add_connection(FRONT, name, msgdef=msgdef, md5sum=md5, callerid="junk")
        for k in range(frames):
            s = stamp(k)
            header = t["std_msgs/msg/Header"](
                seq=k,
                stamp=t["builtin_interfaces/msg/Time"](sec=s // 10**9, nanosec=s % 10**9),
                frame_id="front",
            )
            m = t[name](header=header, format="jpeg", data=np.frombuffer(jpeg(k), np.uint8))
            armed["now"] = k == bomb_at
            data = bytes(store.serialize_ros1(m, name))
            if k == junk_at:
                w.write(junk_conn, s, data + struct.pack("<I", junk))
            else:
                w.write(conn, s, data)
    if repeat_first_chunk > 1:
        _repeat_first_chunk_info(path, repeat_first_chunk)
    return path


def _repeat_first_chunk_info(path: Path, times: int) -> None:
    """The bag's index rewritten to list its first chunk's info `times` times."""
    import io

    from rosbags.rosbag1.reader import Header

    data = bytearray(path.read_bytes())
    bag_header = Header.read(io.BytesIO(data[13:]))
    index_pos = bag_header.get_uint64("index_pos")
    conns, chunks = bag_header.get_uint32("conn_count"), bag_header.get_uint32("chunk_count")

    def record_end(pos: int) -> int:
        (header,) = struct.unpack_from("<I", data, pos)
        (body,) = struct.unpack_from("<I", data, pos + 4 + header)
        return int(pos + 8 + header + body)

    pos = index_pos
    for _ in range(conns):
        pos = record_end(pos)
    first, end = pos, record_end(pos)
    at = data.index(b"chunk_count=", 13) + len(b"chunk_count=")
    data[at : at + 4] = struct.pack("<I", chunks + times - 1)
    path.write_bytes(bytes(data[:end]) + bytes(data[first:end]) * (times - 1) + bytes(data[end:]))


def ros2_bag(folder: Path, frames: int = 4, *, compression: str = "") -> Path:
    """A ROS 2 bag folder (MCAP storage) of one camera, written by rosbags; `compression`:
    its `compression_mode` ("file", "message"; zstd), none when empty."""
    from rosbags.rosbag2 import CompressionFormat, CompressionMode, StoragePlugin, Writer

    store = msgs.typestore()
    w = Writer(folder, version=8, storage_plugin=StoragePlugin.MCAP)
    if compression:
        w.set_compression(CompressionMode[compression.upper()], CompressionFormat.ZSTD)
    with w:
        conn = w.add_connection(FRONT, msgs.COMPRESSED_IMAGE, typestore=store)
        for k in range(frames):
            w.write(conn, stamp(k), image_message(k, "front"))
    return folder


def storage_files(folder: Path) -> list[Path]:
    """The storage files a ROS 2 bag's metadata.yaml lists."""
    from ruamel.yaml import YAML

    info = YAML(typ="safe").load((folder / "metadata.yaml").read_text())
    return [
        folder / Path(p).name for p in info["rosbag2_bagfile_information"]["relative_file_paths"]
    ]


# ------------------------------------------------------------------ messages that build more


def junk_schema(name: str = msgs.COMPRESSED_IMAGE) -> bytes:
    """`name`'s standard definition with a last field `junk_msgs/Nothing[] junk`: an empty
    message, one byte each in CDR (none in ROS 1), one Python object each when decoded."""
    main, sep, rest = msgs.msgdef(msgs.COMPRESSED_IMAGE).partition("=" * 80)
    section = "=" * 80 + "\nMSG: junk_msgs/Nothing\n"
    return (main.rstrip("\n") + "\njunk_msgs/Nothing[] junk\n" + sep + rest + section).encode()


def junk_message(k: int, frame_id: str, junk: int) -> list[Piece]:
    """Frame `k`'s CompressedImage (CDR) followed by `junk` empty messages (`junk_schema`)."""
    head = image_message(k, frame_id)
    head += bytes(-len(head) % 4) + struct.pack("<I", junk)
    return [head, Zeros(junk)]


def json_image(k: int, *, data: bytes | None = None, sec: int | None = None) -> bytes:
    """A Foxglove CompressedImage as JSON: frame `k`'s JPEG in base64, or `data` as it is
    (e.g. a list of a million `{}`), stamped `sec` seconds (else `stamp(k)`)."""
    import base64

    s = stamp(k)
    seconds = s // 10**9 if sec is None else sec
    body = data if data is not None else b'"' + base64.b64encode(jpeg(k)) + b'"'
    head = f'{{"timestamp": {{"sec": {seconds}, "nsec": {s % 10**9}}}, "frame_id": "front", '
    return head.encode() + b'"format": "jpeg", "data": ' + body + b"}"


def protobuf_schema(junk: bool = False) -> bytes:
    """A FileDescriptorSet of foxglove.CompressedImage (and google.protobuf.Timestamp); with
    `junk`, a field `repeated Nothing junk = 9` (an empty message: 2 bytes each)."""
    from google.protobuf import descriptor_pb2 as d  # type: ignore[import-untyped]

    f = d.FieldDescriptorProto
    fds = d.FileDescriptorSet()
    ts = fds.file.add(name="google/protobuf/timestamp.proto", package="google.protobuf")
    ts.syntax = "proto3"
    t = ts.message_type.add(name="Timestamp")
    t.field.add(name="seconds", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    t.field.add(name="nanos", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    image = fds.file.add(name="foxglove/CompressedImage.proto", package="foxglove")
    image.syntax = "proto3"
    image.dependency.append("google/protobuf/timestamp.proto")
    m = image.message_type.add(name="CompressedImage")
    m.field.add(
        name="timestamp",
        number=1,
        type=f.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=f.LABEL_OPTIONAL,
    )
    m.field.add(name="frame_id", number=4, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    m.field.add(name="data", number=2, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    m.field.add(name="format", number=3, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    if junk:
        image.message_type.add(name="Nothing")
        m.field.add(
            name="junk",
            number=9,
            type=f.TYPE_MESSAGE,
            type_name=".foxglove.Nothing",
            label=f.LABEL_REPEATED,
        )
    return bytes(fds.SerializeToString())


def protobuf_image(k: int, junk: int = 0) -> bytes:
    """Frame `k` as a foxglove.CompressedImage in protobuf's wire format, with `junk` empty
    `Nothing` messages (field 9) after it."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def field(number: int, data: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(data)) + data

    s = stamp(k)
    ts = varint(1 << 3) + varint(s // 10**9) + varint(2 << 3) + varint(s % 10**9)
    body = field(1, ts) + field(4, b"front") + field(2, jpeg(k)) + field(3, b"jpeg")
    return body + b"\x4a\x00" * junk
