"""Live sources: cameras and streams that may drop out, with a reconnect supervisor.

A `LiveSource` is a `FrameReader` whose `read()` never gives up on a stream at the first
failure: a failed open or read puts the camera into `reconnecting`, and it retries with
exponential backoff (`ReconnectPolicy`) on the decoder thread that reads it, so the rest of
the rig carries on. After `max_attempts` failures in a row the camera is `failed` and `read()`
returns None (the camera ends; the batcher stops waiting for it). A file source (replayed
in real time) ends as `ended`.

State changes (connecting, streaming, reconnecting, failed, ended) are logged with monotonic
times and kept, so the run record can say how long each camera was down.

Sources: a device index ("0") or path ("/dev/video0"), or a URL OpenCV's FFmpeg backend opens
(rtsp://, http://, https://, udp://, tcp://), or, for real-time replay, a video file paced at
its native frame rate.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from drivepercept.config import ReconnectPolicy
from drivepercept.errors import RepeatedWarning, redact
from drivepercept.rig import is_device, is_stream
from drivepercept.sources.capture import open_live_reader
from drivepercept.sources.pacing import CameraPace, PaceClock
from drivepercept.sources.readers import (
    FrameReader,
    RawFrame,
    ReaderStatus,
    SourceError,
    SourceInfo,
    StateChange,
)
from drivepercept.types import CameraState

log = logging.getLogger(__name__)

MAX_CHANGES = 1000  # state changes kept per camera (totals are kept apart, unbounded)
# a connection that breaks sooner than this after it opened counts as a flap: the next
# connection waits the backoff (a camera that sends one good frame, then junk, would
# otherwise be reconnected as fast as it answers)
STABLE_S = 5.0
_STOP_POLL_S = 0.05  # how often a connection attempt in progress looks at the stop event


class LiveSource:
    """A camera that reconnects (see the module docstring). Thread use: `read()` and `close()`
    on the camera's decoder thread; `state`, `changes()` and `downtime_s()` from any thread.

    Args:
        camera: the camera's name (for logs).
        source: device, URL or file (see the module docstring).
        policy: backoff and timeouts.
        stop: set to end the camera (it also interrupts a backoff wait).
        realtime: pace a file source at its native frame rate (for real-time replay).
        opener: makes one connection attempt (tests pass a stand-in; a recording's topic
            reader for a camera of a bag).
        clock: the rig's shared pace (real-time replay); by default the camera's own. The
            camera plays on its source's clock (`pace.key`), unless told otherwise.

    Raises:
        SourceError: a file source that cannot be opened, or a /dev path that does not exist
            (a live source connects on its thread, and a failure there is a state, not an
            exception).
    """

    def __init__(
        self,
        *,
        camera: str,
        source: str,
        policy: ReconnectPolicy,
        stop: threading.Event,
        realtime: bool = False,
        opener: Callable[[str, ReconnectPolicy], FrameReader] = open_live_reader,
        clock: PaceClock | None = None,
    ) -> None:
        self.camera = camera
        self.source = source
        self.policy = policy
        self.stop = stop
        self.realtime = realtime
        self.opener = opener
        self.live = is_stream(source) or is_device(source)
        self._lock = threading.Lock()
        self._changes: deque[StateChange] = deque(maxlen=MAX_CHANGES)
        self._reader: FrameReader | None = None
        self.pace = CameraPace(clock or PaceClock(), key=source, camera=camera)
        self._held: RawFrame | None = None  # a file's first frame, read early (`first_stamp_ns`)
        self.info = SourceInfo(0, 0, 0.0, -1)
        self.connects = 0
        self.failed_attempts = 0  # opens that failed, and connections that gave no frame
        self._failures = 0  # the same, since the last frame: drives backoff and giving up
        self._last_error = ""
        self._delivered = False  # a frame came on the current connection
        self._attached_ns = 0  # when the current connection opened
        self._flaps = 0  # connections in a row that broke within STABLE_S
        # running totals, so the kept change list can be bounded (MAX_CHANGES)
        self._totals = Totals()
        self._streamed = False
        self._reconnects = RepeatedWarning(log, first=5, every_s=30.0)
        self._undecodable = 0  # what the readers it closed skipped (a paced file's damage)
        if source.startswith("/dev/") and not Path(source).exists():
            # a device node that is not there is a typo or an unplugged camera: say so now
            raise SourceError(f"camera {camera}: no such camera device {source}")
        self._set(CameraState.CONNECTING, source)
        if not self.live:  # a file: a bad path is the user's error, now, on this thread
            self._attach(opener(source, policy))

    # ------------------------------------------------------------------ state

    def _set(self, state: CameraState, detail: str = "") -> None:
        # details name the source: its credentials never reach the log, run.json or /metrics
        change = StateChange(time.monotonic_ns(), state, redact(detail))
        with self._lock:
            last = self._changes[-1] if self._changes else None
            if last is not None:
                if last.state == state and state != CameraState.RECONNECTING:
                    return
                self._account(last, change.t_ns)
            if state == CameraState.STREAMING:
                self._streamed = True
            self._changes.append(change)
        detail = f" ({change.detail})" if change.detail else ""
        if state is CameraState.RECONNECTING:  # a camera that keeps failing: a few lines
            self._reconnects.warn("camera %s: %s%s", self.camera, state.value, detail)
            return
        if state in (CameraState.FAILED, CameraState.ENDED):
            self._reconnects.close()  # the reconnects not said, before the end is
        level = logging.WARNING if state is CameraState.FAILED else logging.INFO
        log.log(level, "camera %s: %s%s", self.camera, state.value, detail)

    def _account(self, last: StateChange, until_ns: int) -> None:
        """Add the time spent in `last` to the running totals (lock held)."""
        self._totals = self._totals.plus(last.state, until_ns - last.t_ns, streamed=self._streamed)

    @property
    def state(self) -> CameraState:
        with self._lock:
            return self._changes[-1].state

    def changes(self) -> list[StateChange]:
        """The kept state changes (the last MAX_CHANGES), oldest first."""
        with self._lock:
            return list(self._changes)

    def totals_s(self, now_ns: int | None = None) -> tuple[float, float, float]:
        """(down, outage, streaming) seconds until now: down is any time not streaming
        before `ended`; an outage is down time after the first frame stream."""
        now = now_ns if now_ns is not None else time.monotonic_ns()
        with self._lock:
            last = self._changes[-1]
            running = self._totals.plus(last.state, now - last.t_ns, streamed=self._streamed)
        return running.seconds

    def downtime_s(self, now_ns: int | None = None) -> float:
        """Time not streaming from the first change to now (or to `ended`)."""
        return self.totals_s(now_ns)[0]

    def status(self) -> ReaderStatus:
        down, outage, streaming = self.totals_s()
        return ReaderStatus(
            state=self.state,
            live=True,
            connects=self.connects,
            failed_attempts=self.failed_attempts,
            downtime_s=down,
            outage_s=outage,
            streaming_s=streaming,
            changes=tuple(self.changes()),
            last_error=redact(self._last_error),
        )

    # ------------------------------------------------------------------ reading

    def _attach(self, reader: FrameReader) -> None:
        self._reader = reader
        watch = getattr(reader, "watch", None)
        if watch is not None:  # its reads end within a slice of a stop (MjpegReader)
            watch(self.stop)
        self._attached_ns = time.monotonic_ns()
        self._delivered = False
        self.info = reader.info
        self.connects += 1
        self._set(CameraState.STREAMING, f"{reader.info.width}x{reader.info.height}")

    def _connect(self) -> bool:
        """Open, backing off after failures; False when the camera failed for good or stop
        was set. Failures count until a frame arrives, so a stream that accepts connections
        but delivers nothing backs off and gives up like one that refuses them."""
        while not self.stop.is_set():
            if self._failures:
                if self.policy.max_attempts and self._failures >= self.policy.max_attempts:
                    self._set(
                        CameraState.FAILED,
                        f"gave up after {self._failures} failed attempts: {self._last_error}",
                    )
                    return False
                if self.stop.wait(self.policy.delay_s(self._failures)):
                    return False
            try:
                reader = self._attempt()
            except SourceError as exc:
                self._fail(str(exc))
                continue
            if reader is None:  # stopped during the attempt
                return False
            self._attach(reader)
            return True
        return False

    def _attempt(self) -> FrameReader | None:
        """One connection attempt, made on a helper thread (`open-<camera>`) so that a stop
        abandons it at once instead of waiting out the open timeout (FFmpeg's open of a dead
        server blocks for up to `open_timeout_s`). An abandoned attempt that connects later
        closes its reader itself. Returns None when stopped meanwhile.

        Raises:
            SourceError: the attempt failed.
        """
        attempt = _Attempt(lambda: self.opener(self.source, self.policy))
        threading.Thread(target=attempt.run, name=f"open-{self.camera}", daemon=True).start()
        while not attempt.done.wait(_STOP_POLL_S):
            if self.stop.is_set() and attempt.abandon():
                log.info("camera %s: connection attempt abandoned (stopping)", self.camera)
                return None
        if isinstance(attempt.outcome, BaseException):
            raise attempt.outcome
        if self.stop.is_set():
            attempt.outcome.close()
            return None
        return attempt.outcome

    def _fail(self, reason: str) -> None:
        self._failures += 1
        self.failed_attempts += 1
        self._last_error = reason
        delay = self.policy.delay_s(self._failures)
        self._set(
            CameraState.RECONNECTING,
            f"attempt {self._failures} failed: {reason}; retry in {delay:g} s",
        )

    def first_stamp_ns(self) -> int | None:
        """The recorded stamp of a file source's first frame (None without one), read now
        and kept for `read`: the cameras of a recording are put on clocks by their first
        stamps before any thread starts (`drivepercept.sources.pacing.plan_clocks`)."""
        if self._held is None and self._reader is not None and not self.live:
            self._held = self._reader.read()
        return self._held.stamp_ns if self._held is not None else None

    def _pace(self, frame: RawFrame) -> int | None:
        """Wait until the frame falls due (real-time replay): its recorded stamp where it has
        one, else its pts; its due time on the monotonic clock (ns), or None if stopped
        meanwhile. The wait is bounded (`CameraPace`: at most the clock's max gap)."""
        now = time.monotonic_ns()
        frame_ns = frame.stamp_ns if frame.stamp_ns is not None else _pts_ns(frame.pts_s)
        due = self.pace.due_ns(frame_ns, now)
        if due > now and self.stop.wait(min((due - now) / 1e9, threading.TIMEOUT_MAX)):
            return None
        return due

    def read(self) -> RawFrame | None:
        while not self.stop.is_set():
            if self._reader is None:
                if not self.live or not self._connect():
                    return None
                continue
            got, self._held = self._held or self._reader.read(), None
            if got is not None:
                if self.realtime and not self.live:
                    due_ns = self._pace(got)
                    if due_ns is None:
                        return None
                    # a late frame keeps its due time: falling behind shows as latency
                    got = replace(got, arrived_ns=due_ns)
                self._delivered = True
                self._failures = 0
                return got
            why = str(getattr(self._reader, "last_error", "") or "")
            self._undecodable += int(getattr(self._reader, "undecodable", 0))
            self._reader.close()
            self._reader = None
            if not self.live:
                self._set(CameraState.ENDED, "end of file")
                return None
            if self._delivered:
                if not self._lost(why):
                    return None
            else:
                self._fail(
                    f"connected, but no frame arrived ({why})"
                    if why
                    else "connected, but no frame arrived"
                )
        return None

    def _lost(self, why: str) -> bool:
        """A stream that delivered frames broke: reconnecting, with the reason, after the
        backoff if it broke soon after it opened (a flap). False when stopped meanwhile."""
        lasted_s = (time.monotonic_ns() - self._attached_ns) / 1e9
        self._flaps = self._flaps + 1 if lasted_s < STABLE_S else 0
        detail = "the stream stopped delivering frames" + (f": {why}" if why else "")
        if not self._flaps:
            self._set(CameraState.RECONNECTING, detail)
            return True
        self._last_error = why or "the stream stopped delivering frames"
        delay = self.policy.delay_s(self._flaps)
        self._set(
            CameraState.RECONNECTING,
            f"{detail}, {lasted_s:.1f} s after it opened; retry in {delay:g} s",
        )
        return not self.stop.wait(delay)

    @property
    def undecodable(self) -> int:
        """Frames its readers skipped as undecodable, over every reader it has had: a paced
        recording's damaged chunks and messages, a paced video's or folder's bad frames
        (the decoder thread adds them to the camera's count, as for an unpaced file)."""
        return self._undecodable + int(getattr(self._reader, "undecodable", 0))

    def close(self) -> None:
        self._held = None
        self.pace.close()
        self._reconnects.close()
        if self._reader is not None:
            self._undecodable += int(getattr(self._reader, "undecodable", 0))
            self._reader.close()
            self._reader = None
        if self.state in (CameraState.STREAMING, CameraState.CONNECTING, CameraState.RECONNECTING):
            self._set(CameraState.ENDED, "stopped")


class _Attempt:
    """The outcome of one connection attempt running on its own thread, and whether the
    camera still wants it (see `LiveSource._attempt`)."""

    def __init__(self, connect: Callable[[], FrameReader]) -> None:
        self.connect = connect
        self.done = threading.Event()
        self.outcome: FrameReader | BaseException = SourceError("no attempt made")
        self._lock = threading.Lock()
        self._abandoned = False

    def run(self) -> None:
        try:
            outcome: FrameReader | BaseException = self.connect()
        except BaseException as exc:  # handed to the camera's thread, which raises it
            outcome = exc
        with self._lock:
            if self._abandoned:
                if not isinstance(outcome, BaseException):
                    outcome.close()  # nobody will read it: give the connection back
                return
            self.outcome = outcome
            self.done.set()

    def abandon(self) -> bool:
        """Give up waiting; False if the outcome is already in (then take it)."""
        with self._lock:
            if self.done.is_set():
                return False
            self._abandoned = True
            return True


@dataclass(frozen=True)
class Totals:
    """Where a camera's time went. Down is any time not streaming before `ended` (a camera
    that ended is not down); an outage is down time after it first streamed."""

    down_ns: int = 0
    outage_ns: int = 0
    streaming_ns: int = 0

    def plus(self, state: CameraState, spent_ns: int, *, streamed: bool) -> Totals:
        """These totals with `spent_ns` more in `state` (`streamed`: it has streamed before)."""
        spent = max(0, spent_ns)
        if state == CameraState.STREAMING:
            return replace(self, streaming_ns=self.streaming_ns + spent)
        if state == CameraState.ENDED:
            return self
        return replace(
            self,
            down_ns=self.down_ns + spent,
            outage_ns=self.outage_ns + (spent if streamed else 0),
        )

    @property
    def seconds(self) -> tuple[float, float, float]:
        """(down, outage, streaming) in seconds."""
        return self.down_ns / 1e9, self.outage_ns / 1e9, self.streaming_ns / 1e9


def _pts_ns(pts_s: float) -> int | None:
    """A pts in ns; None where a file's pts is not a finite number (the frame plays now)."""
    pts_ns = pts_s * 1e9
    return round(pts_ns) if math.isfinite(pts_ns) else None


def totals(changes: Sequence[StateChange], now_ns: int) -> Totals:
    """The totals of a list of state changes (oldest first) until `now_ns`. Pure; the same
    fold LiveSource keeps running so that its kept list may be cut short."""
    out, streamed = Totals(), False
    for k, change in enumerate(changes):
        streamed = streamed or change.state == CameraState.STREAMING
        end = changes[k + 1].t_ns if k + 1 < len(changes) else now_ns
        out = out.plus(change.state, end - change.t_ns, streamed=streamed)
    return out
