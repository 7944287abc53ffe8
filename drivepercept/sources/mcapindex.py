"""An MCAP file's records and summary, read under bounds: the walk of a chunk's records (each
length checked against what is left, a bounded number of records), a chunk record's header
and body, and the summary (its size and record count capped, its chunk indexes de-duplicated
and checked against the file: each must point at a chunk record whose header repeats it, and
the data section must hold no chunk or message the summary leaves out; where they disagree,
the file is read front to back).

Only the record classes of the `mcap` package parse a record's body here; where a record is
and how long it is, is ours to check.
"""

from __future__ import annotations

import collections
import io
import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from drivepercept.sources.readers import SourceError
from drivepercept.sources.untrusted import MAX_CHUNK_BYTES, Buffer, MiB, RefusedError, inflate

MAX_RECORDS_PER_CHUNK = 1_000_000  # a chunk of tiny messages holds tens of thousands
MAX_CHUNK_RECORD = MAX_CHUNK_BYTES + MiB  # a chunk record: its data and its header
MAX_SUMMARY_BYTES = 64 * MiB  # a day's drive indexes in a few MB
MAX_SUMMARY_RECORDS = 1_000_000
MAX_SUMMARY_RECORD = 16 * MiB  # a schema, the largest summary record (and an attachment)
# records in a row, in the data section, that are neither chunks, messages, schemas nor
# channels (a chunk's message indexes: one per channel, at most 65535): more is not MCAP data
MAX_OTHER_RECORDS = 100_000
MIN_MESSAGE_RECORD = 31  # opcode, length, channel, sequence, log and publish time
MAGIC = b"\x89MCAP0\r\n"
FOOTER = 1 + 8 + 8 + 8 + 4  # opcode, length, summary start, summary offset start, CRC
HEAD = struct.Struct("<BQ")  # a record's opcode and length
COMPRESSIONS = ("", "zstd", "lz4")
# opcodes
SCHEMA, CHANNEL, MESSAGE, CHUNK, MESSAGE_INDEX, CHUNK_INDEX = 0x03, 0x04, 0x05, 0x06, 0x07, 0x08
ATTACHMENT, ATTACHMENT_INDEX, STATISTICS, METADATA, METADATA_INDEX = 0x09, 0x0A, 0x0B, 0x0C, 0x0D
FOOTER_OP, DATA_END = 0x02, 0x0F
CONTENT = (SCHEMA, CHANNEL, MESSAGE, CHUNK)
_CHUNK_HEAD = struct.Struct("<QQQI")  # first and last message time, size inflated, CRC


class CutShortError(SourceError):
    """The file ends inside a record, or its data cannot be read on (damaged): what came
    before it was read."""


def records(
    data: bytes | memoryview, *, limit: int = MAX_RECORDS_PER_CHUNK
) -> Iterator[tuple[int, int, int]]:
    """(opcode, body start, body length) of each record of an inflated chunk, each length
    checked against what is left; at most `limit` records.

    Raises:
        RefusedError: a record runs past the chunk's end, or too many records.
    """
    pos, end = 0, len(data)
    for n in itertools.count():
        if pos >= end:
            return
        if n >= limit:
            raise RefusedError(f"holds more than {limit} records")
        if end - pos < 9:
            raise RefusedError("ends inside a record")
        opcode, length = HEAD.unpack_from(data, pos)
        if length > end - pos - 9:
            raise RefusedError(f"holds a record of {length} bytes with {end - pos - 9} left")
        yield opcode, pos + 9, length
        pos += 9 + length


def parse(record_type: Any, body: bytes) -> Any:
    """A record's body parsed by its `mcap.records` class (reads never past `body`)."""
    from mcap.data_stream import ReadDataStream

    return record_type.read(ReadDataStream(io.BytesIO(body)))


@dataclass(frozen=True)
class Index:
    """What the summary says, checked against the file: read once per file version."""

    schemas: dict[int, Any]
    channels: dict[int, Any]
    # (chunk index, why it cannot be read or None), de-duplicated, by first message time
    chunks: tuple[tuple[Any, str | None], ...]
    counts: dict[int, int]  # channel -> messages, as the statistics claim (hints)
    attachments: tuple[Any, ...] = ()
    metadata: tuple[Any, ...] = ()
    duplicates: int = 0
    data_end: int = 0  # where the data section ends (the summary starts)
    room: int = 0  # the bytes the file's messages may take (its data section, inflated)
    # why the chunk indexes disagree with the file (None: they agree): read front to back
    disagrees: str | None = None


def read_index(f: IO[bytes], size: int) -> Index | None:
    """The summary of an MCAP file, bounded; None when it has none or it cannot be read (the
    file is then read front to back)."""
    from mcap import records as r

    if size < len(MAGIC) * 2 + FOOTER:
        return None
    f.seek(size - len(MAGIC) - FOOTER)
    tail = f.read(FOOTER + len(MAGIC))
    opcode, length = HEAD.unpack_from(tail)
    if tail[-8:] != MAGIC or opcode != FOOTER_OP or length != FOOTER - 9:
        return None
    (start,) = struct.unpack_from("<Q", tail, 9)
    end = size - len(MAGIC) - FOOTER
    if start == 0 or not len(MAGIC) <= start <= end or end - start > MAX_SUMMARY_BYTES:
        return None
    f.seek(start)
    body = f.read(end - start)
    kinds = {SCHEMA: r.Schema, CHANNEL: r.Channel, CHUNK_INDEX: r.ChunkIndex}
    kinds |= {STATISTICS: r.Statistics, ATTACHMENT_INDEX: r.AttachmentIndex}
    kinds |= {METADATA_INDEX: r.MetadataIndex}
    found: dict[int, list[Any]] = collections.defaultdict(list)
    try:
        for opcode, at, length in records(body, limit=MAX_SUMMARY_RECORDS):
            if opcode in kinds:
                if length > MAX_SUMMARY_RECORD:
                    return None
                found[opcode].append(parse(kinds[opcode], body[at : at + length]))
    except Exception:  # a damaged summary: the data section is still there
        return None
    chunks: dict[int, tuple[Any, str | None]] = {}
    listed = found[CHUNK_INDEX]
    for index in listed:
        chunks.setdefault(index.chunk_start_offset, (index, index_lies(index, start)))
    stats = found[STATISTICS][-1] if found[STATISTICS] else None
    ordered = sorted(
        chunks.values(), key=lambda c: (c[0].message_start_time, c[0].chunk_start_offset)
    )
    return Index(
        schemas={s.id: s for s in found[SCHEMA]},
        channels={c.id: c for c in found[CHANNEL]},
        chunks=tuple(ordered),
        counts=dict(stats.channel_message_counts) if stats is not None else {},
        attachments=tuple(found[ATTACHMENT_INDEX]),
        metadata=tuple(found[METADATA_INDEX]),
        duplicates=len(listed) - len(chunks),
        data_end=start,
        room=start + sum(c.uncompressed_size for c, why in ordered if why is None),
        disagrees=_disagreement(f, chunks, start) if chunks else None,
    )


def index_lies(index: Any, data_end: int) -> str | None:
    """Why a chunk index cannot be read as it says (None: it may be): outside the data,
    over the chunk limit, sizes that do not add up to its length, an unknown compression."""
    start, length = index.chunk_start_offset, index.chunk_length
    if start < len(MAGIC) or length < 9 or start + length > data_end:
        return f"its index places it at bytes {start}-{start + length}, outside the data"
    if length > MAX_CHUNK_RECORD:
        return f"a chunk record of {length} bytes, over the {MAX_CHUNK_RECORD} it may be"
    if length - 9 != fields_length(index.compression) + index.compressed_size:
        return (
            f"its index says {index.compressed_size} compressed bytes in a record of "
            f"{length} (a chunk record holds its header and its data, nothing more)"
        )
    if index.compression not in COMPRESSIONS:
        return f"an unknown compression {index.compression[:40]!r}"
    if index.uncompressed_size > MAX_CHUNK_BYTES:
        return (
            f"declares {index.uncompressed_size} bytes inflated, over the {MAX_CHUNK_BYTES} "
            "a chunk may hold"
        )
    return None


def fields_length(compression: str) -> int:
    """The bytes of a chunk record's body before its data (times, size, CRC, compression,
    data length)."""
    return _CHUNK_HEAD.size + 4 + len(compression.encode()) + 8


@dataclass(frozen=True)
class ChunkHead:
    """A chunk record's opcode, length and the fields before its data, read from the file."""

    opcode: int
    length: int  # of its body
    uncompressed_size: int
    compression: str
    compressed_size: int


def chunk_head(f: IO[bytes], offset: int) -> ChunkHead | None:
    """The chunk record head at `offset` (None: too short to hold one)."""
    f.seek(offset)
    head = f.read(9 + _CHUNK_HEAD.size + 4)
    if len(head) < 9 + _CHUNK_HEAD.size + 4:
        return None
    opcode, length = HEAD.unpack_from(head)
    _, _, size, _, n = struct.unpack_from("<QQQII", head, 9)
    more = f.read(min(n, 64) + 8)
    if n > 64 or len(more) < n + 8:  # (a compression is a short name)
        return None
    (data_length,) = struct.unpack_from("<Q", more, n)
    return ChunkHead(opcode, length, size, more[:n].decode("utf-8", "replace"), data_length)


def head_lies(head: ChunkHead | None) -> str | None:
    """Why a chunk record cannot be read as its head says, before its body is (None: it
    may be): its data is not the rest of the record exactly, or past the limit."""
    if head is None:
        return "a chunk record cut short"
    if head.length != fields_length(head.compression) + head.compressed_size:
        return f"declares {head.compressed_size} bytes of data in a record of {head.length}"
    if head.uncompressed_size > MAX_CHUNK_BYTES:
        return (
            f"declares {head.uncompressed_size} bytes inflated, over the {MAX_CHUNK_BYTES} "
            "a chunk may hold"
        )
    return None


def head_disagrees(head: ChunkHead | None, index: Any) -> str | None:
    """Why the chunk record head does not repeat its index (None: it does)."""
    if head is None or head.opcode != CHUNK or head.length != index.chunk_length - 9:
        return "no chunk record at the offset its index gives"
    if (head.uncompressed_size, head.compression, head.compressed_size) != (
        index.uncompressed_size,
        index.compression,
        index.compressed_size,
    ):
        return "its header and its index disagree on its size or compression"
    return None


def _disagreement(f: IO[bytes], chunks: dict[int, tuple[Any, str | None]], end: int) -> str | None:
    """Why the summary's chunk indexes disagree with the data section (None: they agree).
    Walks the records between the chunks (a chunk and the message indexes after it are
    jumped over, reading only the chunk's head): bounded by the number of chunks and
    `MAX_OTHER_RECORDS` in a row."""
    pos, seen, others = len(MAGIC), 0, 0
    while pos < end:
        if pos in chunks:
            index = chunks[pos][0]
            why = head_disagrees(chunk_head(f, pos), index)
            if why is not None:
                return f"the chunk at byte {pos}: {why}"
            seen, others = seen + 1, 0
            pos += index.chunk_length + index.message_index_length
            continue
        f.seek(pos)
        head = f.read(9)
        opcode, length = HEAD.unpack_from(head) if len(head) == 9 else (0, 0)
        if opcode in (DATA_END, FOOTER_OP):
            break
        if opcode in (CHUNK, MESSAGE):
            what = "chunk" if opcode == CHUNK else "message"
            return f"a {what} at byte {pos} that no chunk index lists"
        others += 1
        if opcode == 0 or length > end - pos - 9 or others > MAX_OTHER_RECORDS:
            return f"no record it can read at byte {pos}"
        pos += 9 + length
    if seen < len(chunks):
        return f"{len(chunks) - seen} of its chunk indexes point where no chunk record starts"
    return None


def attachment_data(f: IO[bytes], offset: int, length: int, name: str) -> bytes | None:
    """The data of the attachment record at `offset` (`length` bytes with its opcode and
    length) if it is one named `name`, read in one piece (the `mcap` parse of a record
    copies it twice more); None if it is not."""
    try:
        f.seek(offset)
        head = f.read(9 + 16 + 4)  # opcode, length, log and create times, name's length
        opcode, body = HEAD.unpack_from(head)
        (n,) = struct.unpack_from("<I", head, 25)
        if opcode != ATTACHMENT or body != length - 9 or n > 4096 or f.read(n) != name.encode():
            return None
        (m,) = struct.unpack("<I", f.read(4))  # its media type's length
        f.seek(m, 1)
        (size,) = struct.unpack("<Q", f.read(8))
        if 16 + 4 + n + 4 + m + 8 + size + 4 != body:  # (and its CRC)
            return None
    except struct.error:  # cut short
        return None
    data = f.read(size)
    return data if len(data) == size else None


def walk(f: IO[bytes], size: int) -> Iterator[tuple[int, int, int]]:
    """(opcode, body offset, body length) of each record of the data section, front to
    back, up to its DataEnd (or Footer) record.

    Raises:
        CutShortError: the file ends inside a record or before DataEnd, or holds what is not
            MCAP data: a record of opcode 0 (zeros), or more than `MAX_OTHER_RECORDS` records
            in a row that hold no content (a flood of empty records).
    """
    pos, others = len(MAGIC), 0
    while True:
        f.seek(pos)
        head = f.read(9)
        if len(head) < 9:
            raise CutShortError(f"it ends at byte {size}, inside its data")
        opcode, length = HEAD.unpack_from(head)
        if opcode in (DATA_END, FOOTER_OP):  # the data ends here
            return
        if length > size - pos - 9:
            raise CutShortError(f"it ends at byte {size}, inside a record of {length} bytes")
        others = 0 if opcode in CONTENT else others + 1
        if opcode == 0 or others > MAX_OTHER_RECORDS:
            what = "a record of opcode 0" if opcode == 0 else f"{others} records in a row"
            raise CutShortError(f"{what} at byte {pos}, which is not MCAP data (damaged)")
        yield opcode, pos + 9, length
        pos += 9 + length


def chunk_data(body: Buffer, index: Any | None) -> Buffer:
    """A chunk record's body -> its records, inflated under the caps and checked against
    its index where it has one (an uncompressed chunk: a view of `body`, not a copy).

    Raises:
        RefusedError: a body cut short, data that is not the rest of the body exactly, a
            header that disagrees with its index, an unknown compression, or data that
            does not inflate to the size it declares (`untrusted.inflate`).
    """
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
    if data_length != len(body) - at:
        raise RefusedError(f"declares {data_length} bytes of data, {len(body) - at} there")
    if index is not None and (
        (size, compression, data_length)
        != (index.uncompressed_size, index.compression, index.compressed_size)
    ):
        raise RefusedError("its header and its index disagree on its size or compression")
    if compression not in COMPRESSIONS:
        raise RefusedError(f"an unknown compression {compression[:40]!r}")
    return inflate(memoryview(body)[at:], compression, size)
