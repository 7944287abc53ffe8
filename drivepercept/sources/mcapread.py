"""MCAP files read without trusting a size they declare: a crafted or damaged chunk is
refused before it takes memory, and the rest of the file is read on.

The `mcap` package inflates a whole chunk to the size its zstd frame declares, holds every
message of every chunk that overlaps in time, and replays a chunk index listed twice: a 409 KB
file took 5 GB. Here (records parsed by `mcapindex`):

* A chunk is inflated only when its index, its own header and the file agree (inside the data
  section, a chunk record of the indexed length at the offset, one size and compression in
  both), never past `untrusted.MAX_CHUNK_BYTES` nor past the size it declares (a bounded
  decompressor), and its records are walked with each length checked, at most
  `mcapindex.MAX_RECORDS_PER_CHUNK` of them. A chunk that fails is skipped and reported to
  `on_damage` with the messages of the topic its message index says it held; reading goes on.
* An indexed file is read chunk by chunk in the order of their first message's time, each
  chunk once however often the summary lists it, and only the chunks that hold the topic.
  **Order**: one chunk's messages come in log-time order; chunks that overlap in time are
  merged `MERGE_CHUNKS` at a time while they hold under `MERGE_BYTES` (never all inflated
  at once), so where more overlap, a message may come after a later one (the reader's
  reorder window puts a few right).
* A file without a summary (cut short), or whose summary cannot be read, is walked front to
  back in file order up to its DataEnd record: a summary cut short after it is not data, and a
  file that ends inside a record raises `CutShortError` once what came before was given.
* Counts are hints: a channel's count the file's bytes cannot hold is unknown (-1).
"""

from __future__ import annotations

import heapq
import itertools
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivepercept.sources import mcapindex as mx
from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import (
    MAX_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    Buffer,
    MiB,
    RefusedError,
    Topic,
    inflate,
    inflating,
    open_regular,
    parsed_once,
    version_key,
)

MERGE_CHUNKS = 2  # chunks whose messages may be held at once, to merge overlapping ones
MERGE_BYTES = 64 * MiB  # ... while they hold less than this (chunks of huge frames: one)
SCAN_RECORDS = 20_000  # records walked for the topics of a file without a summary
_CHUNK_HEAD = struct.Struct("<QQQI")  # first and last message time, size inflated, CRC
_MESSAGE_HEAD = struct.Struct("<HIQQ")  # channel, sequence, log time, publish time
_INDEX_HEAD = 15  # a message index record's opcode, length, channel and entries' length

# (why a chunk was skipped, the topic's messages in it, None when nothing says)
OnDamage = Callable[[str, "int | None"], None]
Message = tuple[Any, Any, int, bytes]  # (schema or None, channel, log time ns, data)


class CutShortError(SourceError):
    """The file ends inside a record: what came before it was read."""


@dataclass
class _Walk:
    """What a front-to-back read has learnt so far."""

    topic: str
    schemas: dict[int, Any] = field(default_factory=dict)
    channels: dict[int, Any] = field(default_factory=dict)
    ids: set[int] = field(default_factory=set)  # the channels of `topic`


class McapFile:
    """One MCAP file, read with every size checked (see the module's docstring). Its summary
    is read once per file version, whatever the number of cameras that open it.

    Raises:
        SourceError: not a regular file, not an MCAP file, or unreadable.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open_regular(path)
        try:
            st = os.fstat(self._f.fileno())
            self.size = st.st_size
            if self._f.read(len(mx.MAGIC)) != mx.MAGIC:
                raise SourceError(f"{path} is not an MCAP file (it does not start as one)")
            self.index = parsed_once(
                version_key(st, "mcap"), lambda: mx.read_index(self._f, self.size)
            )
        except OSError as exc:
            self._f.close()
            raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
        except BaseException:
            self._f.close()
            raise
        self.indexed = self.index is not None and bool(self.index.chunks)

    def close(self) -> None:
        self._f.close()

    def topics(self) -> list[Topic]:
        """The file's topics, from its summary; a file without one: those found in its first
        `SCAN_RECORDS` records (a cut file: those before the cut)."""
        if self.index is not None and self.index.channels:
            schemas, channels, counts = self.index.schemas, self.index.channels, self.index.counts
        else:
            walk = _Walk("")
            try:
                for _ in self._walk_messages(walk, lambda why, lost: None, limit=SCAN_RECORDS):
                    pass
            except CutShortError:
                pass  # what was read before the cut says which topics there are
            schemas, channels, counts = walk.schemas, walk.channels, {}
        found: dict[str, Topic] = {}
        for ch in channels.values():
            schema = schemas.get(ch.schema_id)
            count = counts.get(ch.id, -1)
            if (seen := found.get(ch.topic)) is not None:  # one topic, several channels
                count = -1 if count < 0 or seen.count < 0 else count + seen.count
            found[ch.topic] = Topic(ch.topic, schema.name if schema else "", count)
        return list(found.values())

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        """(schema, channel, log time ns, data) of each message of `topic`; a chunk that
        cannot be read is reported to `on_damage` and skipped.

        Raises:
            CutShortError: (a file read front to back) it ends inside a record.
        """
        if self.index is not None and self.indexed:
            yield from self._indexed(topic, on_damage)
            return
        walk = _Walk(topic)
        for channel_id, log_time, data in self._walk_messages(walk, on_damage):
            ch = walk.channels[channel_id]
            yield walk.schemas.get(ch.schema_id), ch, log_time, data
            data = b""  # not held while the next is read

    def _indexed(self, topic: str, on_damage: OnDamage) -> Iterator[Message]:
        assert self.index is not None
        ix = self.index
        ids = {c.id for c in ix.channels.values() if c.topic == topic}
        chunks = [
            (index, why)
            for index, why in ix.chunks
            if not index.message_index_offsets or ids & index.message_index_offsets.keys()
        ]
        held: list[tuple[int, int, int, int, bytes]] = []  # (time, chunk, n, channel, data)
        left: dict[int, int] = {}  # chunk -> its messages still held
        held_bytes = 0
        order = itertools.count()
        k = 0
        while k < len(chunks) or held:
            # the next chunk joins while it starts before the earliest message held (up to
            # MERGE_CHUNKS chunks, MERGE_BYTES of messages, held at once)
            while k < len(chunks) and (
                not held
                or (
                    chunks[k][0].message_start_time <= held[0][0]
                    and len(left) < MERGE_CHUNKS
                    and held_bytes < MERGE_BYTES
                )
            ):
                got = self._chunk(*chunks[k], ids, on_damage)
                for log_time, channel_id, data in got:
                    heapq.heappush(held, (log_time, k, next(order), channel_id, data))
                    held_bytes += len(data)
                if got:
                    left[k] = len(got)
                k += 1
                got, data = [], b""  # (held only in `held`: see below)
            if held:
                log_time, chunk, _, channel_id, data = heapq.heappop(held)
                held_bytes -= len(data)
                left[chunk] -= 1
                if not left[chunk]:
                    del left[chunk]
                ch = ix.channels[channel_id]
                yield ix.schemas.get(ch.schema_id), ch, log_time, data
                # a message given is not held here while the next chunk is read (a frame may
                # be 256 MiB)
                data = b""

    def _chunk(
        self, index: Any, why: str | None, ids: set[int], on_damage: OnDamage
    ) -> list[tuple[int, int, bytes]]:
        """(log time, channel, data) of the messages of channels `ids` in the chunk of
        `index`, by log time; [] (reported) when it cannot be read."""
        try:
            if why is not None:
                raise RefusedError(why)
            self._f.seek(index.chunk_start_offset)
            head = self._f.read(9)
            opcode, length = mx.HEAD.unpack_from(head) if len(head) == 9 else (0, 0)
            if opcode != mx.CHUNK or length != index.chunk_length - 9:
                raise RefusedError("no chunk record at the offset its index gives")
            with inflating(index.uncompressed_size):
                data = self._chunk_data(self._f.read(length), index)
                got = sorted(((t, c, d) for c, t, d in _messages(data, ids)), key=lambda m: m[0])
                data = b""  # the inflated chunk goes before the room is given back
        except RefusedError as exc:
            at = index.chunk_start_offset
            on_damage(f"chunk at byte {at} skipped: {exc}", self._lost(index, ids))
            return []
        return got

    def _chunk_data(self, body: bytes, index: Any | None) -> Buffer:
        """A chunk record's body -> its records, inflated under the caps and checked against
        its index where it has one (an uncompressed chunk: a view of `body`, not a copy)."""
        if len(body) < _CHUNK_HEAD.size + 4:
            raise RefusedError("a chunk record cut short")
        _, _, size, _ = _CHUNK_HEAD.unpack_from(body)
        at = _CHUNK_HEAD.size
        (n,) = struct.unpack_from("<I", body, at)
        compression = bytes(body[at + 4 : at + 4 + n]).decode("utf-8", "replace")
        at += 4 + n
        if len(body) < at + 8:
            raise RefusedError("a chunk record cut short")
        (data_length,) = struct.unpack_from("<Q", body, at)
        at += 8
        if data_length > len(body) - at:
            raise RefusedError(f"declares {data_length} bytes of data, {len(body) - at} there")
        if index is not None and (
            (size, compression, data_length)
            != (index.uncompressed_size, index.compression, index.compressed_size)
        ):
            raise RefusedError("its header and its index disagree on its size or compression")
        if compression not in mx.COMPRESSIONS:
            raise RefusedError(f"an unknown compression {compression[:40]!r}")
        return inflate(memoryview(body)[at : at + data_length], compression, size)

    def _lost(self, index: Any, ids: set[int]) -> int | None:
        """Messages of channels `ids` in a chunk, from its message indexes (None: they do not
        say, or cannot be read)."""
        if not index.message_index_offsets:
            return None
        first = index.chunk_start_offset + index.chunk_length
        lost = 0
        for channel_id, offset in index.message_index_offsets.items():
            if channel_id not in ids:
                continue
            if not first <= offset <= first + index.message_index_length - _INDEX_HEAD:
                return None
            self._f.seek(offset)
            head = self._f.read(_INDEX_HEAD)
            if len(head) < _INDEX_HEAD or head[0] != mx.MESSAGE_INDEX:
                return None
            entries = min(struct.unpack_from("<I", head, 11)[0], index.message_index_length)
            lost += entries // 16
        return lost

    def _walk(self) -> Iterator[tuple[int, int, int]]:
        """(opcode, body offset, body length) of each record of the data section, front to
        back, up to its DataEnd (or Footer) record.

        Raises:
            CutShortError: the file ends inside a record, or before DataEnd.
        """
        pos = len(mx.MAGIC)
        while True:
            self._f.seek(pos)
            head = self._f.read(9)
            if len(head) < 9:
                raise CutShortError(f"it ends at byte {self.size}, inside its data")
            opcode, length = mx.HEAD.unpack_from(head)
            if opcode in (mx.DATA_END, mx.FOOTER_OP):  # the data ends here
                return
            if length > self.size - pos - 9:
                raise CutShortError(
                    f"it ends at byte {self.size}, inside a record of {length} bytes"
                )
            yield opcode, pos + 9, length
            pos += 9 + length

    def _walk_messages(
        self, walk: _Walk, on_damage: OnDamage, *, limit: int | None = None
    ) -> Iterator[tuple[int, int, bytes]]:
        """(channel, log time, data) of the messages of `walk.topic`, front to back, schemas
        and channels learnt on the way; at most `limit` records walked. A chunk that cannot be
        read is reported once the message indexes after it have said what it held of ours."""
        damaged: str | None = None
        lost: int | None = None
        for opcode, at, length in itertools.islice(self._walk(), limit):
            if damaged is not None and opcode == mx.MESSAGE_INDEX:
                if length >= 6:
                    self._f.seek(at)
                    channel_id, size = struct.unpack("<HI", self._f.read(6))
                    lost = (lost or 0) + (size // 16 if channel_id in walk.ids else 0)
                continue
            if damaged is not None:
                if lost != 0:  # 0: its indexes say it held nothing of the topic
                    on_damage(damaged, lost)
                damaged, lost = None, None
            if opcode not in (mx.SCHEMA, mx.CHANNEL, mx.MESSAGE, mx.CHUNK):
                continue  # attachments, metadata, indexes: not messages
            cap = MAX_CHUNK_BYTES + MiB if opcode == mx.CHUNK else MAX_MESSAGE_BYTES
            try:
                if length > cap:
                    raise RefusedError(f"a record of {length} bytes, over the {cap} it may be")
                self._f.seek(at)
                if opcode == mx.CHUNK:
                    body = self._f.read(length)
                    with inflating(_declared(body)):
                        data = self._chunk_data(body, None)
                        got = sorted(_messages(data, walk.ids, walk), key=lambda m: m[1])
                        data = body = b""
                else:
                    record = mx.HEAD.pack(opcode, length) + self._f.read(length)
                    got = _messages(record, walk.ids, walk)
                data = record = b""
                got.reverse()
                while got:  # given one by one: none held here once given
                    yield got.pop()
            except RefusedError as exc:
                what = "chunk" if opcode == mx.CHUNK else "record"
                damaged = f"{what} at byte {at - 9} skipped: {exc}"
        if damaged is not None and lost != 0:
            on_damage(damaged, lost)

    def metadata(self, name: str) -> dict[str, str] | None:
        """The metadata record `name` (None: the file has none)."""
        from mcap import records as r

        listed = self.index.metadata if self.index else ()
        for body in self._bodies(mx.METADATA, listed, name):
            record = mx.parse(r.Metadata, body)
            if record.name == name:
                return dict(record.metadata)
        return None

    def attachment(self, name: str) -> bytes | None:
        """The attachment `name`'s bytes (None: the file has none)."""
        from mcap import records as r

        listed = self.index.attachments if self.index else ()
        for body in self._bodies(mx.ATTACHMENT, listed, name):
            record = mx.parse(r.Attachment, body)
            if record.name == name:
                return bytes(record.data)
        return None

    def _bodies(self, opcode: int, listed: tuple[Any, ...], name: str) -> Iterator[bytes]:
        """The bodies of the records of `opcode` that may be `name` (found by their index,
        else front to back), each at most `MAX_CHUNK_BYTES`."""
        if listed:
            places = [(i.offset, i.length) for i in listed if i.name == name]
        else:
            try:
                places = [(at - 9, n + 9) for op, at, n in self._walk() if op == opcode]
            except CutShortError:
                return
        for offset, length in places:
            if not 0 < offset <= self.size - length or not 9 <= length <= MAX_CHUNK_BYTES:
                continue
            self._f.seek(offset)
            head = self._f.read(9)
            if head[0] == opcode and mx.HEAD.unpack_from(head)[1] == length - 9:
                yield self._f.read(length - 9)


def _declared(body: bytes) -> int:
    """The size a chunk record's body says it inflates to (0: too short to say)."""
    return int(_CHUNK_HEAD.unpack_from(body)[2]) if len(body) >= _CHUNK_HEAD.size else 0


def _messages(
    data: Buffer, ids: set[int], walk: _Walk | None = None
) -> list[tuple[int, int, bytes]]:
    """(channel, log time, data) of the messages of channels `ids` among the records of
    `data` (each message's bytes copied once: the chunk is not kept alive by them); with
    `walk`, its schemas and channels are learnt (and a channel of its topic added to `ids`)."""
    from mcap import records as r

    view = memoryview(data)
    out = []
    for opcode, at, length in mx.records(data):
        if opcode == mx.MESSAGE:
            if length < _MESSAGE_HEAD.size:
                raise RefusedError("a message record cut short")
            channel_id, _, log_time, _ = _MESSAGE_HEAD.unpack_from(data, at)
            if channel_id in ids:
                message = bytes(view[at + _MESSAGE_HEAD.size : at + length])
                out.append((channel_id, log_time, message))
        elif walk is not None and opcode in (mx.SCHEMA, mx.CHANNEL):
            kind = r.Schema if opcode == mx.SCHEMA else r.Channel
            try:
                record = mx.parse(kind, bytes(view[at : at + length]))
            except Exception as exc:
                raise RefusedError(f"a damaged {kind.__name__} record ({exc})") from None
            if opcode == mx.SCHEMA:
                walk.schemas[record.id] = record
            else:
                walk.channels[record.id] = record
                if record.topic == walk.topic:
                    ids.add(record.id)
    return out
