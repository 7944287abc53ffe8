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

The set owns the lock and the closed flag: a result dispatched after `close()` began is not
written and not counted (`dispatch` says so), so counts always match the files.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    queue_batches: int = 16  # a slow sink's queue, in batches
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
        self._lock = threading.Lock()
        self._closed = False
        self._started = False

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

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(e.thread for e in self._entries if e.thread is not None)

    def start(self) -> None:
        """Start the slow sinks' threads (idempotent)."""
        if self._started:
            return
        self._started = True
        for e in self._entries:
            if e.policy.slow:
                e.queue = queue.Queue(maxsize=e.policy.queue_batches)
                e.thread = threading.Thread(
                    target=self._drain, args=(e,), name=f"sink-{e.name}", daemon=True
                )
                e.thread.start()

    # ------------------------------------------------------------------ writing

    def _write(self, e: _Entry, results: Sequence[FrameResult]) -> None:
        if e.failed is not None:
            return
        try:
            for r in results:
                if r.original_bgr is not None and isinstance(e.sink, ImageSink):
                    e.sink.write_with_image(r, r.original_bgr)
                else:
                    e.sink.write(r)
                e.written += 1
        except Exception as exc:
            e.failed = one_line(f"{type(exc).__name__}: {exc}")
            if e.policy.on_failure is OnFailure.STOP:
                log.error("output %s failed, stopping the run: %s", e.name, e.failed)
                if self.on_stop is not None:
                    self.on_stop(exc)
            else:
                log.error(
                    "output %s failed and is set aside; the run goes on: %s", e.name, e.failed
                )

    def dispatch(self, results: list[FrameResult]) -> bool:
        """Hand one batch's results to every sink. False (nothing written) once closing."""
        with self._lock:
            if self._closed:
                return False
            for e in self._entries:
                if e.queue is None:
                    self._write(e, results)
                elif e.failed is None:
                    self._enqueue(e, results)
        return True

    def _enqueue(self, e: _Entry, results: list[FrameResult]) -> None:
        assert e.queue is not None
        while True:
            try:
                e.queue.put_nowait(results)
                break
            except queue.Full:
                if e.policy.when_full is DropPolicy.BLOCK:
                    # replay: the completion thread waits for the sink, so no frame is lost
                    try:
                        e.queue.put(results, timeout=_POLL_S)
                        break
                    except queue.Full:
                        if e.thread is None or not e.thread.is_alive():
                            return
                        continue
                try:
                    oldest = e.queue.get_nowait()
                except queue.Empty:
                    continue
                e.dropped += len(oldest) if oldest is not None else 0
        e.high_water = max(e.high_water, e.queue.qsize())

    def _drain(self, e: _Entry) -> None:
        assert e.queue is not None
        while True:
            results = e.queue.get()
            if results is None:
                return
            self._write(e, results)

    # ------------------------------------------------------------------ closing

    def close(self) -> list[BaseException]:
        """Stop taking results, let slow sinks write what is queued, close every sink.

        Returns the errors of sinks that failed to close (each logged); never raises.
        """
        with self._lock:
            if self._closed:
                return []
            self._closed = True
        for e in self._entries:
            if e.queue is not None and e.thread is not None:
                # the sentinel goes after the backlog: what was queued is written
                while e.thread.is_alive():
                    try:
                        e.queue.put(None, timeout=_POLL_S)
                        break
                    except queue.Full:
                        continue
                e.thread.join(timeout=CLOSE_TIMEOUT_S)
                if e.thread.is_alive():
                    log.error(
                        "output %s did not finish its backlog in %.0f s", e.name, CLOSE_TIMEOUT_S
                    )
        errors: list[BaseException] = []
        for e in self._entries:
            try:
                e.sink.close()
            except Exception as exc:  # one sink failing to close must not lose the others
                log.error("closing %s failed: %s", e.name, exc)
                errors.append(exc)
        return errors

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
