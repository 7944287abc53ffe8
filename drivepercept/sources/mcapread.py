"""MCAP files read without trusting a size they declare: a crafted or damaged chunk is
refused before it takes memory, and the rest of the file is read on.

The `mcap` package inflates a whole chunk to the size its zstd frame declares, holds every
message of every chunk that overlaps in time, and replays a chunk index listed twice: a 409 KB
file took 5 GB. Here (records parsed by `mcapindex`):

* A chunk is read only when its index, its own header and the file agree (inside the data
  section, a chunk record of the indexed length at the offset, one size and compression in
  both, a length of its header and data exactly, at most `mcapindex.MAX_CHUNK_RECORD`), is
  inflated never past `untrusted.MAX_CHUNK_BYTES` nor past the size it declares (a bounded
  decompressor), and its records are walked with each length checked, at most
  `mcapindex.MAX_RECORDS_PER_CHUNK` of them. A chunk that fails is skipped and reported to
  `on_damage` with the messages of the topic its message index says it held; reading goes on.
* **Memory**: a chunk is read, inflated and its messages of the topic copied out inside the
  reader's `untrusted.Share` of the process's room, and each message keeps its part until
  it has been given and decoded (the generator resumed): the cameras of a rig together hold
  about one chunk at the limit, whatever their number.
* An indexed file is read chunk by chunk in the order of their first message's time, each
  chunk once however often the summary lists it, and only the chunks that hold the topic.
  A summary whose chunk indexes disagree with the file (one points where no chunk record
  repeats it, or a chunk or message of the data is in none) is not used for reading: the
  file is read front to back, and a warning says why.
  **Order**: one chunk's messages come in log-time order; chunks that overlap in time are
  merged `MERGE_CHUNKS` at a time while they hold under `MERGE_BYTES` (never all inflated
  at once), so where more overlap, a message may come after a later one (the reader's
  reorder window puts a few right).
* A file without a summary (cut short), or whose summary cannot be read, is walked front to
  back in file order up to its DataEnd record: a summary cut short after it is not data, and a
  file that ends inside a record, or holds what is not MCAP data (zeros, a flood of empty
  records: `mcapindex.walk`), raises `CutShortError` once what came before was given.
* Counts are hints: a channel's count the file's bytes cannot hold is unknown (-1).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivepercept.sources import mcapindex as mx
from drivepercept.sources.mcapindex import CutShortError
from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import (
    MAX_MESSAGE_BYTES,
    Buffer,
    MiB,
    OnDamage,
    RefusedError,
    Share,
    Topic,
    merged_topics,
    open_regular,
    parsed_once,
    version_key,
)

__all__ = ["CutShortError", "McapFile", "McapMessage"]

log = logging.getLogger(__name__)

MERGE_CHUNKS = 2  # chunks whose messages may be held at once, to merge overlapping ones
MERGE_BYTES = 64 * MiB  # ... while they hold less than this (chunks of huge frames: one)
SCAN_RECORDS = 20_000  # records walked for the topics (or metadata) of a file without a summary
_MESSAGE_HEAD = struct.Struct("<HIQQ")  # channel, sequence, log time, publish time
_INDEX_HEAD = 15  # a message index record's opcode, length, channel and entries' length

McapMessage = tuple[Any, Any, int, bytes]  # (schema or None, channel, log time ns, data)


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
            self.index = parsed_once(version_key(st, "mcap"), self._read_index)
        except OSError as exc:
            self._f.close()
            raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None
        except BaseException:
            self._f.close()
            raise
        ix = self.index
        self.indexed = ix is not None and bool(ix.chunks) and ix.disagrees is None

    def _read_index(self) -> mx.Index | None:
        index = mx.read_index(self._f, self.size)
        if index is not None and index.disagrees is not None:  # (once per file version)
            log.warning(
                "%s: its summary disagrees with the file (%s): read front to back",
                self.path,
                index.disagrees,
            )
        return index

    def close(self) -> None:
        self._f.close()

    def topics(self) -> list[Topic]:
        """The file's topics, from its summary (its counts where it agrees with the file);
        a file without one: those found in its first `SCAN_RECORDS` records (a cut file:
        those before the cut), their counts unknown."""
        ix = self.index
        if ix is not None and ix.channels:
            schemas, channels, room = ix.schemas, ix.channels, ix.room
            counts = ix.counts if ix.disagrees is None else {}
        else:
            walk = _Walk("")
            try:
                for _ in self._walk_messages(walk, lambda why, lost: None, limit=SCAN_RECORDS):
                    pass
            except CutShortError:
                pass  # what was read before the cut says which topics there are
            schemas, channels, counts, room = walk.schemas, walk.channels, {}, self.size
        found = []
        for ch in channels.values():
            schema = schemas.get(ch.schema_id)
            found.append(Topic(ch.topic, schema.name if schema else "", counts.get(ch.id, -1)))
        return merged_topics(found, room, mx.MIN_MESSAGE_RECORD)

    def messages(self, topic: str, on_damage: OnDamage) -> Iterator[McapMessage]:
        """(schema, channel, log time ns, data) of each message of `topic`; a chunk that
        cannot be read is reported to `on_damage` and skipped.

        Raises:
            CutShortError: (a file read front to back) it ends inside a record, or holds
                what is not MCAP data.
        """
        if self.index is not None and self.indexed:
            yield from self._indexed(topic, on_damage)
            return
        walk = _Walk(topic)
        for channel_id, log_time, data in self._walk_messages(walk, on_damage):
            ch = walk.channels[channel_id]
            yield walk.schemas.get(ch.schema_id), ch, log_time, data
            data = b""  # not held while the next is read

    def _indexed(self, topic: str, on_damage: OnDamage) -> Iterator[McapMessage]:
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
        share = Share()
        k = 0
        try:
            while k < len(chunks) or held:
                # the next chunk joins while it starts before the earliest message held (up
                # to MERGE_CHUNKS chunks, MERGE_BYTES of messages, held at once) and fits in
                # the room now
                while k < len(chunks) and (
                    not held
                    or (
                        chunks[k][0].message_start_time <= held[0][0]
                        and len(left) < MERGE_CHUNKS
                        and held_bytes < MERGE_BYTES
                    )
                ):
                    got = self._chunk(*chunks[k], ids, on_damage, share, held_bytes)
                    if got is None:
                        break  # no room for it beside the messages held: they go first
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
                    # given and decoded: not held here while the next chunk is read (a frame
                    # may be 256 MiB), and its room given back
                    data = b""
                    share.hold(held_bytes)
        finally:
            share.hold(0)

    def _chunk(
        self,
        index: Any,
        why: str | None,
        ids: set[int],
        on_damage: OnDamage,
        share: Share,
        kept: int,
    ) -> list[tuple[int, int, bytes]] | None:
        """(log time, channel, data) of the messages of channels `ids` in the chunk of
        `index`, by log time, read inside `share` (which holds `kept` bytes of messages
        already); [] (reported) when it cannot be read; None when `kept` is not 0 and there
        is no room for it now (nothing read)."""
        at = index.chunk_start_offset
        try:
            if why is None:
                why = mx.head_disagrees(mx.chunk_head(self._f, at), index)
            if why is not None:
                raise RefusedError(why)
            need = kept + _reading(index.chunk_length, index.uncompressed_size, index.compression)
            if kept and not share.try_hold(need):
                return None
            share.hold(need)
            self._f.seek(at + 9)
            data = mx.chunk_data(self._f.read(index.chunk_length - 9), index)
            got = sorted(((t, c, d) for c, t, d in _messages(data, ids)), key=lambda m: m[0])
            data = b""  # the chunk goes before its room is given back
        except RefusedError as exc:
            share.hold(kept)
            on_damage(f"chunk at byte {at} skipped: {exc}", self._lost(index, ids))
            return []
        share.hold(kept + sum(len(d) for _, _, d in got))
        return got

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

    def _walk_messages(
        self, walk: _Walk, on_damage: OnDamage, *, limit: int | None = None
    ) -> Iterator[tuple[int, int, bytes]]:
        """(channel, log time, data) of the messages of `walk.topic`, front to back, schemas
        and channels learnt on the way; at most `limit` records walked. A chunk that cannot be
        read is reported once the message indexes after it have said what it held of ours.
        Each chunk (or message record) is read inside the reader's share of the room, and
        each message keeps its part until it has been given."""
        damaged: str | None = None
        lost: int | None = None
        share = Share()
        try:
            for opcode, at, length in itertools.islice(mx.walk(self._f, self.size), limit):
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
                if opcode not in mx.CONTENT:
                    continue  # attachments, metadata, indexes: not messages
                try:
                    got = self._record(opcode, at, length, walk, share)
                except RefusedError as exc:
                    share.hold(0)
                    what = "chunk" if opcode == mx.CHUNK else "record"
                    damaged = f"{what} at byte {at - 9} skipped: {exc}"
                    continue
                kept = sum(len(m[2]) for m in got)
                share.hold(kept)
                got.reverse()
                while got:  # given one by one: none held here once given
                    message = got.pop()
                    yield message
                    kept -= len(message[2])
                    message = (0, 0, b"")
                    share.hold(kept)
            if damaged is not None and lost != 0:
                on_damage(damaged, lost)
        finally:
            share.hold(0)

    def _record(
        self, opcode: int, at: int, length: int, walk: _Walk, share: Share
    ) -> list[tuple[int, int, bytes]]:
        """The messages of `walk`'s topic in the content record at `at` (a chunk: inflated
        under the caps), in log-time order, read inside `share`."""
        caps = {mx.CHUNK: mx.MAX_CHUNK_RECORD, mx.MESSAGE: MAX_MESSAGE_BYTES}
        cap = caps.get(opcode, mx.MAX_SUMMARY_RECORD)  # (schemas and channels)
        if length > cap:
            raise RefusedError(f"a record of {length} bytes, over the {cap} it may be")
        self._f.seek(at)
        if opcode != mx.CHUNK:
            share.hold(length)
            return _messages(mx.HEAD.pack(opcode, length) + self._f.read(length), walk.ids, walk)
        head = mx.chunk_head(self._f, at - 9)
        why = mx.head_lies(head)
        if head is None or why is not None:
            raise RefusedError(why or "a chunk record cut short")
        share.hold(_reading(length, head.uncompressed_size, head.compression))
        self._f.seek(at)
        data = mx.chunk_data(self._f.read(length), None)
        return sorted(_messages(data, walk.ids, walk), key=lambda m: m[1])

    def metadata(self, name: str) -> dict[str, str] | None:
        """The metadata record `name` (None: the file has none)."""
        from mcap import records as r

        listed = self.index.metadata if self.index else ()
        for offset, length in self._places(mx.METADATA, listed, name, mx.MAX_SUMMARY_RECORD):
            self._f.seek(offset)
            head = self._f.read(9)
            if head[0] == mx.METADATA and mx.HEAD.unpack_from(head)[1] == length - 9:
                record = mx.parse(r.Metadata, self._f.read(length - 9))
                if record.name == name:
                    return dict(record.metadata)
        return None

    def attachment(self, name: str) -> bytes | None:
        """The attachment `name`'s bytes (None: the file has none), at most
        `MAX_MESSAGE_BYTES` (a simulated drive's ground truth)."""
        listed = self.index.attachments if self.index else ()
        for offset, length in self._places(mx.ATTACHMENT, listed, name, MAX_MESSAGE_BYTES):
            if (data := mx.attachment_data(self._f, offset, length, name)) is not None:
                return data
        return None

    def _places(
        self, opcode: int, listed: tuple[Any, ...], name: str, cap: int
    ) -> list[tuple[int, int]]:
        """(offset, length) of the records of `opcode` that may be `name`, found by their
        index, else in the first `SCAN_RECORDS` records; at most `cap` bytes each."""
        if listed:
            places = [(i.offset, i.length) for i in listed if i.name == name]
        else:
            try:
                walked = itertools.islice(mx.walk(self._f, self.size), SCAN_RECORDS)
                places = [(at - 9, n + 9) for op, at, n in walked if op == opcode]
            except CutShortError:
                return []
        return [(o, n) for o, n in places if 0 < o <= self.size - n and 9 <= n <= cap]


def _reading(length: int, inflated: int, compression: str) -> int:
    """The bytes that reading a chunk record takes at most: the record, its data inflated
    (an uncompressed chunk's is a view of the record), and the messages copied out of it."""
    return length + inflated * (2 if compression else 1)


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
            if length > mx.MAX_SUMMARY_RECORD:
                raise RefusedError(f"a {kind.__name__} record of {length} bytes")
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
