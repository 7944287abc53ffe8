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
  read here: one at a time, in the order of their first message, each once however often
  the index lists it (and each message once), its record header at most
  `MAX_RECORD_HEADER`, checked against the file and the chunk limit, inflated by a bounded
  decompressor (bz2, lz4) to the size its header declares inside the reader's share of the
  process's room (`untrusted.Share`), its messages of the topic copied out before the chunk
  is dropped, and skipped (reported with its messages of the topic) when it fails. rosbags'
  own open still reads the bag's index records as the file gives them (a record header is
  read whole; an index listed many times is read as often).
* Messages of the image and calibration types are decoded by the standard definitions of
  rosbags' own type stores (ROS 2 Humble, ROS 1 Noetic), not by the definitions a bag
  carries, which may add fields that build far more than their bytes (`decoder_for`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import (
    MAX_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_METADATA_BYTES,
    Buffer,
    Message,
    MiB,
    OnDamage,
    RefusedError,
    Share,
    Topic,
    decoder_for,
    file_kind,
    inflate,
    merged_topics,
    open_regular,
    parsed_once,
    version_key,
)

STORAGES = ("mcap", "sqlite3")
ROS1_MAGIC = b"#ROSBAG V2.0\n"
MAX_STORAGE_FILES = 10_000  # storage files a metadata.yaml may list (a day's bag: hundreds)
MAX_RECORD_HEADER = MiB  # a ROS 1 record's header: a few hundred bytes in a real bag
_MIN_ROS1_MESSAGE = 12  # a ROS 1 bag's index entry per message: time and offset
_MIN_SQLITE_MESSAGE = 16  # a SQLite row's id, topic and timestamp at least


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
    FileNotFoundError, AssertionError from a ROS 1 index's asserts, ...) as one line, and a
    reader half opened closed.

    Raises:
        SourceError: the bag cannot be opened.
    """
    from rosbags.highlevel import AnyReader

    reader = None
    try:
        reader = AnyReader(paths)
        reader.open()
    except Exception as exc:
        if reader is not None:
            _close_quietly(reader)
        what = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        raise SourceError(f"cannot read bag {paths[0]}: {what}"[:400]) from None
    return reader


def _close_quietly(reader: Any) -> None:
    with contextlib.suppress(Exception):  # (one that failed to open may fail to close)
        reader.close()


class Sqlite3Bag:
    """The SQLite storage files of a ROS 2 bag, read by rosbags (no chunks to inflate);
    messages compressed one by one are inflated under the message limit."""

    def __init__(self, meta: Ros2Metadata) -> None:
        self._compression = meta.message_compression
        try:
            self._room = sum(f.stat().st_size for f in meta.files)
        except OSError as exc:
            raise SourceError(f"cannot read bag {meta.files[0]}: {exc.strerror}") from None
        self._reader = any_reader(list(meta.files))
        self._decoders: dict[str, Callable[[Buffer], Any]] = {}

    def topics(self) -> list[Topic]:
        found = [Topic(c.topic, c.msgtype, c.msgcount) for c in self._reader.connections]
        return merged_topics(found, self._room, _MIN_SQLITE_MESSAGE)

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        conns = [c for c in self._reader.connections if c.topic == topic]
        for conn, log_time, raw in self._reader.messages(connections=conns):
            yield log_time, conn.msgtype, functools.partial(self._decode, raw, conn.msgtype)

    def _decode(self, raw: bytes, msgtype: str) -> Any:
        if (decode := self._decoders.get(msgtype)) is None:
            own = functools.partial(getattr, self._reader, "typestore")
            decode = self._decoders[msgtype] = decoder_for(msgtype, ros1=False, own=own)
        return decode(inflated_message(raw, self._compression))

    def metadata(self, name: str) -> dict[str, str] | None:
        return None

    def attachment(self, name: str) -> bytes | None:
        return None

    def close(self) -> None:
        self._reader.close()


# ------------------------------------------------------------------ ROS 1


class Ros1Bag:
    """A ROS 1 bag: its index and types from rosbags, its chunks read here under the caps."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open_regular(path) as f:  # rosbags reads its first line whole, however long
            if f.read(len(ROS1_MAGIC)) != ROS1_MAGIC:
                raise SourceError(f"{path} is not a ROS 1 bag (it does not start as one)")
            self._size = os.fstat(f.fileno()).st_size
        self._reader = any_reader([path])
        self._bag = self._reader.readers[0]
        self._decoders: dict[str, Callable[[Buffer], Any]] = {}

    def topics(self) -> list[Topic]:
        counts = self._counts()
        found = [Topic(c.topic, c.msgtype, counts.get(c.id, 0)) for c in self._reader.connections]
        return merged_topics(found, self._size, _MIN_ROS1_MESSAGE)

    def _counts(self) -> dict[int, int]:
        """Messages per connection, each counted once however often the index lists it."""
        return {
            conn_id: len({(e.chunk_pos, e.offset) for e in entries})
            for conn_id, entries in self._bag.indexes.items()
        }

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        """The topic's messages, chunk by chunk (each chunk's in time order, chunks by their
        first message), each once however often the index lists it; a chunk that cannot be
        read is reported and skipped, a message record that cannot be read is given as a
        message whose decode raises (one skipped frame). A chunk's messages keep their part
        of the room until each has been given."""
        conns = {c.id: c for c in self._reader.connections if c.topic == topic}
        by_chunk: dict[int, dict[int, tuple[int, int]]] = {}  # chunk -> offset -> (time, conn)
        for conn_id in conns:
            for entry in self._bag.indexes.get(conn_id, ()):
                at = by_chunk.setdefault(entry.chunk_pos, {})
                at.setdefault(entry.offset, (entry.time, conn_id))
        share = Share()
        try:
            for pos, entries in sorted(by_chunk.items(), key=lambda c: (min(c[1].values()), c[0])):
                try:
                    got = self._chunk(pos, entries, conns, share)
                except RefusedError as exc:
                    share.hold(0)
                    on_damage(f"chunk at byte {pos} skipped: {exc}", len(entries))
                    continue
                kept = sum(len(raw) for _, _, raw in got if isinstance(raw, bytes))
                share.hold(kept)
                got.reverse()
                while got:  # given one by one: none held here once given
                    log_time, msgtype, raw = got.pop()
                    yield log_time, msgtype, functools.partial(self._decode, raw, msgtype)
                    kept -= len(raw) if isinstance(raw, bytes) else 0
                    raw = b""
                    share.hold(kept)
        finally:
            share.hold(0)

    def _decode(self, raw: bytes | SourceError, msgtype: str) -> Any:
        if isinstance(raw, SourceError):
            raise raw
        if (decode := self._decoders.get(msgtype)) is None:
            own = functools.partial(getattr, self._reader, "typestore")
            decode = self._decoders[msgtype] = decoder_for(msgtype, ros1=True, own=own)
        return decode(raw)

    def _chunk(
        self, pos: int, entries: dict[int, tuple[int, int]], conns: dict[int, Any], share: Share
    ) -> list[tuple[int, str, bytes | SourceError]]:
        """(log time, type, message bytes or why they cannot be read) of the messages at
        `entries` of the chunk at `pos`, by time: the chunk inflated under the chunk limit to
        the size it declares, inside `share`, and dropped once they are copied out."""
        from rosbags.rosbag1.reader import Header, RecordType, read_uint32

        bio = self._bag.bio
        try:
            bio.seek(pos)
            (length,) = struct.unpack("<I", bio.read(4))
            if length > MAX_RECORD_HEADER:  # read whole by rosbags, before any check
                raise RefusedError(f"a record header of {length} bytes")
            bio.seek(pos)
            header = Header.read(bio, RecordType.CHUNK)
            compression = header.get_string("compression")
            size = header.get_uint32("size")
            datasize = read_uint32(bio)
        except RefusedError:
            raise
        except Exception as exc:
            raise RefusedError(f"a damaged chunk header ({exc})") from None
        if datasize > MAX_CHUNK_BYTES + MiB or datasize > self._size - bio.tell():
            raise RefusedError(f"{datasize} bytes of data where the file or the limit has not")
        if compression not in ("none", "bz2", "lz4"):
            raise RefusedError(f"an unknown compression {compression[:40]!r}")
        # the data, inflated (uncompressed: the data itself), and the messages copied out
        share.hold(datasize + size * (1 if compression == "none" else 2))
        chunk = bytes(inflate(bio.read(datasize), compression, size))  # (bytes: no copy)
        got: list[tuple[int, str, bytes | SourceError]] = []
        for offset, (log_time, conn_id) in entries.items():
            try:
                record_conn, raw = _record(chunk, offset)
                if record_conn not in conns:
                    raise SourceError(f"the message at {offset} of its chunk is of another topic")
                got.append((log_time, conns[conn_id].msgtype, raw))
            except SourceError as exc:
                got.append((log_time, conns[conn_id].msgtype, exc))
        chunk = b""  # (its messages are copies)
        got.sort(key=lambda m: m[0])
        return got

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
