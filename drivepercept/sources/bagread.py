"""ROS bags read under the same bounds as MCAP files (`untrusted`), with rosbags for what it
does safely (a ROS 1 bag's index, the SQLite storage of a ROS 2 bag, deserializing messages).

* A ROS 2 bag folder's `metadata.yaml` is read by us, once per file version: a regular file
  of at most `MAX_METADATA_BYTES` (a real one is a few KB; a 15 MB one took rosbags 119 s),
  parsed by ruamel.yaml's safe loader (rosbags' own dependency). Its storage files must be
  regular files (a FIFO would block the reader forever). `compression_mode: file` is refused
  (see `ros2_metadata`); `compression_mode: message` is inflated message by message under
  the message limit. Its MCAP storage is read by `mcapread` (not by rosbags, which inflates
  whole chunks), its SQLite storage by rosbags on the storage files themselves (no
  metadata.yaml parse of its own: SQLite holds no compressed chunks).
* A ROS 1 bag is opened by rosbags (its index, connections and types), but its chunks are
  read here: one at a time, in the order of their first message, each checked against the
  file and the chunk limit, inflated by a bounded decompressor (bz2, lz4) to the size its
  header declares, and skipped (reported with its messages of the topic) when it fails.
"""

from __future__ import annotations

import functools
import io
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import (
    MAX_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_METADATA_BYTES,
    MiB,
    RefusedError,
    Topic,
    file_kind,
    inflate,
    inflating,
    open_regular,
    parsed_once,
    plausible,
    version_key,
)

STORAGES = ("mcap", "sqlite3")
ROS1_MAGIC = b"#ROSBAG V2.0\n"
MAX_STORAGE_FILES = 10_000  # storage files a metadata.yaml may list (a day's bag: hundreds)
_MIN_ROS1_MESSAGE = 12  # a ROS 1 bag's index entry per message: time and offset
_MIN_SQLITE_MESSAGE = 16  # a SQLite row's id, topic and timestamp at least

OnDamage = Callable[[str, "int | None"], None]
Message = tuple[int, str, Callable[[], Any]]  # (log time ns, type name, decode)


# ------------------------------------------------------------------ ROS 2 metadata


@dataclass(frozen=True)
class Ros2Metadata:
    """What a ROS 2 bag's metadata.yaml says that the reading needs."""

    storage: str  # "mcap" or "sqlite3"
    files: tuple[Path, ...]  # its storage files, each a regular file
    message_compression: str  # "" or "zstd" (compression_mode: message)


def ros2_metadata(folder: Path) -> Ros2Metadata:
    """The metadata of the ROS 2 bag `folder`, read and checked once per file version.

    `compression_mode: file` is refused: rosbags would inflate every storage file into the
    system's temporary folder on every open (a 131 KB file to 4 GB, outside `--out`), and
    the sources open before the run folder exists; a bag is decompressed once, with ROS's own
    tools, far more cheaply than on each replay.

    Raises:
        SourceError: metadata.yaml or a storage file that is not a regular file, a
            metadata.yaml over the limit or that does not parse, a storage or compression
            this reader does not read.
    """
    path = folder / "metadata.yaml"
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        meta = parsed_once(version_key(st, "ros2-metadata"), lambda: _read(f, st.st_size, path))
    for file in meta.files:
        try:
            mode = file.stat().st_mode
        except OSError as exc:
            raise SourceError(f"{folder}: storage file {file.name}: {exc.strerror}") from None
        if not stat.S_ISREG(mode):
            raise SourceError(
                f"{folder}: storage file {file.name} is {file_kind(mode)}, not a regular file"
            )
    return meta


def _read(f: Any, size: int, path: Path) -> Ros2Metadata:
    """metadata.yaml read (at most `MAX_METADATA_BYTES`: the file may grow) and parsed."""
    text = f.read(MAX_METADATA_BYTES + 1) if size <= MAX_METADATA_BYTES else b""
    if size > MAX_METADATA_BYTES or len(text) > MAX_METADATA_BYTES:
        raise SourceError(
            f"{path} is {max(size, len(text))} bytes, more than the {MAX_METADATA_BYTES} a "
            "bag's metadata may be (a real one is a few KB)"
        )
    return _parse(text, path)


def _parse(text: bytes, path: Path) -> Ros2Metadata:
    from ruamel.yaml import YAML
    from ruamel.yaml.events import AliasEvent

    def bad(why: str) -> SourceError:
        return SourceError(f"{path} is not a rosbag2 metadata file ({why})")

    yaml = YAML(typ="safe")
    try:
        # anchors and aliases refused before anything is built: 500 bytes of aliases of
        # aliases expand to 10^9 strings (a bag's metadata has no use for them)
        for event in yaml.parse(text):
            if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
                raise bad("it uses YAML anchors or aliases, which a bag's metadata does not")
        info = yaml.load(text)["rosbag2_bagfile_information"]
        storage, listed = info["storage_identifier"], info["relative_file_paths"]
        mode, fmt = info.get("compression_mode") or "", info.get("compression_format") or ""
    except SourceError:
        raise
    except Exception as exc:  # YAML errors, a missing key, a list where a mapping goes
        why = f"{type(exc).__name__}: {exc}" if not isinstance(exc, KeyError) else f"no {exc}"
        raise bad(why) from None
    if not all(isinstance(x, str) for x in (storage, mode, fmt)):
        raise bad("storage_identifier and compression_mode/format must be strings")
    if not isinstance(listed, list) or not all(isinstance(x, str) for x in listed):
        raise bad("relative_file_paths must be a list of strings")
    if len(listed) > MAX_STORAGE_FILES:
        raise bad(f"it lists {len(listed)} storage files, more than {MAX_STORAGE_FILES}")
    mode, fmt = mode.lower(), fmt.lower()
    if storage not in STORAGES:
        raise SourceError(f"{path}: storage {storage[:40]!r} is not read (mcap, sqlite3 are)")
    if mode == "file":
        raise SourceError(
            f"{path.parent} is compressed file by file (compression_mode: file), which is not "
            "replayed: decompress it once first, e.g. `ros2 bag convert` to a bag of "
            "compression_mode: none"
        )
    if mode not in ("", "none", "message") or (mode == "message" and fmt != "zstd"):
        raise SourceError(f"{path}: compression {mode[:40]!r} ({fmt[:40]!r}) is not read")
    names = [PurePath(x).name for x in listed]
    files = tuple(path.parent / n for n in names if n not in ("", ".", ".."))
    if not files:
        raise SourceError(f"{path} lists no storage file")
    return Ros2Metadata(storage, files, "zstd" if mode == "message" else "")


def inflated_message(data: bytes, compression: str) -> bytes:
    """A message compressed on its own (`compression_mode: message`), inflated under the
    message limit (its zstd frame's declared size is not trusted).

    Raises:
        RefusedError: it inflates past the limit or does not decompress.
    """
    if not compression:
        return data
    try:
        return bytes(inflate(data, compression, None, cap=MAX_MESSAGE_BYTES))
    except RefusedError as exc:
        raise RefusedError(f"a compressed message {exc}") from None


# ------------------------------------------------------------------ rosbags


def any_reader(paths: list[Path]) -> Any:
    """rosbags' AnyReader over `paths`, opened; every error it raises (AnyReaderError,
    FileNotFoundError, AssertionError from a ROS 1 index's asserts, ...) as one line.

    Raises:
        SourceError: the bag cannot be opened.
    """
    from rosbags.highlevel import AnyReader

    try:
        reader = AnyReader(paths)
        reader.open()
    except Exception as exc:
        what = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        raise SourceError(f"cannot read bag {paths[0]}: {what}"[:400]) from None
    return reader


class Sqlite3Bag:
    """The SQLite storage files of a ROS 2 bag, read by rosbags (no chunks to inflate);
    messages compressed one by one are inflated under the message limit."""

    def __init__(self, meta: Ros2Metadata) -> None:
        self._reader = any_reader(list(meta.files))
        self._compression = meta.message_compression
        self._room = sum(f.stat().st_size for f in meta.files)

    def topics(self) -> list[Topic]:
        out: dict[str, Topic] = {}
        for conn in self._reader.connections:
            t = out.get(conn.topic)
            count = conn.msgcount + (t.count if t else 0)
            out[conn.topic] = Topic(conn.topic, conn.msgtype, count)
        return [_hint(t, self._room, _MIN_SQLITE_MESSAGE) for t in out.values()]

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        conns = [c for c in self._reader.connections if c.topic == topic]
        for conn, log_time, raw in self._reader.messages(connections=conns):
            yield log_time, conn.msgtype, functools.partial(self._decode, raw, conn.msgtype)

    def _decode(self, raw: bytes, msgtype: str) -> Any:
        return self._reader.deserialize(inflated_message(raw, self._compression), msgtype)

    def metadata(self, name: str) -> dict[str, str] | None:
        return None

    def attachment(self, name: str) -> bytes | None:
        return None

    def close(self) -> None:
        self._reader.close()


def _hint(topic: Topic, room_bytes: int, smallest_bytes: int) -> Topic:
    """`topic` with its count unknown where the files cannot hold that many messages."""
    return Topic(topic.name, topic.msgtype, plausible(topic.count, room_bytes, smallest_bytes))


# ------------------------------------------------------------------ ROS 1


class Ros1Bag:
    """A ROS 1 bag: its index and types from rosbags, its chunks read here under the caps."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open_regular(path) as f:  # rosbags reads its first line whole, however long
            if f.read(len(ROS1_MAGIC)) != ROS1_MAGIC:
                raise SourceError(f"{path} is not a ROS 1 bag (it does not start as one)")
        self._reader = any_reader([path])
        self._bag = self._reader.readers[0]
        self._size = path.stat().st_size

    def topics(self) -> list[Topic]:
        out: dict[str, Topic] = {}
        for conn in self._reader.connections:
            t = out.get(conn.topic)
            count = conn.msgcount + (t.count if t else 0)
            out[conn.topic] = Topic(conn.topic, conn.msgtype, count)
        return [_hint(t, self._size, _MIN_ROS1_MESSAGE) for t in out.values()]

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        """The topic's messages, chunk by chunk (each chunk's in time order, chunks by their
        first message); a chunk that cannot be read is reported and skipped, a message record
        that cannot be read is given as a message whose decode raises (one skipped frame)."""
        conns = {c.id: c for c in self._reader.connections if c.topic == topic}
        by_chunk: dict[int, list[tuple[int, int, int]]] = {}  # (time, offset, connection)
        for conn_id in conns:
            for entry in self._bag.indexes.get(conn_id, ()):
                by_chunk.setdefault(entry.chunk_pos, []).append((entry.time, entry.offset, conn_id))
        for pos, entries in sorted(by_chunk.items(), key=lambda c: (min(c[1]), c[0])):
            try:
                data = self._chunk(pos)
            except RefusedError as exc:
                on_damage(f"chunk at byte {pos} skipped: {exc}", len(entries))
                continue
            for log_time, offset, conn_id in sorted(entries):
                msgtype = conns[conn_id].msgtype
                yield log_time, msgtype, functools.partial(self._decode, data, offset, conns)

    def _decode(self, data: bytes, offset: int, conns: dict[int, Any]) -> Any:
        conn_id, raw = _record(data, offset)
        if conn_id not in conns:
            raise SourceError(f"the message at {offset} of its chunk is of another topic")
        return self._reader.deserialize(raw, conns[conn_id].msgtype)

    def _chunk(self, pos: int) -> bytes:
        """The chunk at `pos`, inflated under the chunk limit to the size it declares."""
        from rosbags.rosbag1.reader import Header, RecordType, read_uint32

        bio = self._bag.bio
        try:
            bio.seek(pos)
            header = Header.read(bio, RecordType.CHUNK)
            compression = header.get_string("compression")
            size = header.get_uint32("size")
            datasize = read_uint32(bio)
        except Exception as exc:
            raise RefusedError(f"a damaged chunk header ({exc})") from None
        if datasize > MAX_CHUNK_BYTES + MiB or datasize > self._size - bio.tell():
            raise RefusedError(f"{datasize} bytes of data where the file or the limit has not")
        if compression not in ("none", "bz2", "lz4"):
            raise RefusedError(f"an unknown compression {compression[:40]!r}")
        with inflating(size):  # (its messages are copied out when each is decoded)
            return bytes(inflate(bio.read(datasize), compression, size))  # (bytes: no copy)

    def metadata(self, name: str) -> dict[str, str] | None:
        return None

    def attachment(self, name: str) -> bytes | None:
        return None

    def close(self) -> None:
        self._reader.close()


def _record(data: bytes, offset: int) -> tuple[int, bytes]:
    """(connection id, message bytes) of the message record at `offset` of a chunk (past
    the connection records before it, as rosbags reads it).

    Raises:
        SourceError: no readable message record there.
    """
    from rosbags.rosbag1.reader import Header, RecordType, read_bytes, read_uint32

    chunk = io.BytesIO(data)
    try:
        chunk.seek(offset)
        for _ in range(64):
            header = Header.read(chunk)
            if header.get_uint8("op") != RecordType.CONNECTION:
                break
            chunk.seek(read_uint32(chunk), os.SEEK_CUR)
        if header.get_uint8("op") != RecordType.MSGDATA:
            raise SourceError("no message record where the index says")
        return header.get_uint32("conn"), read_bytes(chunk, read_uint32(chunk))
    except SourceError:
        raise
    except Exception as exc:
        raise SourceError(f"a damaged message record ({type(exc).__name__}: {exc})") from None
