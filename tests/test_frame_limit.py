"""One frame-size limit, checked before decoding, for every source (issue 43).

A 675-byte JPEG may declare 30000x30000 pixels (2.7 GB decoded), one junk byte after its
APP0 segment made the old header check give up while libjpeg still decodes it, and OpenCV
raises on 60000x60000 (which failed the whole camera). Here: the header readers read sizes
as the decoders do, and such frames in an image folder, from a live camera and in a recorded
drive are refused before decoding, counted as undecodable, and the run goes on (exit 3);
the runs' peak memory is measured in a child process (marked slow).
"""

from __future__ import annotations

import json
import logging
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import children
import cv2
import numpy as np
import pytest
from hostile import hostile_camera, huge_jpegs, jpeg, with_junk, with_size

from drivepercept.errors import RepeatedWarning
from drivepercept.sources import imagesize, rosimage
from drivepercept.sources.imagesize import (
    MAX_FRAME_BYTES,
    encoded_size,
    frame_refusal,
    jpeg_size,
    tiff_size,
)
from drivepercept.sources.readers import CorruptFrameError, ImageFolderReader, RawFrame, SourceError

Cli = Callable[[list[str]], tuple[int, str]]
PEAK_LIMIT = 1_500_000_000  # bytes: a decoded 30000x30000 frame alone is 2.7 GB
T0_NS = 1_767_225_600 * 1_000_000_000


def _encoded(ext: str, width: int = 64, height: int = 48, *params: int) -> bytes:
    ok, data = cv2.imencode(ext, np.full((height, width, 3), 90, np.uint8), list(params))
    assert ok
    return data.tobytes()


def _decodes(data: bytes) -> tuple[int, int] | None:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return None if image is None else (image.shape[1], image.shape[0])


# TIFF field types: BYTE, SHORT, LONG, SBYTE, SSHORT, SLONG, FLOAT (not read), LONG8, SLONG8
BYTE, SHORT, LONG, SBYTE, SSHORT, SLONG, FLOAT, LONG8, SLONG8 = 1, 3, 4, 6, 8, 9, 11, 16, 17
_TIFF_SIZES = {BYTE: 1, SHORT: 2, LONG: 4, SBYTE: 1, SSHORT: 2, SLONG: 4, FLOAT: 4, LONG8: 8,
               SLONG8: 8}  # fmt: skip
TiffEntry = tuple[int, int, list[int]]  # tag, field type, values


def _tiff_file(
    entries: list[TiffEntry], *, pixels: bytes = b"", big_endian: bool = False,
    bigtiff: bool = False,
) -> bytes:  # fmt: skip
    """A TIFF by hand: its header, `pixels` (from offset 8, or 16 for BigTIFF), then its
    first directory holding `entries` in the order given (duplicates too), their values in
    the field when they fit, else after the directory."""
    order: Any = "big" if big_endian else "little"
    word, count_size, entry_size = (8, 8, 20) if bigtiff else (4, 2, 12)

    def n(value: int, size: int, signed: bool = False) -> bytes:
        return value.to_bytes(size, order, signed=signed)

    pixels += b"\0" * (len(pixels) % 2)  # the directory at an even offset
    directory = (16 if bigtiff else 8) + len(pixels)
    mark = (b"MM" if big_endian else b"II") + n(43 if bigtiff else 42, 2)
    head = mark + (n(8, 2) + n(0, 2) + n(directory, 8) if bigtiff else n(directory, 4))
    after = directory + count_size + len(entries) * entry_size + word
    body, values = n(len(entries), count_size), b""
    for tag, kind, items in entries:
        size, signed = _TIFF_SIZES[kind], kind in (SBYTE, SSHORT, SLONG, SLONG8)
        packed = b"".join(n(v, size, signed) for v in items)
        if len(packed) > word:
            packed, values = n(after + len(values), word), values + packed
        body += n(tag, 2) + n(kind, 2) + n(len(items), word) + packed.ljust(word, b"\0")
    return head + pixels + body + n(0, word) + values


def _tiff(
    width: int, height: int, *, big_endian: bool = False, bigtiff: bool = False,
    samples: int = 3, bits: int = 8, more: tuple[TiffEntry, ...] = (),
) -> bytes:  # fmt: skip
    """A TIFF header and first directory: ImageWidth and ImageLength as LONGs,
    BitsPerSample (three SHORTs: out of line in a classic TIFF), SamplesPerPixel, `more`."""
    entries = [(256, LONG, [width]), (257, LONG, [height]), (258, SHORT, [bits] * 3),
               (277, SHORT, [samples]), *more]  # fmt: skip
    return _tiff_file(sorted(entries), big_endian=big_endian, bigtiff=bigtiff)


def _rgb_tiff(
    width: int = 64, height: int = 48, *, tile: tuple[int, int] | None = None,
    rows: int | None = None, widths: tuple[TiffEntry, ...] = (),
) -> bytes:  # fmt: skip
    """A TIFF OpenCV decodes: 8-bit RGB, uncompressed, in one strip of `rows` rows (None:
    no RowsPerStrip, the default) or in tiles of `tile` (width, height); `widths`: its
    ImageWidth entries, first in the directory (else one LONG of `width`)."""
    grey = 90
    if tile is None:
        pixels = bytes([grey]) * (width * height * 3)
        layout = [(273, LONG, [8]), (279, LONG, [len(pixels)])]
        layout += [] if rows is None else [(278, LONG, [rows])]
    else:
        across, down = -(-width // tile[0]), -(-height // tile[1])
        size = tile[0] * tile[1] * 3
        pixels = bytes([grey]) * (size * across * down)
        layout = [(322, LONG, [tile[0]]), (323, LONG, [tile[1]]),
                  (324, LONG, [8 + k * size for k in range(across * down)]),
                  (325, LONG, [size] * (across * down))]  # fmt: skip
    entries = [(257, LONG, [height]), (258, SHORT, [8, 8, 8]), (259, SHORT, [1]),
               (262, SHORT, [2]), (277, SHORT, [3]), (284, SHORT, [1]), *layout]  # fmt: skip
    return _tiff_file([*(widths or [(256, LONG, [width])]), *sorted(entries)], pixels=pixels)


# --------------------------------------------------------------------------- header readers


def test_a_jpeg_size_is_read_where_libjpeg_reads_it() -> None:
    small = jpeg()
    app0_end = 4 + int.from_bytes(small[4:6], "big")
    fill = small[:app0_end] + b"\xff\xff\xff" + small[app0_end:]  # fill bytes before a marker
    stuffed = with_junk(small, b"\xff\x00\x12\xff\x00")  # FF 00 is data, skipped as junk
    # junk, fill bytes and stuffed zeros between segments: libjpeg decodes each, and the
    # header reader finds the size each time (the old reader gave up: None, then decoded)
    for data in (small, with_junk(small), with_junk(small, b"junk" * 1000), fill, stuffed):
        assert jpeg_size(data) == (64, 48) == _decodes(data)
    assert jpeg_size(with_junk(with_size(small, 30000, 30000))) == (30000, 30000)
    assert jpeg_size(memoryview(with_size(small, 60000, 60000))) == (60000, 60000)


def test_a_jpeg_libjpeg_would_not_decode_has_no_size() -> None:
    small = jpeg()
    app0_end = 4 + int.from_bytes(small[4:6], "big")
    sof = small.index(b"\xff\xc0")
    sos = small.index(b"\xff\xda")
    cases = {
        "no SOI": b"\x00" + small,
        "SOS before SOF": small[:app0_end] + small[sos:],
        "EOI before SOF": small[:app0_end] + b"\xff\xd9" + small[app0_end:],
        "SOF5 (unsupported)": small[:sof] + b"\xff\xc5" + small[sof + 2 :],
        "unknown marker": small[:app0_end] + b"\xff\x02\x00\x04ab" + small[app0_end:],
        "height 0 (DNL)": with_size(small, 64, 0),
        "5 components": small[: sof + 9] + b"\x05" + small[sof + 10 :],
        "cut inside the SOF": small[: sof + 6],
        "cut before any marker": small[:app0_end],
        "html": b"<html></html>",
        "comments past MAX_SEGMENTS": b"\xff\xd8"
        + b"\xff\xfe\x00\x02" * (imagesize.MAX_SEGMENTS + 1)
        + small[2:],
    }
    for name, data in cases.items():
        assert jpeg_size(data) is None, name
    assert _decodes(cases["SOS before SOF"]) is None  # as libjpeg: no picture
    assert frame_refusal(cases["SOF5 (unsupported)"]) is not None


def test_junk_before_the_frame_header_is_bounded_and_searched_in_c_time() -> None:
    small, bound = jpeg(), imagesize.MAX_JPEG_JUNK_BYTES
    # given junk up to the bound before the frame header, in one run or in two: libjpeg
    # decodes each, and the size is read
    one_run = with_junk(small, b"\x00" * bound)
    two_runs = b"\xff\xd8" + b"\x00\xff\x00" * (bound // 6) + with_junk(small, b"\x00" * 8)[2:]
    assert jpeg_size(one_run) == jpeg_size(two_runs) == (64, 48) == _decodes(one_run)
    # one byte more, in either: refused
    assert jpeg_size(with_junk(small, b"\x00" * (bound + 1))) is None
    two_runs = b"\xff\xd8" + b"\x00" * (bound - 4) + with_junk(small, b"\x00" * 5)[2:]
    assert jpeg_size(two_runs) is None
    # when a frame is 8 MiB of junk of each kind (zeros, stuffed FF 00, fill bytes, ...)
    frames = [
        b"\xff\xd8" + pattern * ((8 << 20) // len(pattern)) + small[2:]
        for pattern in (b"\x00", b"\x00\xff\x00", b"\xff", b"\xff\x00", b"\xff\xff\x00")
    ]
    tracemalloc.start()
    started = time.process_time()
    try:
        assert [jpeg_size(data) for data in frames] == [None] * len(frames)
        took = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # then each costs the bounded search (1 MiB), in C and without memory: unbounded, the
    # search took 3-115 ms for 8 MiB of each; the 3.10 form of the old regex (an atomic
    # group made of a lookahead) took 0.8-1.1 s and 0.6-1.1 GB (measured, Python 3.11)
    print(f"5 frames of 8 MiB of junk: {took * 1000:.0f} ms CPU, {peak} bytes traced")
    assert took < 1.0 and peak < 1 << 20, (took, peak)


def test_png_bmp_webp_and_tiff_sizes_come_from_their_headers() -> None:
    # given the formats OpenCV writes: each size read from its header
    for ext, params in [
        (".png", ()), (".bmp", ()), (".tiff", ()), (".webp", ()),
        (".webp", (cv2.IMWRITE_WEBP_QUALITY, 101)),  # lossless: VP8L
    ]:  # fmt: skip
        data = _encoded(ext, 64, 48, *params)
        assert encoded_size(data) == (64, 48) == _decodes(data), (ext, params)
    # a PNG whose IHDR says 9000x9000, cut short, or whose first chunk is not IHDR
    png = bytearray(_encoded(".png"))
    png[16:24] = (9000).to_bytes(4, "big") * 2
    assert encoded_size(bytes(png)) == (9000, 9000)
    assert encoded_size(bytes(png[:20])) is None
    assert encoded_size(bytes(png[:12]) + b"tEXt" + bytes(png[16:])) is None
    # a top-down BMP (negative height); the 12-byte OS/2 header is not read
    bmp = bytearray(_encoded(".bmp"))
    bmp[22:26] = (-48).to_bytes(4, "little", signed=True)
    assert encoded_size(bytes(bmp)) == (64, 48)
    bmp[14:18] = (12).to_bytes(4, "little")
    assert encoded_size(bytes(bmp)) is None
    # an extended WebP (VP8X): its canvas
    vp8x = b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00"
    assert encoded_size(vp8x + (29999).to_bytes(3, "little") * 2) == (30000, 30000)
    # GIF, PNM: not read, so refused
    assert encoded_size(b"GIF89a\x40\x00\x30\x00") is None
    assert frame_refusal(b"P6\n64 48\n255\n" + b"\0" * 9216) is not None


def test_tiff_sizes_in_both_byte_orders_classic_and_bigtiff() -> None:
    for big_endian in (False, True):
        for bigtiff in (False, True):
            data = _tiff(30000, 20000, big_endian=big_endian, bigtiff=bigtiff)
            assert tiff_size(data) == (30000, 20000), (big_endian, bigtiff)
    assert _decodes(_encoded(".tiff")) == tiff_size(_encoded(".tiff")) == (64, 48)
    # the directory outside the data, or a cut one
    data = _tiff(64, 48)
    assert tiff_size(data[:4] + (10**6).to_bytes(4, "little") + data[8:]) is None
    assert tiff_size(data[:20]) is None
    # pixels widened beyond a frame's in memory: 5 samples, or 32 bits a sample
    assert tiff_size(_tiff(64, 48, samples=4, bits=16)) == (64, 48)
    assert tiff_size(_tiff(64, 48, samples=5)) is None
    assert tiff_size(_tiff(64, 48, bits=32, big_endian=True)) is None


def test_a_tiff_tag_is_read_from_its_first_entry_in_any_integer_type() -> None:
    # given ImageWidth twice, the first one SLONG or not: libtiff reads the first entry of a
    # tag and ignores the others, and the size read is the one OpenCV decodes
    for widths, width in [
        (((256, LONG, [64]), (256, LONG, [32])), 64),
        (((256, LONG, [32]), (256, LONG, [64])), 32),
        (((256, SLONG, [64]), (256, LONG, [32])), 64),
    ]:
        data = _rgb_tiff(widths=widths)
        assert tiff_size(data) == (width, 48) == _decodes(data), widths
    # a duplicate 30000/100 pair, in both orders: the first decides (the last let a
    # 30000x30000 deflate strip, 79 KB, be decoded)
    big_first = [(256, LONG, [30000]), (256, LONG, [100]), (257, LONG, [30000]),
                 (257, LONG, [100])]  # fmt: skip
    assert "30000x30000 pixels" in str(frame_refusal(_tiff_file(big_first)))
    assert tiff_size(_tiff_file(big_first[::-1])) == (100, 100)
    # every integer type libtiff reads a size in, SLONG alone included; as OpenCV decodes
    for kind in (BYTE, SHORT, LONG, SBYTE, SSHORT, SLONG, LONG8, SLONG8):
        for bigtiff in (False, True):
            sizes = [(256, kind, [100]), (257, kind, [48]), (258, kind, [8]), (277, kind, [3])]
            assert tiff_size(_tiff_file(sizes, bigtiff=bigtiff)) == (100, 48), (kind, bigtiff)
        data = _rgb_tiff(widths=((256, kind, [64]),))
        assert tiff_size(data) == (64, 48) == _decodes(data), kind
    # another type (the first entry decides), a count of 0, a size or sample not positive
    for entries in [
        [(256, FLOAT, [100]), (257, LONG, [48])],
        [(256, FLOAT, [100]), (256, LONG, [100]), (257, LONG, [48])],
        [(256, LONG, []), (257, LONG, [48])],
        [(256, SLONG, [-300]), (257, LONG, [48])],
        [(256, LONG, [100]), (257, SSHORT, [0])],
        [(256, LONG, [100]), (257, LONG, [48]), (258, SSHORT, [-8])],
        [(256, LONG, [100]), (257, LONG, [48]), (277, SHORT, [0])],
    ]:
        assert tiff_size(_tiff_file(entries)) is None, entries


def test_tiff_tiles_and_strips_larger_than_the_image_are_refused() -> None:
    # given a 64x48 TIFF in tiles or in one strip that OpenCV decodes
    layouts = [_rgb_tiff(tile=tile) for tile in [(32, 32), (64, 48), (256, 256)]]
    layouts += [_rgb_tiff(rows=rows) for rows in [None, 48, 256, 2**32 - 1]]
    for k, data in enumerate(layouts):
        assert tiff_size(data) == (64, 48) == _decodes(data), k
    # when its tiles are larger than the image rounded up to 16 (or 256): OpenCV decodes a
    # whole tile into a buffer of its size (one 8192x8192 deflate tile, 196 KB: 258 MiB)
    for tile in [(8192, 8192), (272, 16), (16, 8192)]:
        more = ((322, LONG, [tile[0]]), (323, LONG, [tile[1]]))
        assert tiff_size(_tiff(64, 48, more=more)) is None, tile
    assert tiff_size(_tiff(64, 48, more=((322, SHORT, [8192]),))) is None  # its length: 48
    tiled = _tiff(64, 48, more=((322, LONG, [8192]), (323, LONG, [8192])))
    assert "cannot be read from its header" in str(frame_refusal(tiled))
    # or strips of more rows (RowsPerStrip's default, 2^32-1, is the image: read as such)
    assert tiff_size(_tiff(64, 48, more=((278, LONG, [272]),))) is None
    assert tiff_size(_tiff(64, 48, more=((278, LONG, [2**32 - 2]),))) is None
    # then refused; a larger image's tiles and strips may be its size rounded up to 16
    larger: list[tuple[tuple[TiffEntry, ...], tuple[int, int] | None]] = [
        (((322, LONG, [1008]), (323, LONG, [608])), (1000, 600)),
        (((322, LONG, [1024]), (323, LONG, [608])), None),
        (((322, LONG, [1008]), (323, LONG, [624])), None),
        (((278, SHORT, [608]),), (1000, 600)),
        (((278, SHORT, [624]),), None),
    ]
    for entries, size in larger:
        assert tiff_size(_tiff(1000, 600, more=entries)) == size, entries


def test_frame_refusal_says_why() -> None:
    assert frame_refusal(jpeg()) is None
    assert "30000x30000 pixels, larger than the 8192x8192" in str(
        frame_refusal(with_junk(with_size(jpeg(), 30000, 30000)))
    )
    assert "cannot be read from its header" in str(frame_refusal(b"\xff\xd8 not a jpeg"))
    assert "more than the" in str(frame_refusal(memoryview(bytes(MAX_FRAME_BYTES + 1))))


def test_a_repeated_warning_is_said_a_few_times_then_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given a warning throttled to a line every 10 s, on a clock the test moves
    now_ns = [5_000_000_000]
    log = logging.getLogger("test.repeated")
    warning = RepeatedWarning(log, first=3, every_s=10.0, clock=lambda: now_ns[0])
    with caplog.at_level(logging.WARNING, logger="test.repeated"):
        # when it repeats 10 times within the same instant
        for k in range(10):
            warning.warn("frame %d skipped", k)
        # then the first 3 are said, the third saying what comes next
        said = [r.getMessage() for r in caplog.records]
        assert said == [
            "frame 0 skipped", "frame 1 skipped",
            "frame 2 skipped (more like it: one line every 10 s)",
        ]  # fmt: skip
        # and nothing until 10 s have passed, then one line with the count since
        now_ns[0] += 9_999_999_999
        warning.warn("frame %d skipped", 10)
        assert len(caplog.records) == 3
        now_ns[0] += 1
        warning.warn("frame %d skipped", 11)
        assert caplog.records[-1].getMessage() == "frame 11 skipped (8 more like it since)"
        warning.warn("frame %d skipped", 12)
        warning.warn("frame %d skipped", 13)
        warning.close()
        warning.close()  # says nothing more
    said = [r.getMessage() for r in caplog.records]
    assert said[4:] == ["frame 13 skipped (2 more like it not logged, this the last)"]
    assert warning.count == 14


# --------------------------------------------------------------------------- decoding


def test_an_encoded_frame_over_the_limit_is_refused_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    real = cv2.imdecode

    def counted(buf: Any, flags: int) -> Any:
        decoded.append(len(buf))
        return real(buf, flags)

    monkeypatch.setattr(cv2, "imdecode", counted)
    for name, data in huge_jpegs().items():
        with pytest.raises(CorruptFrameError, match=r"refused before decoding: .* pixels"):
            RawFrame(None, 0.0, 0, jpeg=data).image_bgr  # noqa: B018 (the property decodes)
        assert decoded == [], name
    assert RawFrame(None, 0.0, 0, jpeg=jpeg()).image_bgr.shape == (48, 64, 3)
    assert decoded == [len(jpeg())]

    # and an error OpenCV raises while decoding is one corrupt frame, not an exception
    def raising(buf: Any, flags: int) -> None:
        raise cv2.error("pixels <= CV_IO_MAX_IMAGE_PIXELS")

    monkeypatch.setattr(cv2, "imdecode", raising)
    with pytest.raises(CorruptFrameError, match="OpenCV refused to decode it"):
        RawFrame(None, 0.0, 0, jpeg=jpeg()).image_bgr  # noqa: B018


class _Untouchable:
    """Image data that fails the test if anything reads it (only its length is known)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        raise AssertionError("the data was read")


@pytest.mark.parametrize(
    ("width", "height", "step", "encoding", "size", "why"),
    [
        (20000, 20000, 60000, "rgb8", 1_200_000_000, "more than the"),
        (9000, 9000, 9000, "mono8", 81_000_000, "9000x9000 pixels"),
        (640, 480, 1_000_000, "rgb8", 480_000_000, "more than the"),
        (640, 480, 640 * 3 + 4097, "rgb8", 480 * 6017, "at most 4096 of padding"),
        (8000, 8000, 8000 * 4 + 4096, "bgra8", 1000, "rows of 36096 bytes"),
        (640, 480, 100, "rgb8", 480 * 100, "rows of 100 bytes"),
    ],
)
def test_a_raw_image_is_refused_by_its_fields_before_its_data_is_read(
    width: int, height: int, step: int, encoding: str, size: int, why: str
) -> None:
    msg = {"width": width, "height": height, "step": step, "encoding": encoding}
    msg["data"] = _Untouchable(size)
    with pytest.raises(CorruptFrameError, match=why):
        rosimage.to_frame(msg, "sensor_msgs/msg/Image", log_time_ns=1, arrived_ns=1)


def test_a_compressed_message_over_the_limit_is_refused_as_it_is_read() -> None:
    for data in huge_jpegs().values():
        msg = {"data": np.frombuffer(data, np.uint8)}
        with pytest.raises(CorruptFrameError, match="refused before decoding"):
            rosimage.to_frame(msg, "sensor_msgs/msg/CompressedImage", log_time_ns=1, arrived_ns=1)


def test_a_frame_is_held_to_the_limit_once_however_it_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from drivepercept.sources import mjpeg, readers

    # given every check of the frame limit counted, wherever it is called from
    checks: list[int] = []

    def counted(data: bytes | memoryview) -> str | None:
        checks.append(len(data))
        return frame_refusal(data)

    for module in (readers, rosimage, mjpeg):
        monkeypatch.setattr(module, "frame_refusal", counted)
    # when a recorded compressed image is read, then decoded (a junk scan of up to 1 MiB)
    msg = {"data": np.frombuffer(jpeg(), np.uint8)}
    frame = rosimage.to_frame(msg, "sensor_msgs/msg/CompressedImage", log_time_ns=1, arrived_ns=1)
    assert frame.checked and frame.image_bgr.shape == (48, 64, 3)
    # then its header was read once; a frame that came unchecked is checked as it decodes
    assert checks == [len(jpeg())]
    assert RawFrame(None, 0.0, 0, jpeg=jpeg()).image_bgr.shape == (48, 64, 3)
    assert len(checks) == 2


# --------------------------------------------------------------------------- image folders


def _folder(root: Path) -> Path:
    """Three good images (PNG, JPEG, TIFF) among refused ones, the first entry refused."""
    folder = root / "images"
    folder.mkdir()
    huge = huge_jpegs()
    (folder / "000.jpg").write_bytes(huge["30000x30000 junk"])
    (folder / "001.png").write_bytes(_encoded(".png"))
    (folder / "002.jpg").write_bytes(huge["30000x30000"])
    (folder / "003.jpg").write_bytes(_encoded(".jpg"))
    (folder / "004.jpg").write_bytes(huge["60000x60000"])
    (folder / "005.tif").write_bytes(_encoded(".tiff"))
    (folder / "006.tif").write_bytes(_tiff(30000, 30000))
    return folder


def test_an_image_folder_skips_and_counts_frames_over_the_limit_the_first_too(
    tmp_path: Path,
) -> None:
    reader = ImageFolderReader(_folder(tmp_path), fps=10.0)
    got = []
    while (frame := reader.read()) is not None:
        got.append((frame.image_bgr.shape, round(frame.pts_s, 3)))
    reader.close()
    # then the good ones come, with the times of their places in the folder
    assert got == [((48, 64, 3), 0.1), ((48, 64, 3), 0.3), ((48, 64, 3), 0.5)]
    assert reader.undecodable == 4 and (reader.info.width, reader.info.height) == (64, 48)


def test_a_folder_with_no_usable_image_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "huge"
    folder.mkdir()
    for k, data in enumerate(huge_jpegs().values()):
        (folder / f"{k}.jpg").write_bytes(data)
    with pytest.raises(SourceError) as err:
        ImageFolderReader(folder)
    message = str(err.value)
    assert message.startswith(f"no usable image in {folder}: {folder / '0.jpg'}: ")
    assert "30000x30000 pixels" in message and message.endswith("(2 more skipped)")


def _undecodable_run(err: str, out: Path, camera: str) -> dict[str, Any]:
    """The one error line says the undecodable frames, no traceback, few warnings; the
    camera's record."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("drivepercept")]
    assert len(lines) == 1 and "undecodable frames skipped" in lines[0], err
    assert len(err.splitlines()) < 12, err  # throttled: not a line a frame
    record = json.loads((out / "run.json").read_text())
    return dict(record["summary"]["cameras"][camera])


def test_a_replayed_folder_refuses_the_huge_images_and_processes_the_rest(
    in_process: Cli, tmp_path: Path
) -> None:
    code, err = in_process(
        ["replay", str(_folder(tmp_path)), "--model", "drivepercept-tiny", "--out",
         str(tmp_path), "--name", "f", "--no-progress", "--no-report"]
    )  # fmt: skip
    assert code == 3, err
    cam = _undecodable_run(err, tmp_path / "f", "images")
    assert cam["frames"] == 3 and cam["frames_undecodable"] == 4


# --------------------------------------------------------------------------- recordings


def _drive(path: Path) -> Path:
    """A one-camera MCAP: huge CompressedImages (the first message one of them) among good."""
    pytest.importorskip("mcap")
    from drivepercept.recording import messages as msgs
    from drivepercept.recording.mcapfile import McapOut

    huge = list(huge_jpegs().values())
    png = bytearray(_encoded(".png"))
    png[16:24] = (30000).to_bytes(4, "big") * 2
    order = [huge[0], jpeg(), huge[1], jpeg(), huge[2], jpeg(), bytes(png), jpeg()]
    with McapOut(path, profile="ros2") as out:
        for k, data in enumerate(order):
            stamp = T0_NS + k * 50_000_000
            m = msgs.compressed_image(stamp, "front", "png" if data is png else "jpeg", data)
            out.ros2("/front/image_raw/compressed", msgs.COMPRESSED_IMAGE, m, log_time_ns=stamp)
    return path


def test_a_replayed_drive_refuses_the_huge_messages_and_processes_the_rest(
    in_process: Cli, tmp_path: Path
) -> None:
    drive = _drive(tmp_path / "drive.mcap")
    code, err = in_process(
        ["replay", str(drive), "--model", "drivepercept-tiny", "--out", str(tmp_path),
         "--name", "r", "--no-progress", "--no-report"]
    )  # fmt: skip
    assert code == 3, err
    cam = _undecodable_run(err, tmp_path / "r", "front")
    assert cam["frames"] == 4 and cam["frames_undecodable"] == 4


# --------------------------------------------------------------------------- live and memory


def _live_args(url: str, out: Path) -> list[str]:
    return [
        "live", "--model", "drivepercept-tiny", f"--camera=cam={url}", "--out", str(out),
        "--name", "live", "--no-progress", "--no-report", "--read-timeout-s", "1",
        "--open-timeout-s", "2", "--duration", "4",
    ]  # fmt: skip


def test_a_live_camera_sending_huge_frames_among_good_ones_goes_on(
    in_process: Cli, tmp_path: Path
) -> None:
    # given a camera that sends, in turn, 30000^2, 30000^2 with a junk byte, 60000^2, good
    with hostile_camera("huge_among_good") as camera:
        code, err = in_process(_live_args(camera.url, tmp_path))
        connections = camera.connections
    # then the huge ones were refused and counted, the good ones processed, on one connection
    assert code == 3, err
    cam = _undecodable_run(err, tmp_path / "live", "cam")
    assert cam["frames"] > 0 and cam["frames_undecodable"] >= 3 * (cam["frames"] - 1)
    assert connections == 1


@pytest.mark.slow
@pytest.mark.parametrize("source", ["folder", "drive", "live"])
def test_huge_frames_never_take_the_memory_decoding_them_would(source: str, tmp_path: Path) -> None:
    # given huge frames among good ones, from each kind of source, run in a child process
    out = tmp_path / "out"
    if source == "live":
        with hostile_camera("huge_among_good") as camera:
            code, err, peak = children.cli_peak(tmp_path, *_live_args(camera.url, out))
        name, camera_name = "live", "cam"
    else:
        given = _folder(tmp_path) if source == "folder" else _drive(tmp_path / "drive.mcap")
        args = ["replay", str(given), "--model", "drivepercept-tiny", "--out", str(out)]
        code, err, peak = children.cli_peak(tmp_path, *args, "--name", "r", "--no-progress")
        name, camera_name = "r", "images" if source == "folder" else "front"
    # then the run went on (exit 3, counted), and its peak stayed far below one decoded frame
    print(f"{source}: peak RSS {peak / 2**20:.0f} MiB, exit {code}")
    assert code == 3, err
    assert _undecodable_run(err, out / name, camera_name)["frames_undecodable"] >= 3
    assert peak < PEAK_LIMIT, peak
