"""Recorded drives as robots record them: MCAP files, ROS 2 bag folders (MCAP or SQLite
storage) and ROS 1 `.bag` files. Each image topic is a camera.

* `is_recording(path)`: a `.mcap`, a `.bag`, or a folder with a rosbag2 `metadata.yaml`.
* `recording_cameras(path, topics=...)`: its cameras, one per image topic (or the `topics`
  asked for, in that order), named after the topic, with the intrinsics of the `CameraInfo`
  beside it where there is one.
* `RecordingReader(path, topic)`: one camera's frames in the order of their stamps, each
  stamped with its header stamp (else its log time), which is also its pts.

The containers are read by `drivepercept.sources.containers` under the size limits of
`drivepercept.sources.untrusted`; every camera reads the file on its own decoder thread (its
index and metadata parsed once for all of them). A message that does not decode is skipped
and counted (`undecodable`); so is a chunk that cannot be read (a bomb, a lying index, damage:
`chunks_skipped`, its frames of the topic in `undecodable`), and the frames after it are read.
A file cut short (no MCAP footer) gives the frames before the cut, then fails its cameras
(`SourceError`, exit 3).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from drivepercept.errors import ConfigError, RepeatedWarning
from drivepercept.geometry import Intrinsics
from drivepercept.rig import SIMULATED_MODEL, SIMULATOR, CameraConfig, safe_name
from drivepercept.sources import rosimage
from drivepercept.sources.containers import Container, Message, open_container
from drivepercept.sources.mcapread import CutShortError
from drivepercept.sources.readers import (
    RawFrame,
    SourceError,
    SourceInfo,
    _FileState,
)
from drivepercept.types import ReaderStatus

log = logging.getLogger(__name__)

REORDER_WINDOW = 8  # messages held back so that a few out of stamp order are put right
# ... holding at most one frame past this many bytes: a window of 8 frames at the frame limit
# would hold 2 GiB (frames that large are put in order one or two at a time)
REORDER_BYTES = 64 << 20
FIRST_TRIED = 32  # messages tried at open for a first frame that decodes (it gives the size)
# the trailing parts of an image topic that say how it is encoded, not which camera it is
_IMAGE_SUFFIXES = frozenset(
    {"compressed", "image_raw", "image_rect", "image_rect_color", "image_color", "image", "raw"}
)


def is_recording(path: str | Path) -> bool:
    """Named as an MCAP file or a ROS 1 bag, or a folder with a `metadata.yaml` (a ROS 2
    bag): what is read as a recording, and refused as one when it is not (a FIFO, a folder
    named `x.mcap`, a metadata.yaml that is not a regular file)."""
    p = Path(path)
    if p.suffix.lower() in (".mcap", ".bag"):
        return True
    return p.is_dir() and (p / "metadata.yaml").exists()


# ------------------------------------------------------------------ cameras


def camera_name(topic: str) -> str:
    """A camera's name from its image topic: `/cam_front/image_raw/compressed` -> `cam_front`
    (the trailing parts that name an encoding dropped, the rest joined by `_`)."""
    parts = [p for p in topic.split("/") if p]
    while len(parts) > 1 and parts[-1].lower() in _IMAGE_SUFFIXES:
        parts.pop()
    return safe_name("_".join(parts) or topic)


def _info_topic(image_topic: str, infos: Sequence[str]) -> str | None:
    """The calibration topic in the image topic's namespace (the nearest one up)."""
    parts = [p for p in image_topic.split("/") if p]
    while parts:
        parts.pop()
        ns = "/" + "/".join(parts) if parts else ""
        for name in (f"{ns}/camera_info", f"{ns}/calibration"):
            if name in infos:
                return name
    return None


def _first_infos(rec: Container, path: Path, topics: Sequence[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for topic in topics:
        try:
            for _, _, decode in rec.messages(topic, lambda why, lost: None):
                found[topic] = decode()
                break
        except Exception as exc:  # a damaged calibration: the camera goes without
            log.warning("%s: cannot read %s: %s", path, topic, exc)
    return found


def unique_names(names: Sequence[str]) -> list[str]:
    """`names` with a repeated one numbered (`a_b`, `a_b_2`), each at most 64 characters."""
    taken: set[str] = set()
    out = []
    for base in names:
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base[: 63 - len(str(n))]}_{n}"
        taken.add(name)
        out.append(name)
    return out


def recording_cameras(path: str | Path, *, topics: Sequence[str] = ()) -> list[CameraConfig]:
    """The cameras of a recording: its image topics (or `topics`, picked and ordered), named
    after their topics (two topics that clean to one name: their whole names, else numbered).

    Raises:
        ConfigError: the recording has no image topic, or a topic asked for is not an image
            topic of it (the message lists the ones it has).
        SourceError: the file is not a recording or cannot be read.
    """
    p = Path(path)
    rec = open_container(p)  # once for its topics and calibrations
    try:
        every = rec.topics()
        images = [t for t in every if t.msgtype in rosimage.IMAGE_TYPES]
        by_name = {t.name: t for t in images}
        if not images:
            listed = ", ".join(f"{t.name} ({t.msgtype})" for t in every) or "none"
            raise ConfigError(f"{p} has no image topic; its topics: {listed}")
        if topics:
            missing = [t for t in topics if t not in by_name]
            if missing:
                raise ConfigError(
                    f"{p} has no image topic {', '.join(missing)}; its image topics: "
                    + ", ".join(by_name)
                )
            images = [by_name[t] for t in topics]
        info_topics = [t.name for t in every if t.msgtype in rosimage.CAMERA_INFO_TYPES]
        pairs = {t.name: _info_topic(t.name, info_topics) for t in images}
        infos = _first_infos(rec, p, sorted({v for v in pairs.values() if v}))
    finally:
        rec.close()
    names = [camera_name(t.name) for t in images]
    if len(set(names)) < len(names):  # two topics name one camera: their whole names
        whole = [safe_name(t.name) for t in images]
        names = whole if len(set(whole)) == len(whole) else unique_names(names)
    cams = []
    for name, topic in zip(names, images, strict=True):
        info = infos.get(pairs[topic.name] or "")
        k = rosimage.intrinsics_of(info) if info is not None else None
        cams.append(
            CameraConfig(
                name=name,
                video=p,
                topic=topic.name,
                intrinsics=Intrinsics(fx=k[2], fy=k[3], cx=k[4], cy=k[5]) if k else None,
                width=k[0] if k and k[0] > 0 and k[1] > 0 else None,
                height=k[1] if k and k[0] > 0 and k[1] > 0 else None,
            )
        )
    return cams


# ------------------------------------------------------------------ the reader


class _DamagedError(SourceError):
    """The container could not be read on (a cut or damaged record)."""


class RecordingReader:
    """One image topic of a recording, read frame by frame (a `FrameReader`).

    Frames come in stamp order (a window of `REORDER_WINDOW` messages puts a few out of
    order right), each stamped with its header stamp, else its log time. A message that does
    not decode (a damaged CDR, a raw image of the wrong size) is skipped and counted in
    `undecodable`; a compressed image is decoded on first use, so a corrupt JPEG is counted
    by the decoder thread. A chunk of the container that cannot be read (over the size
    limits, lying about its size, damaged) is skipped and counted in `chunks_skipped`, its
    frames of this topic (as its index says, else one) in `undecodable`, and the frames after
    it are read. The first frame that decodes gives the size at open (those before it are
    skipped and counted); a raw topic in an unsupported encoding fails here, before any
    thread starts.

    Raises:
        SourceError: the recording or topic cannot be read, none of its first `FIRST_TRIED`
            images decodes, or its first image is in an unsupported encoding.
    """

    def __init__(self, path: str | Path, topic: str) -> None:
        self.path = Path(path)
        self.topic = topic
        self._rec = open_container(self.path)
        self.undecodable = 0
        self.chunks_skipped = 0  # chunks of the container that held (or may hold) the topic
        self._state = _FileState()
        self._pending: list[tuple[int, int, RawFrame]] = []
        self._pending_bytes = 0
        self._order = itertools.count()
        self._exhausted = False
        self._error: SourceError | None = None
        self.frames_seen = 0  # frames given by `read`
        self._skipped_log = RepeatedWarning(log)
        self._last_skip = ""
        self._damage_log = RepeatedWarning(log)
        self._messages: Iterator[Message] = iter(())
        try:
            count = self._count()
            self._messages = self._rec.messages(topic, self._damaged)
            width, height = self._first_size()
        except OSError as exc:  # (EIO while a file without a summary is walked)
            self.close()
            raise SourceError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise
        self.info = SourceInfo(width, height, self._rate(), count)

    def _count(self) -> int:
        """The topic's message count (-1: unknown), once it is known to be an image topic."""
        topics = self._rec.topics()
        found = next((t for t in topics if t.name == self.topic), None)
        if found is None or found.msgtype not in rosimage.IMAGE_TYPES:
            images = ", ".join(t.name for t in topics if t.msgtype in rosimage.IMAGE_TYPES)
            what = (
                f"{self.path} has no topic {self.topic}"
                if found is None
                else f"{self.path}: topic {self.topic} is {found.msgtype or 'untyped'}, not "
                "an image topic"
            )
            raise SourceError(f"{what} (its image topics: {images or 'none'})")
        return found.count

    def _first_size(self) -> tuple[int, int]:
        """(width, height) of the first frame that decodes; the ones before it (refused or
        undecodable) are skipped and counted."""
        for _ in range(FIRST_TRIED):
            self._fill()
            if not self._pending:
                break
            try:
                height, width = self._pending[0][2].image_bgr.shape[:2]
                return width, height
            except Exception as exc:  # this frame refused or undecodable: the next one
                self._pop()
                self._skip(f"{type(exc).__name__}: {exc}")
        if not self.undecodable:
            raise SourceError(f"{self.path}: topic {self.topic} holds no readable image")
        raise SourceError(
            f"{self.path}: topic {self.topic}: none of the {self.undecodable} images read "
            f"can be used (the last: {self._last_skip})"
        )

    def _rate(self) -> float:
        """Frames per second from the first stamps (else the recording's span; else 10)."""
        stamps = sorted(s for s, _, _ in self._pending)
        if len(stamps) > 1 and stamps[-1] > stamps[0]:
            fps = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1e9)
        else:
            fps = 10.0
        return min(max(fps, 0.1), 1000.0)

    def _next_message(self) -> RawFrame | None:
        """The next image of the topic; None at its end. Skips (and counts) bad messages.

        Raises:
            SourceError: the file ends in the middle of a record (cut short), or is damaged
                past reading on.
        """
        while True:
            started = time.monotonic_ns()
            try:
                log_time, typename, decode = next(self._messages)
            except StopIteration:
                return None
            except CutShortError as exc:
                raise _DamagedError(str(exc)) from None
            except SourceError:
                raise
            except Exception as exc:  # the container itself is damaged: nothing after it reads
                raise _DamagedError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
            frame = self._frame(decode, typename, log_time, started)
            if frame is not None:
                return frame
            del decode  # a skipped message is not held while the next is read (256 MiB...)

    def _frame(
        self, decode: Callable[[], Any], typename: str, log_time: int, started: int
    ) -> RawFrame | None:
        """The message decoded into a frame; None when it is skipped (counted)."""
        try:
            msg = decode()
            return rosimage.to_frame(msg, typename, log_time_ns=log_time, arrived_ns=started)
        except rosimage.UnsupportedEncodingError:
            if not self._pending and not self.frames_seen:
                raise
            self._skip("an unsupported encoding")
        except Exception as exc:  # a damaged message (CorruptFrameError, bad CDR): this frame
            self._skip(f"{type(exc).__name__}: {exc}")
        return None

    def _said(self, exc: SourceError) -> SourceError:
        """The error to raise for `exc`: a damaged container says how far the topic read."""
        if not isinstance(exc, _DamagedError):
            return exc
        return SourceError(
            f"{self.path}: the recording is cut short or damaged after {self.frames_seen} "
            f"frames of {self.topic} ({exc})"
        )

    def _skip(self, why: str) -> None:
        self.undecodable += 1
        self._last_skip = why[:200]
        self._skipped_log.warn("%s %s: a message skipped: %s", self.path, self.topic, why[:200])

    def _damaged(self, why: str, lost: int | None) -> None:
        """A chunk that cannot be read, skipped: its frames of the topic (`lost`, as its index
        says; at least one, and one when nothing says) are counted undecodable."""
        self.chunks_skipped += 1
        self.undecodable += lost or 1
        self._last_skip = why[:200]
        said = f"{lost} frames of it" if lost else "its frames unknown, counted as one"
        self._damage_log.warn("%s %s: a %s (%s)", self.path, self.topic, why[:300], said)

    def _fill(self) -> None:
        """Read ahead to `REORDER_WINDOW` messages. A damaged or cut container found while
        frames are held back is raised once they have been given (`read`)."""
        while (
            not self._exhausted
            and len(self._pending) < REORDER_WINDOW
            and self._pending_bytes < REORDER_BYTES
        ):
            try:
                got = self._next_message()
            except SourceError as exc:
                if not self._pending:
                    raise self._said(exc) from None
                self._error, self._exhausted = exc, True
                break
            if got is None:
                self._exhausted = True
                break
            assert got.stamp_ns is not None
            heapq.heappush(self._pending, (got.stamp_ns, next(self._order), got))
            self._pending_bytes += _size(got)

    def read(self) -> RawFrame | None:
        self._fill()
        if not self._pending:
            if self._error is not None:
                raise self._said(self._error)
            self._state.ended = True
            return None
        frame = self._pop()
        self.frames_seen += 1
        return frame

    def _pop(self) -> RawFrame:
        _, _, frame = heapq.heappop(self._pending)
        self._pending_bytes -= _size(frame)
        return frame

    def status(self) -> ReaderStatus:
        return self._state.status()

    def close(self) -> None:
        """Frees what the reader holds: its frames, and the room its chunk's messages hold
        in the process (its generator closed: called on the thread that reads it)."""
        self._pending, self._pending_bytes = [], 0
        close = getattr(self._messages, "close", None)
        if close is not None:
            # (running on another thread: its room is given back once it is collected)
            with contextlib.suppress(ValueError):
                close()
        self._skipped_log.close()
        self._damage_log.close()
        self._rec.close()


def _size(frame: RawFrame) -> int:
    """The bytes a frame came with (encoded, else its pixels): the same before and after
    it is decoded."""
    if frame.jpeg is not None:
        return len(frame.jpeg)
    return frame.image.nbytes if frame.image is not None else 0


def read_attachment(path: str | Path, name: str) -> bytes | None:
    """The attachment called `name` of an MCAP file (None when it has none)."""
    rec = open_container(Path(path))
    try:
        return rec.attachment(name)
    except Exception as exc:  # a damaged attachment record
        raise SourceError(f"{path}: cannot read its attachment {name}: {exc}") from None
    finally:
        rec.close()


def simulated_model(sources: Sequence[str]) -> str | None:
    """The model trained on the synthetic world when every source is a drive `drivepercept
    simulate --format mcap` wrote (its `simulation` metadata says so), as a simulated rig's
    rig.toml names it; None otherwise (the caller picks the default)."""
    if not sources or not all(Path(s).suffix.lower() == ".mcap" for s in sources):
        return None
    for source in sources:
        try:
            rec = open_container(Path(source))
        except Exception:  # unreadable: the run says so when it opens it
            return None
        try:
            info = rec.metadata("simulation") or {}
        except Exception:
            info = {}
        finally:
            rec.close()
        if info.get("generator") != SIMULATOR:
            return None
    return SIMULATED_MODEL
