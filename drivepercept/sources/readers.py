"""Frame readers: a video file or stream (OpenCV/FFmpeg) and a folder of images.

A reader is opened on the thread that uses it. `read()` returns the next frame (`RawFrame`:
BGR pixels, presentation time, and when it arrived: the frame's capture time), or None at
the end; `status()` says where the reader is (`ReaderStatus`), from any thread. OpenCV
releases the GIL while it decodes, so several readers on several threads decode in parallel.
Every reader type keeps its own state: nothing outside `sources/` asks which type it has.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np

from drivepercept.errors import DrivePerceptError, RepeatedWarning, one_line
from drivepercept.geometry import MAX_SIZE_PX
from drivepercept.rig import is_stream
from drivepercept.sources.imagesize import MAX_FRAME_BYTES, frame_refusal, size_refusal
from drivepercept.types import CameraState, ImageU8, ReaderStatus, StateChange

__all__ = ["ReaderStatus", "StateChange"]  # re-exported: the readers' vocabulary

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
DEFAULT_FOLDER_FPS = 10.0
MAX_SKIPPED = 64  # failed reads in a row a video is tried past before it counts as ended
AUTO_THREADS = 0  # OpenCV's default decoder threads for FFmpeg: one per core


def decode_threads(cameras: int, cores: int | None = None) -> int:
    """FFmpeg decoder threads for each of `cameras` videos decoded at once.

    OpenCV gives every decoder one thread per core, so six cameras on two cores ran twelve
    FFmpeg threads on top of the six camera threads and the model's; one each read the same
    six videos at 3-10 % less CPU a frame (docs/BENCHMARKS.md, "Decoder threads").

    Args:
        cameras: the videos decoded side by side.
        cores: the cores to share out (None: the ones this process may run on).

    Returns:
        The cores shared out, at least one each; `AUTO_THREADS` for a single camera.
    """
    if cameras <= 1:
        return AUTO_THREADS
    return max(1, (cores or _usable_cores()) // cameras)


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):  # a CPU set or container limit, where the OS says
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class SourceError(DrivePerceptError):
    """A camera source cannot be opened or read."""


class CorruptFrameError(SourceError):
    """One frame of a source cannot be decoded; the frames after it can (skipped, counted)."""


def _too_large(source: str | Path, width: int, height: int) -> str:
    # every frame would be decoded, kept and resized at this size: refused, as a rig file
    # declaring it would be (drivepercept.geometry.check_size)
    return (
        f"{source} is {width}x{height} pixels, larger than the {MAX_SIZE_PX}x{MAX_SIZE_PX} "
        "a camera frame may be"
    )


@dataclass(frozen=True)
class SourceInfo:
    """What a reader knows about its source once opened."""

    width: int
    height: int
    fps: float
    frame_count: int  # -1 when unknown (streams)


@dataclass(frozen=True, eq=False)
class RawFrame:
    """A frame as read: BGR pixels, presentation time, and its capture time on the monotonic
    clock (a file: when its read began; a live camera: when it arrived; a paced file: when it
    fell due).

    A reader of an intra-only stream (MJPEG) may hand over the frame still encoded (`jpeg`,
    `image` None): it is decoded on first use of `image_bgr`, on whichever thread wants it,
    so that a live frame that is dropped for a newer one is never decoded at all. A reader
    that refused a frame before decoding it (a live camera's part that is not a JPEG, or too
    large) hands it over as `refused`, with the reason and without its bytes, so that it is
    counted where every undecodable frame is. A reader that held `jpeg` to the frame limit
    already says so (`checked`): it is not read again when decoded (a 1 MiB junk scan each).
    """

    image: ImageU8 | None = field(repr=False)
    pts_s: float
    arrived_ns: int
    jpeg: bytes | None = field(default=None, repr=False)  # or PNG: any format imdecode reads
    stamp_ns: int | None = None  # the source's own stamp (a recorded message's), if any
    refused: str | None = None  # why the reader refused it (no pixels, no bytes)
    checked: bool = False  # `jpeg` passed `imagesize.frame_refusal` when it was read

    @property
    def decoded(self) -> bool:
        return self.image is not None

    @property
    def image_bgr(self) -> ImageU8:
        """The BGR pixels, decoded now if the frame came encoded. An encoded frame is held
        to the one frame limit first (`imagesize.frame_refusal`; once: not again when its
        reader did, `checked`): its size is read from its header, and a frame too large or
        whose header does not say is refused, not decoded.

        Raises:
            CorruptFrameError: the frame was refused, or does not decode.
        """
        if self.image is None:
            if self.refused is not None:
                raise CorruptFrameError(self.refused)
            image = decode_frame(self.jpeg or b"", checked=self.checked)
            object.__setattr__(self, "image", image)
        assert self.image is not None
        return self.image


def decode_frame(data: bytes, *, checked: bool = False) -> ImageU8:
    """An encoded frame (JPEG, PNG, ...) as BGR pixels, held to the frame limit before it is
    decoded (see `RawFrame.image_bgr`) unless `checked` says it was when it was read.

    Raises:
        CorruptFrameError: refused before decoding (why), or OpenCV did not decode it
            (OpenCV's own errors, e.g. its pixel limit, included).
    """
    why = None if checked else frame_refusal(data)
    if why is not None:
        raise CorruptFrameError(f"refused before decoding: {why}")
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:
        raise CorruptFrameError(f"OpenCV refused to decode it: {_cv2_why(exc)}") from None
    if image is None:
        raise CorruptFrameError(f"a corrupt compressed frame ({len(data)} bytes)")
    why = size_refusal(image.shape[1], image.shape[0])  # its header said less (a bug's guard)
    if why is not None:
        raise CorruptFrameError(f"decoded to {why}")
    return np.asarray(image, np.uint8)


def _cv2_why(exc: cv2.error) -> str:
    """OpenCV's error in one line: what failed, without its source file and line."""
    return one_line(str(getattr(exc, "err", "") or exc), limit=200)


class FrameReader(Protocol):
    """Reads frames from one source."""

    info: SourceInfo

    def read(self) -> RawFrame | None:
        """The next frame; None at the end."""

    def status(self) -> ReaderStatus:
        """Where the reader is now (any thread)."""

    def close(self) -> None: ...


class _FileState:
    """streaming until the end is read, then ended: a file's whole life."""

    def __init__(self) -> None:
        self.ended = False

    def status(self) -> ReaderStatus:
        return ReaderStatus(CameraState.ENDED if self.ended else CameraState.STREAMING)


class VideoReader:
    """A video file (or anything OpenCV's FFmpeg backend opens) read with cv2.VideoCapture,
    decoded on `threads` FFmpeg threads (`AUTO_THREADS`: OpenCV's default; see
    `decode_threads`)."""

    def __init__(
        self, path: str | Path, *, fps: float | None = None, threads: int = AUTO_THREADS
    ) -> None:
        self.path = str(path)
        if not is_stream(self.path):
            p = Path(self.path)
            if not p.exists():
                raise SourceError(f"video not found: {p}")
            if p.is_dir():
                raise SourceError(f"expected a video file, got a folder: {p}")
            if not p.is_file():  # opening a FIFO would wait for a writer, forever
                raise SourceError(f"expected a video file, got {p} (a pipe, socket or device)")
        params = [cv2.CAP_PROP_N_THREADS, threads] if threads > 0 else []
        self._cap = cv2.VideoCapture(self.path, cv2.CAP_FFMPEG, params)
        if not self._cap.isOpened():
            self._cap.release()
            raise SourceError(
                f"cannot open {self.path} as a video (not a video, or a codec OpenCV cannot decode)"
            )
        width = int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH))
        height = int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        native_fps = self._cap.get(cv2.CAP_PROP_FPS)
        count = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT))
        if width <= 0 or height <= 0:
            self._cap.release()
            raise SourceError(f"cannot read frame size of {self.path}: not a video?")
        if max(width, height) > MAX_SIZE_PX:  # said by the header: nothing decoded yet
            self._cap.release()
            raise SourceError(_too_large(self.path, width, height))
        self.info = SourceInfo(
            width,
            height,
            fps or (native_fps if native_fps > 0 else 30.0),
            count if count > 0 else -1,
        )
        self._index = 0
        self.undecodable = 0  # frames skipped because they did not decode
        self._state = _FileState()

    def read(self) -> RawFrame | None:
        """The next decodable frame. A damaged stretch (a packet the decoder cannot use)
        fails a read or a few in the middle of a file: they are tried past, up to
        `MAX_SKIPPED` in a row or the frames the container announces, and counted in
        `undecodable` once a later frame decodes (failures at the end are the end)."""
        started_ns = time.monotonic_ns()
        ok, raw = self._cap.read()
        failed = 0
        while not ok or raw is None:
            failed += 1
            left = self.info.frame_count - self._index - self.undecodable - failed
            if failed > MAX_SKIPPED or (self.info.frame_count > 0 and left <= 0):
                self._state.ended = True
                return None
            ok, raw = self._cap.read()
        if failed:
            self.undecodable += failed
            log.warning(
                "%s: %d undecodable frame(s) skipped before frame %d",
                self.path, failed, self._index + self.undecodable,
            )  # fmt: skip
        image: ImageU8 = np.asarray(raw, dtype=np.uint8)
        pos_ms = self._cap.get(cv2.CAP_PROP_POS_MSEC)
        pts = pos_ms / 1000.0 if pos_ms > 0 or self._index == 0 else self._index / self.info.fps
        self._index += 1
        return RawFrame(image, pts, started_ns)

    @property
    def threads(self) -> int:
        """The FFmpeg threads it decodes on, as OpenCV reports them."""
        return int(self._cap.get(cv2.CAP_PROP_N_THREADS))

    def status(self) -> ReaderStatus:
        return self._state.status()

    def close(self) -> None:
        self._cap.release()


def image_files(folder: Path) -> list[Path]:
    """The images of a folder in the order `ImageFolderReader` reads them (name order); frame
    k of the reader is entry k (eval matches labels to frames by this)."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


class ImageFolderReader:
    """Images in a folder, in name order, at a nominal frame rate.

    Each file is read once, held to the one frame limit before it is decoded (its size from
    its header: `imagesize.frame_refusal`; a file over `MAX_FRAME_BYTES` is refused by its
    size on disk, unread) and decoded from memory. A file refused, undecodable or unreadable
    is skipped and counted (`undecodable`), the first ones too: the first usable image gives
    the size, and is kept decoded for the first `read`.

    Raises:
        SourceError: not a folder, no images in it, or none of them usable (naming the
            first one and why).
    """

    def __init__(self, folder: str | Path, *, fps: float | None = None) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise SourceError(f"image folder not found: {self.folder}")
        self._files = image_files(self.folder)
        if not self._files:
            raise SourceError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {self.folder}")
        self._index = 0
        self.undecodable = 0  # images skipped: refused, undecodable or unreadable
        self._skipped = RepeatedWarning(log)
        self._opening = True  # skips are said once the open is decided
        self._first_why = ""
        first = self._next()
        if first is None:
            more = f" ({self.undecodable - 1} more skipped)" if self.undecodable > 1 else ""
            raise SourceError(f"no usable image in {self.folder}: {self._first_why}{more}")
        if self.undecodable:  # said now: a folder with none usable is one error line
            self._skipped.warn(
                "%d image(s) before %s skipped, the first: %s",
                self.undecodable, self._files[self._index - 1], self._first_why,
            )  # fmt: skip
        self._opening = False
        self._first: ImageU8 | None = first
        height, width = first.shape[:2]
        self.info = SourceInfo(width, height, fps or DEFAULT_FOLDER_FPS, len(self._files))
        self._state = _FileState()

    def _next(self) -> ImageU8 | None:
        """The next usable image, skipping (and counting) the others; None at the end."""
        while self._index < len(self._files):
            path = self._files[self._index]
            self._index += 1
            try:
                return decode_frame(_read_image_file(path))
            except (CorruptFrameError, OSError) as exc:
                why = f"{path}: {(exc.strerror if isinstance(exc, OSError) else '') or exc}"
                self.undecodable += 1
                if self._opening:
                    self._first_why = self._first_why or why
                else:
                    self._skipped.warn("image skipped: %s", why)
        return None

    def read(self) -> RawFrame | None:
        started_ns = time.monotonic_ns()
        image, self._first = self._first, None
        if image is None:
            image = self._next()
        if image is None:
            self._state.ended = True
            self._skipped.close()
            return None
        return RawFrame(image, (self._index - 1) / self.info.fps, started_ns)

    def status(self) -> ReaderStatus:
        return self._state.status()

    def close(self) -> None:
        self._files = []
        self._first = None
        self._skipped.close()


def _read_image_file(path: Path) -> bytes:
    """A file's bytes, refused by its size on disk when larger than any frame may be (and
    never more than that read, should it grow meanwhile).

    Raises:
        CorruptFrameError: the file is larger than `MAX_FRAME_BYTES`.
        OSError: it cannot be read.
    """
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(size + 1) if size <= MAX_FRAME_BYTES else b""
    if size > MAX_FRAME_BYTES or len(data) > MAX_FRAME_BYTES:
        raise CorruptFrameError(
            f"refused before reading: {max(size, len(data))} bytes, more than the "
            f"{MAX_FRAME_BYTES} a frame may be"
        )
    return data


def open_reader(
    source: str | Path, *, fps: float | None = None, threads: int = AUTO_THREADS
) -> FrameReader:
    """A reader for a video file/URL (on `threads` decoder threads) or an image folder."""
    if Path(source).is_dir():
        return ImageFolderReader(source, fps=fps)
    return VideoReader(source, fps=fps, threads=threads)
