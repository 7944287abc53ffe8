"""SinkSet: hands each batch's results to every sink, each under its own policy.

Two questions decide how a sink is run (`SinkPolicy`):

* **Is it slow?** A fast sink (a line into detections.jsonl or frames.csv, a metrics counter)
  is called on the completion thread, in frame order. A slow one (video encoding, a window)
  gets a bounded queue of batches and a named thread `sink-<name>`, so it never holds up the
  batches behind it. When its queue is full it either drops the oldest waiting batch
  (`DropPolicy.DROP_OLDEST`: live use, every dropped frame counted) or makes the completion
  thread wait (`DropPolicy.BLOCK`: replay, where every frame must reach the file).
* **What if it fails?** `OnFailure.ISOLATE`: the sink is set aside, the run goes on, and the
  failure is in the report (`report()`). `OnFailure.STOP`: the failure stops the run cleanly,
  as any stage's failure does (the pipeline's error handler), with every other output closed
  and valid.

The set owns the lock and the closed flag: a batch dispatched after `close()` began, or after
an essential output failed, is not written and not counted (`dispatch` says so), so the
counts match the run's own files. `close()` lets slow sinks write their backlog within
`CLOSE_TIMEOUT_S`, and never waits past it: a sink still writing then is named, not closed.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from drivepercept.errors import one_line
from drivepercept.sinks.base import ImageSink, Sink
from drivepercept.types import DropPolicy, FrameResult

log = logging.getLogger(__name__)

_POLL_S = 0.1
CLOSE_TIMEOUT_S = 30.0  # how long a slow sink may take to write its backlog at the end


class OnFailure(enum.Enum):
    ISOLATE = "isolate"
    STOP = "stop"


@dataclass(frozen=True)
class SinkPolicy:
    """How a sink is run (see the module docstring)."""

    slow: bool = False
    queue_batches: int = 4  # a slow sink's queue, in batches (each holds original frames)
    when_full: DropPolicy = DropPolicy.DROP_OLDEST
    on_failure: OnFailure = OnFailure.ISOLATE

    def __post_init__(self) -> None:
        if self.queue_batches < 1:
            raise ValueError(f"a slow sink's queue holds >= 1 batch, got {self.queue_batches}")


@dataclass(frozen=True)
class SinkReport:
    """What happened to one sink: for run.json and the report."""

    name: str
    slow: bool
    on_failure: str
    frames_written: int
    frames_dropped: int  # slow sinks: frames in batches dropped from a full queue
    queue_high_water: int  # slow sinks: most batches waiting
    failed: str | None  # the failure, one line, or None

    def as_dict(self) -> dict[str, Any]:
        """run.json's entry for this sink (its name is the key)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "name"}


class _Entry:
    def __init__(self, name: str, sink: Sink, policy: SinkPolicy) -> None:
        self.name = name
        self.sink = sink
        self.policy = policy
        self.written = 0
        self.dropped = 0
        self.high_water = 0
        self.failed: str | None = None
        self.queue: queue.Queue[list[FrameResult] | None] | None = None
        self.thread: threading.Thread | None = None


class SinkSet:
    """The sinks of a run. `dispatch` on the completion thread; `close` from any thread.

    Args:
        on_stop: called with the exception of a sink whose policy is STOP (the pipeline's
            error handler, which stops the run).
    """

    def __init__(self, *, on_stop: Callable[[BaseException], None] | None = None) -> None:
        self.on_stop = on_stop
        self._entries: list[_Entry] = []
        self._cond = threading.Condition()
        self._closed = False  # no new batch is taken
        self._stopping = False  # an essential output failed: later batches are not written
        self._active = 0  # dispatches under way (close waits for them)
        self._started = False
        self._stop = threading.Event()  # the run's stop: a blocked hand-over gives up
        self.not_stopped: tuple[str, ...] = ()  # slow sinks whose thread outlived close

    def add(self, sink: Sink, policy: SinkPolicy | None = None, *, name: str | None = None) -> None:
        """Add a sink (before `start`)."""
        if self._started:
            raise RuntimeError("sinks are added before the set starts")
        base = name or type(sink).__name__
        taken = {e.name for e in self._entries}
        unique, k = base, 1
        while unique in taken:
            k += 1
            unique = f"{base}-{k}"
        self._entries.append(_Entry(unique, sink, policy or SinkPolicy()))

    @classmethod
    def of(cls, sinks: Sequence[Sink], policy: SinkPolicy | None = None) -> SinkSet:
        out = cls()
        for sink in sinks:
            out.add(sink, policy)
        return out

    @property
    def sinks(self) -> tuple[Sink, ...]:
        return tuple(e.sink for e in self._entries)

    def start(self, *, stop: threading.Event | None = None) -> None:
        """Start the slow sinks' threads (idempotent). `stop` (the run's) ends any wait of a
        blocked hand-over to a full slow sink."""
        if self._started:
            return
        self._started = True
        if stop is not None:
            self._stop = stop
        for e in self._entries:
            if e.policy.slow:
                e.queue = queue.Queue(maxsize=e.policy.queue_batches)
                e.thread = threading.Thread(
                    target=self._drain, args=(e,), name=f"sink-{e.name}", daemon=True
                )
                e.thread.start()

    # ------------------------------------------------------------------ writing

    def _write(self, e: _Entry, results: Sequence[FrameResult]) -> bool:
        """Write to one sink; False when it failed (now or before)."""
        if e.failed is not None:
            return False
        try:
            for r in results:
                if r.original_bgr is not None and isinstance(e.sink, ImageSink):
                    e.sink.write_with_image(r, r.original_bgr)
                else:
                    e.sink.write(r)
                e.written += 1
        except Exception as exc:
            self._failed(e, exc)
            return False
        return True

    def _failed(self, e: _Entry, exc: BaseException) -> None:
        e.failed = one_line(f"{type(exc).__name__}: {exc}")
        if e.policy.on_failure is OnFailure.STOP:
            log.error("output %s failed, stopping the run: %s", e.name, e.failed)
            self._stopping = True
            if self.on_stop is not None:
                self.on_stop(exc)
        else:
            log.error("output %s failed and is set aside; the run goes on: %s", e.name, e.failed)

    def dispatch(self, results: list[FrameResult]) -> bool:
        """Hand one batch's results to every sink. False (and not counted by the caller) once
        closing, or once an essential output failed: the counts then match its file."""
        with self._cond:
            if self._closed or self._stopping:
                return False
            self._active += 1
        try:
            for e in self._entries:
                if e.queue is None:
                    if not self._write(e, results) and e.policy.on_failure is OnFailure.STOP:
                        return False
                elif e.failed is None:
                    self._enqueue(e, results)
            return not self._stopping
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _enqueue(self, e: _Entry, results: list[FrameResult]) -> None:
        assert e.queue is not None and e.thread is not None
        while True:
            try:
                e.queue.put_nowait(results)
                break
            except queue.Full:
                pass
            if e.policy.when_full is DropPolicy.BLOCK:
                # replay: wait for the sink, so no frame is lost; but not past a stop, a
                # close or the sink's end (the batch then counts as dropped)
                if self._closed or self._stop.is_set() or not e.thread.is_alive():
                    e.dropped += len(results)
                    return
                try:
                    e.queue.put(results, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            try:
                oldest = e.queue.get_nowait()
            except queue.Empty:
                continue
            e.dropped += len(oldest) if oldest is not None else 0
        e.high_water = max(e.high_water, e.queue.qsize())

    def _drain(self, e: _Entry) -> None:
        assert e.queue is not None
        try:
            while True:
                results = e.queue.get()
                if results is None:
                    return
                if not self._write(e, results):
                    e.dropped += len(results)  # a failed sink takes nothing more
        except BaseException as exc:  # the thread must not die silently
            self._failed(e, exc)

    # ------------------------------------------------------------------ closing

    def close(self) -> list[BaseException]:
        """Stop taking results, let slow sinks write what is queued (within
        CLOSE_TIMEOUT_S), close every sink whose thread has finished.

        Returns the errors of essential sinks (`OnFailure.STOP`) that failed to close (each
        logged); never raises. Another sink that fails to close is set aside as it would be
        mid-run: marked failed in its report, not returned. A slow sink still writing at the
        deadline is neither closed nor waited for: it is named in `not_stopped` and its report.
        """
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        with self._cond:
            if self._closed:
                return []
            self._closed = True
            # a dispatch under way finishes first (a blocked hand-over sees `_closed`)
            while self._active and time.monotonic() < deadline:
                self._cond.wait(timeout=_POLL_S)
        for e in self._entries:
            if e.queue is not None and e.thread is not None:
                self._finish(e, deadline)
        errors: list[BaseException] = []
        stuck = []
        for e in self._entries:
            if e.thread is not None and e.thread.is_alive():
                stuck.append(e.thread.name)
                e.failed = e.failed or f"still writing {CLOSE_TIMEOUT_S:.0f} s after the run"
                continue
            try:
                e.sink.close()
            except Exception as exc:  # one sink failing to close must not lose the others
                if e.policy.on_failure is OnFailure.ISOLATE:  # its policy holds to the end
                    e.failed = e.failed or one_line(f"{type(exc).__name__}: {exc}")
                    log.error("output %s failed to close and is set aside: %s", e.name, exc)
                    continue
                log.error("closing %s failed: %s", e.name, exc)
                errors.append(exc)
        self.not_stopped = tuple(stuck)
        return errors

    def _finish(self, e: _Entry, deadline: float) -> None:
        """Queue the end marker after the backlog and wait for the sink's thread; at the
        deadline, what is still queued is dropped (and counted)."""
        assert e.queue is not None and e.thread is not None
        while e.thread.is_alive():
            try:
                e.queue.put(None, timeout=_POLL_S)
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    self._discard(e)
        e.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if e.thread.is_alive():
            log.error("output %s did not finish its backlog in %.0f s", e.name, CLOSE_TIMEOUT_S)
            self._discard(e)
            if not e.queue.full():
                e.queue.put_nowait(None)  # it ends after the write it is stuck in

    def _discard(self, e: _Entry) -> None:
        assert e.queue is not None
        while True:
            try:
                batch = e.queue.get_nowait()
            except queue.Empty:
                return
            e.dropped += len(batch) if batch is not None else 0

    def report(self) -> dict[str, SinkReport]:
        return {
            e.name: SinkReport(
                name=e.name,
                slow=e.policy.slow,
                on_failure=e.policy.on_failure.value,
                frames_written=e.written,
                frames_dropped=e.dropped,
                queue_high_water=e.high_water,
                failed=e.failed,
            )
            for e in self._entries
        }
