"""An encoded image's size from its header, read without decoding, and the one limit every
camera frame is held to before it is decoded, whatever brought it (a recorded message, an
image folder's file, a live camera's JPEG part).

A picture too large to decode is refused before it takes memory: a 629-byte JPEG may declare
30000x30000 pixels, which OpenCV would decode into 2.7 GB. The headers are read as the
decoders read them, so that a file the decoder would take is never missed: libjpeg skips junk
bytes and fill bytes between segments (with a warning) and still decodes the picture, and so
does `jpeg_size` (up to a bound); libtiff reads the first of a tag's duplicate entries, in
any integer type, and so does `tiff_size`. What cannot be measured from its header (another
format, a damaged header) is refused, not decoded: `frame_refusal` says why.

Formats read: JPEG (SOF0-3, SOF9-11), PNG (IHDR), BMP (BITMAPINFOHEADER and later), TIFF
(the first image file directory, classic and BigTIFF), WebP (VP8, VP8L, VP8X): the ones a
camera or an image folder holds. OpenCV picks its decoder by the bytes, not the name, so the
format is told by the bytes here too.

Each reader is bounded by the header, not by the data: a JPEG's walk to its frame header is
one regular-expression search per marker (junk costs C time, not a Python loop a byte, and
no memory), reads at most `MAX_JPEG_JUNK_BYTES` of junk in all and gives up after
`MAX_SEGMENTS` segments; a TIFF's directory is read for at most `MAX_TIFF_ENTRIES` entries.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from drivepercept.geometry import MAX_SIZE_PX

# a camera frame's largest side, decoded: the rig's limit (drivepercept.geometry)
MAX_SIDE_PX = MAX_SIZE_PX
# a frame's largest size in bytes, encoded or raw: the largest frame at 4 bytes a pixel
# (bgra8). No camera's JPEG or PNG comes near it; a raw Image of the largest size fits.
MAX_FRAME_BYTES = MAX_SIDE_PX * MAX_SIDE_PX * 4

FORMATS = "JPEG, PNG, BMP, TIFF or WebP"

# libjpeg's frame headers it decodes (jdmarker.c): baseline, extended, progressive, lossless,
# and their arithmetic forms; SOF5-7, 13-15 and JPG are refused by it
_SOF_DECODED = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC9, 0xCA, 0xCB})
_SOF_REFUSED = frozenset({0xC5, 0xC6, 0xC7, 0xC8, 0xCD, 0xCE, 0xCF})
# segments libjpeg skips by their length: DHT, DAC, DQT, DNL, DRI, APP0-15, COM
_SKIPPED = frozenset({0xC4, 0xCC, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)})
# markers without a length: RST0-7, TEM
_BARE = frozenset({0x01, *range(0xD0, 0xD8)})
# libjpeg's next_marker skips any bytes up to an 0xFF, fill bytes (more 0xFF), and a stuffed
# `FF 00` as data, and takes the byte after the 0xFF run as the marker: the marker is the
# first 0xFF followed by neither 0x00 nor 0xFF. A plain search: no backtracking and no memory
# (a possessive `*+` needs Python 3.11; its 3.10 form, an atomic group made of a lookahead
# and a backreference, kept about 100 bytes a junk token: 1.1 GB for 8 MiB of junk).
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")
# junk and fill bytes read before the frame header, in all: a camera's JPEG has none, or a
# few; more is refused (libjpeg would skip any amount), so that a frame of junk costs a
# bounded scan (1 MiB: about 15 ms at worst), not one of its whole size
MAX_JPEG_JUNK_BYTES = 1 << 20
# segments before the frame header: a camera's JPEG has a handful (APPn, DQT, DHT, COM; an
# ICC profile split over APP2 segments a few dozen); a file of a million 4-byte comments
# would cost seconds of Python to walk, and is refused
MAX_SEGMENTS = 1024
MAX_TIFF_ENTRIES = 4096  # entries read from a TIFF's first directory (a real one: 10-30)


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header (SOFn), found as libjpeg finds it: SOI
    first, then markers, each after any junk and 0xFF fill bytes (a stuffed `FF 00` is
    junk too). None when libjpeg would not decode it: no SOI, an SOS or EOI before the frame
    header, an unsupported or unknown marker, a cut segment, a height of 0 (set later by a
    DNL marker: the size is not in the header), no components or more than 4 (libjpeg
    converts 1, 3 and 4 to colour), or more than `MAX_SEGMENTS` segments or
    `MAX_JPEG_JUNK_BYTES` of junk before the frame header."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i, junk_left = 2, MAX_JPEG_JUNK_BYTES
    for _ in range(MAX_SEGMENTS):
        # searched no further than the junk left allows: a marker found is within it
        found = _NEXT_MARKER.search(data, i, min(n, i + junk_left + 2))
        if found is None:  # the data ends before the next marker, or the junk is too long
            return None
        junk_left -= found.start() - i
        i = found.end()
        marker = data[i - 1]
        if marker in _BARE:
            continue
        if marker in _SOF_DECODED:
            # length (2), precision (1), height (2), width (2), components (1)
            if i + 8 > n:
                return None
            height = int.from_bytes(data[i + 3 : i + 5], "big")
            width = int.from_bytes(data[i + 5 : i + 7], "big")
            # libjpeg converts 1 (grey), 3 (YCbCr, RGB) or 4 (CMYK) components to BGR
            components_ok = 1 <= data[i + 7] <= 4
            return (width, height) if width and height and components_ok else None
        if marker not in _SKIPPED or i + 2 > n:  # SOS/EOI first, SOI again, SOF5-7..., others
            return None
        length = int.from_bytes(data[i : i + 2], "big")
        if length < 2:
            return None
        i += length
    return None


def png_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR, which must be its first chunk."""
    if bytes(data[:8]) != b"\x89PNG\r\n\x1a\n" or bytes(data[8:16]) != b"\x00\x00\x00\x0dIHDR":
        return None
    if len(data) < 24:
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def bmp_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a BMP's info header (40 bytes or more; height negative for a
    top-down picture)."""
    if bytes(data[:2]) != b"BM" or len(data) < 26:
        return None
    if int.from_bytes(data[14:18], "little") < 40:  # the 12-byte OS/2 header: not read
        return None
    width = int.from_bytes(data[18:22], "little", signed=True)
    height = int.from_bytes(data[22:26], "little", signed=True)
    return (width, abs(height)) if width > 0 and height else None


# TIFF field types an integer tag is read from, as libtiff reads ImageWidth and the others:
# BYTE, SHORT, LONG, SBYTE, SSHORT, SLONG, LONG8, SLONG8 -> (size in bytes, signed)
_TIFF_TYPES = {
    1: (1, False), 3: (2, False), 4: (4, False), 6: (1, True),
    8: (2, True), 9: (4, True), 16: (8, False), 17: (8, True),
}  # fmt: skip
_TIFF_WIDTH, _TIFF_HEIGHT, _TIFF_BITS, _TIFF_SAMPLES = 256, 257, 258, 277
_TIFF_ROWS_PER_STRIP, _TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH = 278, 322, 323
_TIFF_TAGS = frozenset(
    {_TIFF_WIDTH, _TIFF_HEIGHT, _TIFF_BITS, _TIFF_SAMPLES, _TIFF_ROWS_PER_STRIP,
     _TIFF_TILE_WIDTH, _TIFF_TILE_LENGTH}
)  # fmt: skip
_TIFF_ONE_STRIP = 2**32 - 1  # RowsPerStrip's default: the whole image in one strip
# a tile or strip may be as large as the image rounded up to 16 (tiles are multiples of 16),
# or this (a writer's usual tile, e.g. libtiff's 256x256, for an image smaller than it):
# a 256x256 tile of 4 16-bit samples holds 512 KiB
_TIFF_TILE_FLOOR_PX = 256


def tiff_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a TIFF's first image file directory (ImageWidth, ImageLength),
    little- or big-endian, classic or BigTIFF, each tag read as libtiff reads it: its first
    entry (later ones are ignored), as any integer type.

    None when the directory lies outside `data`, lacks either size, gives one of the tags
    read in another type or not positive, or describes buffers OpenCV would fill beyond a
    camera frame's: more than 4 samples a pixel or more than 16 bits a sample (a strip of
    such pixels is held whole before it is converted), or tiles or strips larger than the
    image (rounded up to 16, or `_TIFF_TILE_FLOOR_PX`): OpenCV decodes a whole tile into a
    buffer of its size, so a "64x48" file of one 8192x8192 deflate tile (196 KB) took
    258 MiB.
    """
    head = bytes(data[:4])
    if head not in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return None
    order: Literal["little", "big"] = "little" if head[:2] == b"II" else "big"
    big = head[2:] in (b"+\x00", b"\x00+")
    # classic: 4-byte offsets, 2-byte entry count, 12-byte entries; BigTIFF: 8, 8, 20
    word, count_size, entry_size = (8, 8, 20) if big else (4, 2, 12)

    def number(at: int, size: int, signed: bool = False) -> int:
        if at < 0 or at + size > len(data):
            raise IndexError(at)
        return int.from_bytes(data[at : at + size], order, signed=signed)

    fields: dict[int, int] = {}  # the first entry of each tag read (its first value)
    try:
        directory = number(8 if big else 4, word)
        entries = number(directory, count_size)
        for k in range(min(entries, MAX_TIFF_ENTRIES)):
            at = directory + count_size + k * entry_size
            tag = number(at, 2)
            if tag not in _TIFF_TAGS or tag in fields:  # libtiff ignores a tag's duplicates
                continue
            kind, count = number(at + 2, 2), number(at + 4, word)
            if kind not in _TIFF_TYPES or count < 1:
                return None
            size, signed = _TIFF_TYPES[kind]
            value_at = at + 4 + word  # the value itself, or (too long for the field) where
            if count * size > word:
                value_at = number(value_at, word)
            fields[tag] = number(value_at, size, signed)  # bits: the first sample's
    except IndexError:
        return None
    if any(value < 1 for value in fields.values()):
        return None
    width, height = fields.get(_TIFF_WIDTH, 0), fields.get(_TIFF_HEIGHT, 0)
    if not width or not height:
        return None
    if fields.get(_TIFF_SAMPLES, 1) > 4 or fields.get(_TIFF_BITS, 1) > 16:
        return None
    if _TIFF_TILE_WIDTH in fields or _TIFF_TILE_LENGTH in fields:  # tiled, as libtiff says
        tile = fields.get(_TIFF_TILE_WIDTH, width), fields.get(_TIFF_TILE_LENGTH, height)
    else:  # strips: the image's width, RowsPerStrip rows (OpenCV: its default, the image)
        rows = fields.get(_TIFF_ROWS_PER_STRIP, _TIFF_ONE_STRIP)
        tile = width, height if rows == _TIFF_ONE_STRIP else rows
    if tile[0] > _tile_limit(width) or tile[1] > _tile_limit(height):
        return None
    return width, height


def _tile_limit(side: int) -> int:
    """The largest tile or strip side a TIFF image of `side` pixels may have."""
    return max(-(-side // 16) * 16, _TIFF_TILE_FLOOR_PX)


def webp_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a WebP's first chunk: VP8 (lossy), VP8L (lossless) or VP8X
    (extended: the canvas)."""
    if len(data) < 30 or bytes(data[:4]) != b"RIFF" or bytes(data[8:12]) != b"WEBP":
        return None
    kind = bytes(data[12:16])
    if kind == b"VP8 " and bytes(data[23:26]) == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
    elif kind == b"VP8L" and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif kind == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
    else:
        return None
    return (width, height) if width and height else None


def encoded_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) of an encoded picture from its header, its format told by its bytes
    (as OpenCV tells it); None when the format is none of `FORMATS` or the header does not
    say."""
    for size in (jpeg_size, png_size, bmp_size, tiff_size, webp_size):
        found = size(data)
        if found is not None:
            return found
    return None


def size_refusal(width: int, height: int) -> str | None:
    """Why a frame of `width` x `height` pixels is refused (None: it is not)."""
    if width <= 0 or height <= 0:
        return f"a {width}x{height} picture"
    if max(width, height) > MAX_SIDE_PX:
        return (
            f"{width}x{height} pixels, larger than the {MAX_SIDE_PX}x{MAX_SIDE_PX} a camera "
            "frame may be"
        )
    return None


def frame_refusal(data: bytes | memoryview) -> str | None:
    """Why an encoded frame is refused before decoding (None: decode it): more bytes than
    any frame (`MAX_FRAME_BYTES`), a size its header does not say, or a size over the
    limit."""
    if len(data) > MAX_FRAME_BYTES:
        return f"{len(data)} bytes, more than the {MAX_FRAME_BYTES} a frame may be"
    size = encoded_size(data)
    if size is None:
        return f"its size cannot be read from its header (not a {FORMATS}, or damaged)"
    return size_refusal(*size)


def header_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from an image file's header, read without decoding: its first MiB,
    else (segments before a JPEG's frame header) up to `MAX_FRAME_BYTES`; None for other
    formats, a header that does not say, and a file that cannot be read."""
    try:
        with path.open("rb") as f:
            head = f.read(1 << 20)
            size = encoded_size(head)
            if size is None and len(head) == 1 << 20:
                size = encoded_size(head + f.read(MAX_FRAME_BYTES - len(head)))
            return size
    except OSError:
        return None
