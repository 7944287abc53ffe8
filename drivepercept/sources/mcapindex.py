"""An MCAP file's records and summary, read under bounds: the walk of a chunk's records (each
length checked against what is left, a bounded number of records) and the summary (its size
and record count capped, its chunk indexes de-duplicated and checked against the file).

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

from drivepercept.sources.untrusted import MAX_CHUNK_BYTES, MiB, RefusedError, plausible

MAX_RECORDS_PER_CHUNK = 1_000_000  # a chunk of tiny messages holds tens of thousands
MAX_SUMMARY_BYTES = 64 * MiB  # a day's drive indexes in a few MB
MAX_SUMMARY_RECORDS = 1_000_000
MAX_SUMMARY_RECORD = 16 * MiB  # a schema, the largest summary record
MIN_MESSAGE_RECORD = 31  # opcode, length, channel, sequence, log and publish time
MAGIC = b"\x89MCAP0\r\n"
FOOTER = 1 + 8 + 8 + 8 + 4  # opcode, length, summary start, summary offset start, CRC
HEAD = struct.Struct("<BQ")  # a record's opcode and length
COMPRESSIONS = ("", "zstd", "lz4")
# opcodes
SCHEMA, CHANNEL, MESSAGE, CHUNK, MESSAGE_INDEX, CHUNK_INDEX = 0x03, 0x04, 0x05, 0x06, 0x07, 0x08
ATTACHMENT, ATTACHMENT_INDEX, STATISTICS, METADATA, METADATA_INDEX = 0x09, 0x0A, 0x0B, 0x0C, 0x0D
FOOTER_OP, DATA_END = 0x02, 0x0F


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
    counts: dict[int, int]  # channel -> messages, where plausible
    attachments: tuple[Any, ...] = ()
    metadata: tuple[Any, ...] = ()
    duplicates: int = 0
    data_end: int = 0  # where the data section ends (the summary starts)


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
    counts = dict(stats.channel_message_counts) if stats is not None else {}
    room = start + sum(c.uncompressed_size for c, why in ordered if why is None)
    return Index(
        schemas={s.id: s for s in found[SCHEMA]},
        channels={c.id: c for c in found[CHANNEL]},
        chunks=tuple(ordered),
        # a count the file cannot hold is unknown (absent): 10^12 messages in 400 KB
        counts={k: v for k, v in counts.items() if plausible(v, room, MIN_MESSAGE_RECORD) >= 0},
        attachments=tuple(found[ATTACHMENT_INDEX]),
        metadata=tuple(found[METADATA_INDEX]),
        duplicates=len(listed) - len(chunks),
        data_end=start,
    )


def index_lies(index: Any, data_end: int) -> str | None:
    """Why a chunk index cannot be read as it says (None: it may be)."""
    start, length = index.chunk_start_offset, index.chunk_length
    if start < len(MAGIC) or length < 9 or start + length > data_end:
        return f"its index places it at bytes {start}-{start + length}, outside the data"
    if index.compressed_size > length:
        return f"its index says {index.compressed_size} compressed bytes in {length}"
    if index.compression not in COMPRESSIONS:
        return f"an unknown compression {index.compression[:40]!r}"
    if index.uncompressed_size > MAX_CHUNK_BYTES:
        return (
            f"declares {index.uncompressed_size} bytes inflated, over the {MAX_CHUNK_BYTES} "
            "a chunk may hold"
        )
    return None
