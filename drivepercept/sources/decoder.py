"""The per-camera decoder thread: read, stamp, prepare, queue.

One named thread (`decode-<camera>`) per camera. It reads a frame (whose capture time its
reader knows: when a file's read began, when a live frame arrived), stamps it with its index
and presentation time, letterboxes it for the model on the CPU while the device works on
earlier batches, and puts it into its camera's bounded queue under the queue's drop policy.
A read or preparation that raises fails this camera alone: it ends, and the others go on.

Live (`defer=True`, the drop_oldest policy) most frames are dropped for newer ones, so the
decoder thread only reads: it queues a `DeferredFrame`, which is decoded (if its reader
handed it over encoded, as `MjpegReader` does) and prepared straight into its staging row
only when the batcher takes it. `FrameCounts` says, per camera, how many frames were read,
decoded, prepared and (the pipeline's count) used.

A frame carries its original pixels on (`FrameMeta.original_bgr`, the decoded image itself,
not a copy) when an annotated output wants every frame's (`keep_original`: frames the model
skips are decoded for it too) or when the tracking stage reads the boxes' looks from the
frames the model sees (`keep_seen`: a deferred frame the model skips is not decoded for
it; a frame decoded already, as a replay's are, carries its pixels to the stage, which
hands it on without them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import cv2

from drivepercept.errors import RepeatedWarning, one_line, redact
from drivepercept.sources.imagesize import encoded_size, frame_refusal
from drivepercept.sources.prepare import plan_letterbox, prepare, prepare_into
from drivepercept.sources.readers import CorruptFrameError, FrameReader, RawFrame
from drivepercept.types import (
    CameraSnapshot,
    CameraState,
    Frame,
    FrameMeta,
    ImageU8,
    InputSpec,
    QueuedFrame,
    source_time_ns,
)

log = logging.getLogger(__name__)


def header_slack(announced: int) -> int:
    """How many frames a file may fall short of its container's count and still have ended
    normally. Container counts are estimates written by the muxer (AVI headers, MP4 edit
    lists), and real files overstate them by a few frames: a 750-frame header over 748
    frames is a whole file (FFmpeg's own count agrees). OpenCV does not tell a cut file's
    last partial packet from a clean end, so the judgement is the size of the shortfall:
    more than 2 frames and more than 1 % of the announced count is a truncated file."""
    return max(2, math.ceil(announced / 100))


class FrameCounts:
    """Frames read, decoded and prepared by one camera (thread-safe: the decoder thread
    counts reads, the batcher's prepare threads count deferred work)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.read = self.decoded = self.prepared = 0

    def add(self, *, read: int = 0, decoded: int = 0, prepared: int = 0) -> None:
        with self._lock:
            self.read += read
            self.decoded += decoded
            self.prepared += prepared

    def get(self) -> tuple[int, int, int]:
        """(read, decoded, prepared)."""
        with self._lock:
            return self.read, self.decoded, self.prepared


@dataclass(frozen=True, eq=False)
class DeferredFrame:
    """A frame read but not prepared (see the module docstring); `into` does the work."""

    raw: RawFrame = field(repr=False)
    spec: InputSpec = field(repr=False)
    camera: str
    camera_index: int
    frame_index: int
    capture_ns: int
    read_ns: int  # when the read returned (a reader that decodes: decoded by then)
    keep_original: bool
    counts: FrameCounts = field(repr=False)
    keep_seen: bool = False  # keep the original of a frame the model sees (tracking's looks)
    deferred = True

    @property
    def source_ns(self) -> int | None:
        """Its time on its source's clock (stamp, else pts; None without a finite one)."""
        return source_time_ns(self.raw.stamp_ns, self.raw.pts_s)

    def into(self, row: ImageU8) -> FrameMeta:
        """Decode (if still encoded) and prepare into `row`; the frame's meta. Its decode
        and preparation happen after it was queued, so its `decoded` and `preprocessed`
        stamps are its read time, and the work shows in its batch wait.

        Raises:
            SourceError: the frame does not decode (a corrupt JPEG).
        """
        decoded_before = self.raw.decoded
        image = self.raw.image_bgr
        box = prepare_into(image, self.spec, row)
        self.counts.add(decoded=0 if decoded_before else 1, prepared=1)
        return FrameMeta(
            camera=self.camera,
            camera_index=self.camera_index,
            frame_index=self.frame_index,
            pts_s=self.raw.pts_s,
            stamp_ns=self.raw.stamp_ns,
            capture_ns=self.capture_ns,
            decoded_ns=self.read_ns,
            preprocessed_ns=self.read_ns,
            letterbox=box,
            original_bgr=image if self.keep_original or self.keep_seen else None,
        )

    def meta_only(self) -> FrameMeta:
        """Its meta without preparing it (the model will not see it): its size read from
        the encoded frame's header (held to the frame limit as decoding would be), decoded
        only when its original pixels are kept (an annotated video) or the header does not
        say. A frame whose header is sound and whose body is not is answered, not counted
        undecodable: its body is never read.

        Raises:
            SourceError: the frame does not decode (when it has to be).
        """
        raw = self.raw
        if raw.refused is not None:
            raise CorruptFrameError(raw.refused)
        data = raw.jpeg or b""
        size = None if raw.decoded or self.keep_original else encoded_size(data)
        if size is not None and (why := None if raw.checked else frame_refusal(data)):
            raise CorruptFrameError(f"refused before decoding: {why}")  # as decoding would
        image = None
        if size is None:
            decoded_before = raw.decoded
            image = raw.image_bgr
            self.counts.add(decoded=0 if decoded_before else 1)
            size = (image.shape[1], image.shape[0])
        return FrameMeta(
            camera=self.camera,
            camera_index=self.camera_index,
            frame_index=self.frame_index,
            pts_s=raw.pts_s,
            stamp_ns=raw.stamp_ns,
            capture_ns=self.capture_ns,
            decoded_ns=self.read_ns,
            preprocessed_ns=self.read_ns,
            letterbox=plan_letterbox(size, self.spec),
            original_bgr=image if self.keep_original else None,
        )


class FrameQueues(Protocol):
    """Where decoded frames go: the pipeline's per-camera queues (`queues.CameraQueues`),
    which apply the drop policy; sources do not know them otherwise."""

    def put(self, camera: int, frame: QueuedFrame, *, stop: threading.Event) -> bool: ...

    def end(self, camera: int) -> None: ...


class DecoderThread:
    """Owns one camera's reader and thread. The reader is opened by the caller, so that a bad
    file fails on the main thread with a clear error before any thread starts."""

    def __init__(
        self,
        *,
        camera: str,
        camera_index: int,
        reader: FrameReader,
        spec: InputSpec,
        queues: FrameQueues,
        stop: threading.Event,
        max_frames: int = 0,
        keep_original: bool = False,
        on_error: Callable[[BaseException], None] | None = None,
        defer: bool = False,
        keep_seen: bool = False,
    ) -> None:
        self.camera = camera
        self.camera_index = camera_index
        self.reader = reader
        self.spec = spec
        self.queues = queues
        self.stop = stop
        self.max_frames = max_frames
        self.keep_original = keep_original
        self.keep_seen = keep_seen
        self.on_error = on_error
        self.defer = defer
        self.counts = FrameCounts()
        self.frames_read = 0
        self.short_by = 0  # frames announced by the container but not decodable
        self.undecodable = 0  # frames skipped in the middle because they did not decode
        self.corrupt = 0  # of them, frames read whole that did not decode (a corrupt JPEG)
        self._skipped = RepeatedWarning(log)  # a camera of bad frames: a few lines, not one each
        self.error: BaseException | None = None  # what ended it, if it failed
        self.thread = threading.Thread(target=self._run, name=f"decode-{camera}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    @property
    def expected_frames(self) -> int:
        """Frames this camera will give if its source holds what its container says (-1
        when the source's length is unknown, e.g. a stream)."""
        count = self.reader.info.frame_count
        if self.max_frames:
            count = min(count, self.max_frames) if count > 0 else self.max_frames
        return count if count >= 0 else -1

    def snapshot(
        self, *, frames: int, fps: float, p95_ms: float, dropped: int, left_out: int
    ) -> CameraSnapshot:
        """This camera now, given what the pipeline counted of it: frames answered, recent
        rate and p95, frames dropped for newer ones and frames left out of their batch
        (undecodable there)."""
        reader = self.reader.status()
        state = reader.state
        if state is CameraState.STREAMING and self.thread.ident and not self.thread.is_alive():
            state = CameraState.ENDED  # stopped reading (max_frames, a stop)
        if isinstance(self.error, Exception):  # its reader or preparation raised
            state = CameraState.FAILED
            why = redact(one_line(f"{type(self.error).__name__}: {self.error}"))
            reader = dataclasses.replace(reader, state=state, last_error=why)
        return CameraSnapshot(
            name=self.camera,
            state=state,
            frames=frames,
            dropped=dropped,
            fps=fps,
            p95_ms=p95_ms,
            read=self.frames_read,
            short_by=self.short_by,
            undecodable=self.undecodable + left_out,
            discarded=max(0, self.frames_read - frames - dropped - left_out),
            reader=reader,
            decoded=self.counts.decoded,
            prepared=self.counts.prepared,
        )

    def _prepared(self, got: RawFrame) -> Frame:
        image_bgr = got.image_bgr  # decoded now if the reader handed it over encoded
        decoded_ns = time.monotonic_ns()
        image, box = prepare(image_bgr, self.spec)
        self.counts.add(read=1, decoded=1, prepared=1)
        meta = FrameMeta(
            camera=self.camera,
            camera_index=self.camera_index,
            frame_index=self.frames_read,
            pts_s=got.pts_s,
            stamp_ns=got.stamp_ns,
            capture_ns=min(got.arrived_ns, decoded_ns),
            decoded_ns=decoded_ns,
            preprocessed_ns=time.monotonic_ns(),
            letterbox=box,
            original_bgr=image_bgr if self.keep_original or self.keep_seen else None,
        )
        return Frame(meta, image)

    def _deferred(self, got: RawFrame) -> DeferredFrame:
        if got.refused is not None:  # known bad already: counted here, not queued
            raise CorruptFrameError(got.refused)
        read_ns = time.monotonic_ns()
        self.counts.add(read=1, decoded=1 if got.decoded else 0)
        return DeferredFrame(
            raw=got,
            spec=self.spec,
            camera=self.camera,
            camera_index=self.camera_index,
            frame_index=self.frames_read,
            capture_ns=min(got.arrived_ns, read_ns),
            read_ns=read_ns,
            keep_original=self.keep_original,
            counts=self.counts,
            keep_seen=self.keep_seen,
        )

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.max_frames and self.frames_read >= self.max_frames:
                    break
                got = self.reader.read()
                self.undecodable = int(getattr(self.reader, "undecodable", 0)) + self.corrupt
                if got is None:
                    expected = self.reader.info.frame_count
                    # a source stopped on purpose (duration, Ctrl-C) is not short
                    stopped = self.stop.is_set() or self.max_frames
                    missing = expected - self.frames_read - self.undecodable
                    if expected > 0 and missing > header_slack(expected) and not stopped:
                        self.short_by = missing
                        log.info(
                            "camera %s ended after %d of %d frames (truncated file?)",
                            self.camera,
                            self.frames_read,
                            expected,
                        )
                    break
                try:
                    frame = self._deferred(got) if self.defer else self._prepared(got)
                except (CorruptFrameError, cv2.error) as exc:  # this frame alone: skipped, counted
                    self.corrupt += 1
                    self.undecodable += 1
                    self._skipped.warn(
                        "camera %s: frame skipped: %s", self.camera, one_line(str(exc))
                    )
                    continue
                if not self.queues.put(self.camera_index, frame, stop=self.stop):
                    break
                self.frames_read += 1
        except Exception as exc:
            # this camera failed, not the rig: it ends (the batcher stops waiting for it), the
            # others go on, and the run names it as failed with this reason
            self.error = exc
            log.error(
                "camera %s failed after %d frames: %s",
                self.camera,
                self.frames_read,
                redact(one_line(f"{type(exc).__name__}: {exc}")),
            )
        except BaseException as exc:  # recorded; the pipeline re-raises it on the main thread
            self.error = exc
            if self.on_error is not None:
                self.on_error(exc)
        finally:
            self.reader.close()
            self._skipped.close()
            self.queues.end(self.camera_index)
